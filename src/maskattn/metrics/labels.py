"""Metrics of predicted labels: accuracy, and BIO chunk F1 for tagging (exact span match, CoNLL style);
translation's BLEU and chrF come from sacreBLEU (:func:`maskattn.metrics.corpus_scores`)."""

from __future__ import annotations

from collections.abc import Sequence
from ..errors import ArgumentError

__all__ = ["accuracy", "bio_spans", "span_f1"]


def accuracy(predictions: Sequence[int], targets: Sequence[int]) -> float:
    """The share of ``predictions`` equal to their ``targets`` (line-aligned class ids), in [0, 1]."""
    if len(predictions) != len(targets):
        raise ArgumentError(f"{len(predictions)} predictions for {len(targets)} targets")
    return sum(int(p == t) for p, t in zip(predictions, targets)) / max(1, len(targets))


def bio_spans(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """(start, end exclusive, type) chunks of a BIO sequence; an ``I-X`` without a preceding ``B-X`` /
    ``I-X`` starts a new chunk (conlleval's convention)."""
    spans: set[tuple[int, int, str]] = set()
    start: int | None = None
    kind = ""
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, label = tag.partition("-")
        continues = prefix == "I" and kind == label and start is not None
        if start is not None and not continues:
            spans.add((start, i, kind))
            start, kind = None, ""
        if prefix == "B" or (prefix == "I" and not continues):
            start, kind = i, label
    return spans


def span_f1(predicted: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]) -> float:
    """Micro-averaged chunk F1 over sentences."""
    tp = n_pred = n_gold = 0
    for p, g in zip(predicted, gold):
        ps, gs = bio_spans(p), bio_spans(g)
        tp += len(ps & gs)
        n_pred += len(ps)
        n_gold += len(gs)
    if tp == 0:
        return 0.0
    precision, recall = tp / n_pred, tp / n_gold
    return 2 * precision * recall / (precision + recall)
