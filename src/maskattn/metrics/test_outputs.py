"""The per-item outputs a model was scored on, kept beside its score so that two models can be compared item by
item (the paired bootstrap of ``maskattn grid compare``, :mod:`maskattn.grid.compare`):

* a seq2seq model's test hypotheses, ``test.hyp.txt``: one per line, in test order, a hypothesis's own line
  breaks (a summary's sentences) joined by spaces;
* a classifier's test predictions, ``test.pred.jsonl``: one JSON object per item, in test order,
  ``{"prediction": ..., "label": ...}`` — the predicted and the gold label's names (a tagger's: lists of tags), so
  that the file alone rescores the run and tells whether two runs were tested on the same items.

The trainer writes them when it tests a run; ``maskattn eval --predictions FILE`` writes them for a checkpoint
(for runs trained before runs kept them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, Union

from ..data.text import iter_lines, read_lines
from ..errors import DataError

__all__ = ["HYPOTHESES", "PREDICTIONS", "Prediction", "hypotheses_bytes", "predictions_bytes", "read_hypotheses",
           "read_predictions"]

#: a seq2seq run's test hypotheses (one per line, in test order)
HYPOTHESES = "test.hyp.txt"
#: a classifier run's test predictions with their gold labels (JSON lines, in test order)
PREDICTIONS = "test.pred.jsonl"

Label = Union[str, list[str]]


class Prediction(NamedTuple):
    """One test item of a classifier: the predicted label and the gold one (a tagger's: one tag per token)."""

    prediction: Label
    label: Label


def hypotheses_bytes(hypotheses: Sequence[str]) -> bytes:
    """``test.hyp.txt``'s content: one hypothesis per line, its own line breaks joined by spaces."""
    return "".join(" ".join(h.splitlines()) + "\n" for h in hypotheses).encode("utf-8")


def predictions_bytes(predictions: Sequence[Prediction]) -> bytes:
    """``test.pred.jsonl``'s content: one ``{"prediction", "label"}`` object per item."""
    return "".join(json.dumps(p._asdict(), ensure_ascii=False) + "\n" for p in predictions).encode("utf-8")


def read_hypotheses(path: str | Path, count: int) -> list[str]:
    """The hypotheses of ``test.hyp.txt``; :class:`DataError` unless it holds ``count`` (the test references).
    Read with the bounded line reader (:func:`~maskattn.data.text.iter_lines`): a line past its limit, or not
    UTF-8, is a :class:`DataError` naming ``file:line``."""
    lines = read_lines(path)
    if len(lines) != count:
        raise DataError(f"{path} holds {len(lines)} hypotheses for {count} test references")
    return lines


def _label(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def read_predictions(path: str | Path) -> list[Prediction]:
    """The items of ``test.pred.jsonl``; a line that is not a ``{"prediction", "label"}`` object of label names
    (or of equally long lists of tags) raises :class:`DataError` naming it, as does a line past the bounded line
    reader's limit or not UTF-8 (:func:`~maskattn.data.text.iter_lines`)."""
    out = []
    for number, line in iter_lines(path):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not (isinstance(item, dict) and set(item) == {"prediction", "label"} and _label(item["prediction"])
                and type(item["prediction"]) is type(item["label"]) and _label(item["label"])
                and (isinstance(item["label"], str) or len(item["label"]) == len(item["prediction"]))):
            raise DataError(f"{path}:{number}: expected {{\"prediction\": LABEL, \"label\": LABEL}} (label names, "
                            f"or equally long lists of tags), got {line.strip()[:120]!r}")
        out.append(Prediction(item["prediction"], item["label"]))
    if not out:
        raise DataError(f"{path} holds no predictions")
    return out
