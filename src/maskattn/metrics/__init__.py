"""How a model is scored — the loss it trains on and the metrics ``train.metric`` chooses from — in one place for
the trainer (:mod:`maskattn.train`) and the checkpoint commands (:mod:`maskattn.inference`), both of which
import it.

* :func:`summed_loss`: summed (label-smoothed) cross-entropy of classifiers, taggers and Seq2Seq targets.
* :func:`evaluate`: mean loss and accuracy (taggers: token accuracy and BIO chunk F1) of a classifier on
  encoded items; :func:`predict_ids`: its predicted class ids, in the items' order.
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

from .classification import evaluate, input_limit, item_length, predict_ids, pretrained_input_limit, summed_loss
from .labels import accuracy, bio_spans, span_f1
from .summarization import ROUGE_TYPES, check_references, lead, rouge_scores
from .translation import corpus_scores

__all__ = ["summed_loss", "evaluate", "predict_ids", "input_limit", "item_length", "pretrained_input_limit",
           "accuracy", "bio_spans", "span_f1", "corpus_scores", "rouge_scores", "check_references", "lead",
           "ROUGE_TYPES", "SEQ2SEQ_SCORES"]

#: how the outputs of a seq2seq model are scored, by its ``data.format``: the scoring function
#: ``(hypotheses, references) -> dict`` and the metrics of its result that ``train.metric`` may select
SEQ2SEQ_SCORES = {"parallel": (corpus_scores, ("bleu", "chrf")),
                  "summarization": (rouge_scores, ("rouge", *ROUGE_TYPES))}
