"""Using a trained checkpoint: load it, predict labels, evaluate it on files, translate, and the decoding
searches behind translation.

* :func:`load_model` → :class:`LoadedModel`: a classifier (sentence, pair, tagger) rebuilt from a checkpoint;
  :func:`predict`: labels for raw text, one output per input (blank in, blank out); :func:`evaluate_file`:
  metrics on a labelled file.
* :func:`load_translator` → :class:`Translator`: subword model + Seq2Seq (translation or summarization),
  ``translate(lines)`` with one output line per input line; :func:`evaluate_translation`: sacreBLEU BLEU and chrF
  (translation) or ROUGE (summarization) of a source file against a reference file.
* :func:`greedy_decode`, :func:`beam_search` (:class:`Hypothesis`, :func:`length_penalty_factor`): incremental
  decoding of a Seq2Seq, with length limits, length penalties and n-gram blocking; :class:`DecodingOptions`:
  one choice of them.
* Shared with training: :func:`resolve_device`. The loss, evaluation, input limits and metrics that both use
  (:func:`~maskattn.metrics.evaluate`, :func:`~maskattn.metrics.corpus_scores`, …) are :mod:`maskattn.metrics`.

Inputs longer than a model reads are truncated and reported through ``on_truncate`` (docs/reliability.md).
This package reads checkpoints through :mod:`maskattn.checkpoint` and never imports :mod:`maskattn.train`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Each name is imported when it is first used (PEP 562): `import maskattn.inference.decoding` — what a training
# configuration needs — no longer loads the metrics (sacreBLEU, rouge-score with NLTK, scikit-learn, SciPy), which
# made every `maskattn` command start seconds later.
_EXPORTS = {
    "DecodingOptions": ".decoding", "Hypothesis": ".decoding", "beam_search": ".decoding",
    "greedy_decode": ".decoding", "length_penalty_factor": ".decoding",
    "resolve_device": "..device",
    "evaluate_file": ".evaluation", "evaluate_translation": ".evaluation",
    "LoadedModel": ".loading", "ModelSettings": ".loading", "check_tokenizer": ".loading", "fixed_rows_of": ".loading",
    "load_model": ".loading", "load_translator": ".loading", "subword_from_checkpoint": ".loading",
    "predict": ".prediction", "Translator": ".translator",
}

if TYPE_CHECKING:
    from ..device import resolve_device
    from .decoding import DecodingOptions, Hypothesis, beam_search, greedy_decode, length_penalty_factor
    from .evaluation import evaluate_file, evaluate_translation
    from .loading import (LoadedModel, ModelSettings, check_tokenizer, fixed_rows_of, load_model, load_translator,
                          subword_from_checkpoint)
    from .prediction import predict
    from .translator import Translator

__all__ = [
    "load_model", "LoadedModel", "ModelSettings", "predict", "evaluate_file",
    "load_translator", "Translator", "evaluate_translation", "subword_from_checkpoint", "fixed_rows_of",
    "greedy_decode", "beam_search", "Hypothesis", "length_penalty_factor", "DecodingOptions",
    "check_tokenizer", "resolve_device",
]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
