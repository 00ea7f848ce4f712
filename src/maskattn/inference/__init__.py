"""Using a trained checkpoint: load it, predict labels, evaluate it on files, translate, and the decoding
searches behind translation.

* :func:`load_model` → :class:`LoadedModel`: a classifier (sentence, pair, tagger) rebuilt from a checkpoint;
  :func:`predict`: labels for raw text, one output per input (blank in, blank out); :func:`evaluate_file`:
  metrics on a labelled file.
* :func:`load_translator` → :class:`Translator`: subword model + Seq2Seq, ``translate(lines)`` with one output
  line per input line; :func:`evaluate_translation` / :func:`corpus_scores`: sacreBLEU BLEU and chrF.
* :func:`greedy_decode`, :func:`beam_search` (:class:`Hypothesis`, :func:`length_penalty_factor`): incremental
  decoding of a Seq2Seq.
* Shared with training: :func:`summed_loss`, :func:`evaluate`, :func:`predict_ids`, :func:`input_limit`, the
  metrics, :func:`resolve_device`.

Inputs longer than a model reads are truncated and reported through ``on_truncate`` (docs/reliability.md).
This package reads checkpoints through :mod:`maskattn.checkpoint` and never imports :mod:`maskattn.train`.
"""

from .classification import evaluate, input_limit, predict_ids, pretrained_input_limit, summed_loss
from .decoding import Hypothesis, beam_search, greedy_decode, length_penalty_factor
from .device import resolve_device
from .evaluation import evaluate_file, evaluate_translation
from .loading import LoadedModel, ModelSettings, check_tokenizer, load_model, load_translator, subword_from_checkpoint
from .metrics import accuracy, bio_spans, span_f1
from .prediction import predict
from .scoring import corpus_scores
from .translator import Translator

__all__ = [
    "load_model", "LoadedModel", "ModelSettings", "predict", "evaluate_file",
    "load_translator", "Translator", "evaluate_translation", "corpus_scores", "subword_from_checkpoint",
    "greedy_decode", "beam_search", "Hypothesis", "length_penalty_factor",
    "evaluate", "predict_ids", "summed_loss", "input_limit", "pretrained_input_limit", "check_tokenizer", "resolve_device", "accuracy", "bio_spans", "span_f1",
]
