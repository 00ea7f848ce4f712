"""How the outputs of a seq2seq model are scored, by its ``data.format`` (:data:`SEQ2SEQ_SCORES`)."""

from __future__ import annotations

from .summarization import ROUGE_TYPES, rouge_scores
from .translation import corpus_scores

__all__ = ["SEQ2SEQ_SCORES"]

#: the scoring function ``(hypotheses, references) -> dict`` of a seq2seq model's outputs, by its ``data.format``,
#: and the metrics of its result that ``train.metric`` may select
SEQ2SEQ_SCORES = {"parallel": (corpus_scores, ("bleu", "chrf")),
                  "summarization": (rouge_scores, ("rouge", *ROUGE_TYPES))}
