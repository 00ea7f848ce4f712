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

from .decoding import DecodingOptions, Hypothesis, beam_search, greedy_decode, length_penalty_factor
from ..device import resolve_device
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
