"""How a model is scored — the loss it trains on and the metrics ``train.metric`` chooses from — in one place for
the trainer (:mod:`maskattn.train`) and the checkpoint commands (:mod:`maskattn.inference`), both of which
import it.

* :func:`summed_loss`: summed (label-smoothed) cross-entropy of classifiers, taggers and Seq2Seq targets.
* :func:`evaluate`: mean loss and accuracy (taggers: token accuracy and BIO chunk F1) of a classifier on
  encoded items (:func:`scored_predictions`: also each item's predicted and gold label); :func:`predict_ids`:
  its predicted class ids, in the items' order.
* :mod:`~maskattn.metrics.test_outputs`: the per-item outputs a run was scored on (``test.hyp.txt``,
  ``test.pred.jsonl``), kept for paired tests.
* :func:`input_limit` / :func:`pretrained_input_limit`: the longest input a classifier reads (longer inputs
  are truncated to it in training, evaluation and prediction alike); :func:`item_length`: an encoded item's
  longest sequence. Evaluation batches are cut to fit the memory budget (:func:`maskattn.device.check_memory`).
* :func:`accuracy`, :func:`bio_spans`, :func:`span_f1`: metrics of predicted labels.
* :func:`corpus_scores`: sacreBLEU corpus BLEU and chrF of translations, with their signatures;
  :func:`rouge_scores`: ROUGE-1/2/L F1 of summaries with bootstrap intervals (``rouge-score``), and the LEAD-k
  baseline (:func:`lead`). :data:`SEQ2SEQ_SCORES`: which of the two scores a seq2seq run, by its ``data.format``.

Scoring a checkpoint on files (loading it, reading the files) is :mod:`maskattn.inference`
(:func:`~maskattn.inference.evaluate_file`, :func:`~maskattn.inference.evaluate_translation`).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ..lazy import lazy_exports

if _TYPE_CHECKING:  # what static tools see; at run time the names are imported on first use (maskattn/lazy.py)
    from .classification import (evaluate, input_limit, item_length, predict_ids, pretrained_input_limit,
                                 scored_predictions, summed_loss)
    from .labels import accuracy, bio_spans, span_f1
    from .scores import SEQ2SEQ_SCORES
    from .summarization import ROUGE_TYPES, check_references, lead, rouge_scores
    from .translation import corpus_scores

__all__ = ["summed_loss", "evaluate", "scored_predictions", "predict_ids", "input_limit", "item_length",
           "pretrained_input_limit", "accuracy", "bio_spans", "span_f1", "corpus_scores", "rouge_scores",
           "check_references", "lead", "ROUGE_TYPES", "SEQ2SEQ_SCORES"]

__getattr__, __dir__ = lazy_exports(__name__, {
    ".classification": ("summed_loss", "evaluate", "scored_predictions", "predict_ids", "input_limit", "item_length",
                        "pretrained_input_limit"),
    ".labels": ("accuracy", "bio_spans", "span_f1"), ".scores": ("SEQ2SEQ_SCORES",),
    ".summarization": ("ROUGE_TYPES", "check_references", "lead", "rouge_scores"), ".translation": ("corpus_scores",),
})
