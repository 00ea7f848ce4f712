"""Scoring summaries: ROUGE-1, ROUGE-2 and ROUGE-L F1 with Google's ``rouge-score`` (the implementation behind
Hugging Face ``evaluate``), and the LEAD-k baseline.

* Tokenisation: ``rouge-score``'s default, which reimplements ROUGE-1.5.5's — lower-case, every character other
  than ``a–z`` and ``0–9`` becomes a space — so ``UNK`` and ``<unk>`` are both the token ``unk``, ``tie-up`` is
  ``tie up`` and Gigaword's digit masks (``#.##``) vanish. No stemming: MAN's scores come from files2rouge, which
  runs ROUGE-1.5.5 with ``-c 95 -r 1000 -n 2 -a`` (no ``-m``).
* Score: the F1 of every (hypothesis, reference) pair, averaged over the pairs, × 100 (ROUGE-1.5.5's ``-a``
  average of one reference per item); the 95 % interval is a percentile bootstrap over pairs (``bootstrap``
  resamples, a fixed ``seed``: the same interval on every call), as ROUGE-1.5.5's ``-c 95 -r 1000``.
* ROUGE-Lsum (summary-level LCS over sentences, ROUGE-1.5.5's own ROUGE-L) is reported as well when a reference
  has several sentences; sentences end at a `` . `` token, the split files2rouge makes. For one-sentence
  summaries (Gigaword headlines) it equals ROUGE-L and is left out.

Bad input: different numbers of hypotheses and references, or none, raise :class:`~maskattn.errors.ArgumentError`;
an empty (or whitespace-only) reference raises :class:`~maskattn.errors.DataError` naming its lines. An empty
hypothesis scores 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib.metadata import version

import numpy as np

from ..errors import ArgumentError, DataError

__all__ = ["ROUGE_TYPES", "rouge_scores", "check_references", "lead", "sentences"]

#: the ROUGE variants reported (rouge-score's names); ``rouge`` is their mean
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")

_SENTENCE_END = re.compile(r"(?<=\s\.)\s+")  # after a " ." token: files2rouge's sentence split


def sentences(summary: str) -> list[str]:
    """The sentences of a tokenised summary: split after every ``.`` token (files2rouge's ``--eos .``)."""
    return [part for part in _SENTENCE_END.split(summary.strip()) if part]


def check_references(references: Sequence[str], name: str = "the references") -> None:
    """Refuse (:class:`DataError`) a reference set with empty summaries, naming their 1-based lines."""
    empty = [number for number, line in enumerate(references, start=1) if not line.strip()]
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (", …" if len(empty) > 10 else "")
        raise DataError(f"{name}: {len(empty)} empty reference summar{'y' if len(empty) == 1 else 'ies'} (line(s) "
                        f"{shown}); ROUGE needs a reference for every line — remove those pairs")


def rouge_scores(hypotheses: Sequence[str], references: Sequence[str], *, bootstrap: int = 1000, seed: int = 0,
                 name: str = "the references") -> dict:
    """ROUGE-1/2/L F1 (× 100) of ``hypotheses`` against one reference each (module docstring): ``rouge1``,
    ``rouge2``, ``rougeL``, their mean ``rouge``, each with its 95 % bootstrap interval ``<type>_low`` /
    ``<type>_high`` (``bootstrap`` resamples; 0 = none), ``rougeLsum`` likewise for multi-sentence references,
    ``sentences`` (the number of pairs) and ``rouge_signature`` (what was computed, to quote with the numbers).
    ``name`` names the references in the message about empty ones."""
    if len(hypotheses) != len(references):
        raise ArgumentError(f"{len(hypotheses)} hypotheses for {len(references)} references; they must be line-aligned")
    if not references:
        raise ArgumentError("no summaries to score: ROUGE needs at least one hypothesis and reference")
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise ArgumentError(f"bootstrap must be an int >= 0 (resamples; 0 = no interval), got {bootstrap!r}")
    check_references(references, name)
    multi = any(len(sentences(reference)) > 1 for reference in references)
    types = ROUGE_TYPES + (("rougeLsum",) if multi else ())
    from rouge_score import rouge_scorer  # NLTK, scikit-learn and SciPy: loaded when ROUGE is computed

    scorer = rouge_scorer.RougeScorer(list(types), use_stemmer=False)
    f1 = {t: np.empty(len(references)) for t in types}  # per-pair F1
    for i, (hypothesis, reference) in enumerate(zip(hypotheses, references)):
        if multi:  # rouge-score's rougeLsum reads sentences as lines
            hypothesis, reference = "\n".join(sentences(hypothesis)), "\n".join(sentences(reference))
        for t, score in scorer.score(reference, hypothesis).items():
            f1[t][i] = score.fmeasure
    per_pair = {**f1, "rouge": np.mean([f1[t] for t in ROUGE_TYPES], axis=0)}  # (n,) each
    result: dict = {}
    resamples = np.random.default_rng(seed).integers(0, len(references), (bootstrap, len(references))) \
        if bootstrap else None
    for t, values in per_pair.items():
        result[t] = 100 * float(values.mean())
        if resamples is not None:
            means = values[resamples].mean(axis=1)  # (bootstrap,)
            low, high = np.percentile(means, [2.5, 97.5])
            result[f"{t}_low"], result[f"{t}_high"] = 100 * float(low), 100 * float(high)
    result["sentences"] = len(references)
    result["rouge_signature"] = (f"rouge-score {version('rouge-score')}|F1|mean of {len(references)} pairs|"
                                 f"tok:lowercase,[^a-z0-9]->space|stem:no|"
                                 + (f"bootstrap:{bootstrap},95%,seed:{seed}" if bootstrap else "bootstrap:none")
                                 + ("|Lsum:split at ' . '" if multi else ""))
    return result


def lead(sources: Sequence[str], k: int) -> list[str]:
    """The LEAD-k baseline: the first ``k`` whitespace-separated words of every source."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ArgumentError(f"k must be an int >= 1 (words), got {k!r}")
    return [" ".join(source.split()[:k]) for source in sources]
