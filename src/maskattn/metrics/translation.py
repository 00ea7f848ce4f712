"""Scoring translations: sacreBLEU's corpus BLEU and chrF (default settings: 13a tokenisation, mixed case,
exponential smoothing) with their signatures."""

from __future__ import annotations

from collections.abc import Sequence

import sacrebleu
from ..errors import ArgumentError

__all__ = ["corpus_scores"]


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """sacreBLEU corpus BLEU and chrF of ``hypotheses`` against one reference each, with signatures.
    ``ValueError`` when the two differ in length or are empty (there is nothing to score)."""
    if len(hypotheses) != len(references):
        raise ArgumentError(f"{len(hypotheses)} hypotheses for {len(references)} references; they must be line-aligned")
    if not references:
        raise ArgumentError("no sentences to score: BLEU and chrF need at least one hypothesis and reference")
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return {"bleu": b.score, "chrf": c.score, "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()), "bleu_detail": str(b), "sentences": len(hypotheses)}
