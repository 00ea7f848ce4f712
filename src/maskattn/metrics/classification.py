"""Classifiers and taggers over encoded items: the loss, evaluation and prediction (shared by the trainer,
:mod:`maskattn.train`, and the checkpoint commands, :mod:`maskattn.inference`), and the longest input a
classifier reads."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data.batching import IGNORE_INDEX, Batch, BucketBatchSampler, collate
from ..data.config import DataConfig
from ..data.vocab import LabelSet
from ..errors import ArgumentError, ConfigError
from ..device import check_memory, memory_budget
from ..models.config import ModelConfig
from ..models.memory import model_memory_bytes
from .labels import accuracy, span_f1
from .test_outputs import Prediction

__all__ = ["summed_loss", "evaluate", "scored_predictions", "predict_ids", "input_limit", "item_length", "pretrained_input_limit"]


def input_limit(data: DataConfig, model: ModelConfig) -> int:
    """The most tokens a classifier of these settings reads from one sentence: ``data.max_len`` when it is set,
    else ``model.max_len`` (512 by default) — every model has a limit, with or without positional encodings, so
    one long line cannot make attention's n × n scores exhaust memory; with positional encodings never more than
    ``model.max_len`` (the rows of the positional table). Longer inputs are truncated to it, with a warning that
    counts them — in training, evaluation and prediction alike. A limit raised by hand is checked against the
    memory budget before a batch is built (:func:`maskattn.device.check_memory`)."""
    limit = data.max_len or model.max_len
    if model.positional != "none":
        limit = min(limit, model.max_len)
    return limit


def pretrained_input_limit(data: DataConfig, max_tokens: int) -> int:
    """The most tokens (of its own tokenizer, special tokens included) a classifier on a pretrained encoder reads
    from one input: ``data.max_len``, or by default all that the encoder reads (``max_tokens``, its position
    table); a ``data.max_len`` beyond that is an error."""
    if data.max_len is None:
        return max_tokens
    if data.max_len > max_tokens:
        raise ConfigError(f"data.max_len {data.max_len} exceeds the {max_tokens} tokens the pretrained encoder "
                          f"reads (model.pretrained); expected data.max_len <= {max_tokens}")
    return data.max_len


def summed_loss(logits: torch.Tensor, labels: torch.Tensor, *, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy summed over examples (``(B, C)`` logits) or tokens (``(B, n, C)``), skipping targets equal
    to ``IGNORE_INDEX`` (padding). With ``label_smoothing`` ε the target distribution is ``(1 − ε)`` on the
    label plus ``ε / C`` on every class (Szegedy et al. 2016), i.e. per term
    ``(1 − ε) · (−log p_y) + ε · mean_c(−log p_c)``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum", label_smoothing=label_smoothing)


def item_length(item: dict) -> int:
    """The longest sequence of an encoded item (its tokens, or the longer side of a pair)."""
    return max(len(item[key]) for key in ("tokens", "premise", "hypothesis") if key in item)


def _fit_memory(model: nn.Module, items: list[dict], indices: list[int], budget: int | None,
                device: torch.device | str) -> Iterator[list[int]]:
    """``indices`` as one batch, or split into smaller ones when its estimated memory
    (:func:`~maskattn.models.memory.model_memory_bytes`) exceeds ``budget``; a single item over the budget is
    refused with :class:`~maskattn.errors.MemoryLimitError` before anything is built."""
    length = max(item_length(items[i]) for i in indices)
    if budget is None or model_memory_bytes(model, len(indices), length) <= budget:
        yield indices
        return
    one = model_memory_bytes(model, 1, length)
    check_memory(one, what=f"one input of {length} tokens", device=device,
                 advice="shorten it (or train a model with a smaller data.max_len)")
    size = max(1, budget // one)
    for start in range(0, len(indices), size):
        yield indices[start:start + size]


def _batches(model: nn.Module, items: list[dict], batch_size: int,
             device: torch.device | str) -> Iterator[tuple[list[int], Batch]]:
    """Length-sorted evaluation batches, with the item indices of each; a batch whose estimated memory exceeds
    the budget (:func:`maskattn.device.memory_budget`) is cut into smaller ones before it is built."""
    budget = memory_budget(device)
    for indices in BucketBatchSampler(items, batch_size, shuffle=False).batches():
        for part in _fit_memory(model, items, indices, budget, device):
            yield part, collate([items[i] for i in part])


def _predicted(pred: torch.Tensor, batch: Batch, row: int):
    """The prediction of one row of a batch: a class id, or the tags of its tokens (a tagger)."""
    if pred.dim() == 1:
        return int(pred[row])
    n = int((~batch.inputs["padding_mask"][row]).sum())
    return pred[row, :n].tolist()


@torch.no_grad()
def predict_ids(model: nn.Module, items: list[dict], *, batch_size: int = 256,
                device: torch.device | str = "cpu") -> list:
    """Predicted class ids (one per item, or one list per item for taggers), in the items' order."""
    model.eval()
    out: list = [None] * len(items)
    for indices, batch in _batches(model, items, batch_size, device):
        batch = batch.to(device)
        pred = model(**batch.inputs).argmax(-1).cpu()
        for row, i in enumerate(indices):
            out[i] = _predicted(pred, batch, row)
    return out


def evaluate(model: nn.Module, items: list[dict], labels: LabelSet, *, batch_size: int = 256,
             device: torch.device | str = "cpu") -> dict[str, float]:
    """Mean loss and accuracy (token accuracy and BIO chunk F1 for taggers) over labelled items, from one pass
    of the model over them."""
    return scored_predictions(model, items, labels, batch_size=batch_size, device=device)[0]


@torch.no_grad()
def scored_predictions(model: nn.Module, items: list[dict], labels: LabelSet, *, batch_size: int = 256,
                       device: torch.device | str = "cpu") -> tuple[dict[str, float], list[Prediction]]:
    """:func:`evaluate`'s metrics and, from the same pass, what they were computed from: per item, in the items'
    order, the predicted label and the gold one (names; a tagger's are lists of tags) — the per-item record
    of paired tests (:mod:`maskattn.metrics.test_outputs`)."""
    if not items:
        raise ArgumentError("cannot evaluate on an empty split")
    model.eval()
    total, count = 0.0, 0
    predictions: list = [None] * len(items)
    for indices, batch in _batches(model, items, batch_size, device):
        batch = batch.to(device)
        logits = model(**batch.inputs)
        total += float(summed_loss(logits, batch.targets))
        count += batch.count
        pred = logits.argmax(-1).cpu()
        for row, i in enumerate(indices):
            predictions[i] = _predicted(pred, batch, row)
    result = {"loss": total / count}
    if isinstance(items[0]["label"], list):
        flat_p = [p for seq in predictions for p in seq]
        flat_g = [g for it in items for g in it["label"]]
        result["accuracy"] = accuracy(flat_p, flat_g)
        named = [Prediction(labels.decode(p), labels.decode(it["label"])) for p, it in zip(predictions, items)]
        result["f1"] = span_f1([p.prediction for p in named], [p.label for p in named])
    else:
        result["accuracy"] = accuracy(predictions, [it["label"] for it in items])
        named = [Prediction(labels.itos[p], labels.itos[it["label"]]) for p, it in zip(predictions, items)]
    return result, named
