"""Encoding examples to ids, length-bucketed batches and padding.

Batches hold ``tokens`` ``(B, n)`` ids and ``padding_mask`` ``(B, n)`` bool with ``True`` = padding (the
PyTorch ``key_padding_mask`` convention); items encoded by a pretrained tokenizer as a sentence pair also
carry ``token_types`` ``(B, n)`` (segment ids, padded with 0). The order of batches is a pure function of ``(seed, epoch)``,
so an interrupted run resumes on exactly the batches it would have seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import ArgumentError
from .examples import Example, PairExample, TaggedExample, TextExample
from .vocab import LabelSet, Vocabulary

__all__ = ["Batch", "encode_examples", "collate", "BucketBatchSampler", "epoch_generator", "IGNORE_INDEX"]

IGNORE_INDEX = -100  # tag targets at padded positions (F.cross_entropy's default ignore_index)


@dataclass
class Batch:
    """Model inputs (keyword arguments of the model's ``forward``), targets, and the number of loss terms
    (examples, or tokens for tagging)."""

    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor | None
    count: int

    @property
    def targets(self) -> torch.Tensor:
        """The label ids (``(B,)``, or ``(B, n)`` tags), for a loss; a batch encoded without a label set has none."""
        if self.labels is None:
            raise ArgumentError("this batch has no labels (its examples were encoded without a label set)")
        return self.labels

    def to(self, device) -> Batch:
        labels = None if self.labels is None else self.labels.to(device, non_blocking=True)
        return Batch({k: v.to(device, non_blocking=True) for k, v in self.inputs.items()}, labels, self.count)

    def __len__(self) -> int:
        return next(iter(self.inputs.values())).shape[0]


def encode_examples(examples: Sequence[Example], vocab: Vocabulary, labels: LabelSet | None,
                    *, max_len: int | None = None) -> list[dict]:
    """Examples → dicts of id lists (truncated to ``max_len`` tokens); ``labels=None`` for unlabelled text."""
    cut = (lambda ids: ids[:max_len]) if max_len else (lambda ids: ids)
    encoded = []
    for e in examples:
        if isinstance(e, PairExample):
            item = {"premise": cut(vocab.encode(e.premise)), "hypothesis": cut(vocab.encode(e.hypothesis))}
        else:
            item = {"tokens": cut(vocab.encode(e.tokens))}
        if labels is not None and isinstance(e, TaggedExample):
            item["label"] = cut([labels.encode(t) for t in e.tags])
        elif labels is not None and isinstance(e, (TextExample, PairExample)):
            item["label"] = labels.encode(e.label)
        encoded.append(item)
    return encoded


def _pad(sequences: list[list[int]], pad_value: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(1, max(len(s) for s in sequences))
    ids = torch.full((len(sequences), n), pad_value, dtype=torch.long)  # (B, n)
    for i, s in enumerate(sequences):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    lengths = torch.tensor([len(s) for s in sequences])
    return ids, torch.arange(n)[None, :] >= lengths[:, None]  # True = padding


def collate(items: Sequence[dict], pad_id: int = Vocabulary.pad_id) -> Batch:
    """Pad a list of encoded items into a :class:`Batch`."""
    if "premise" in items[0]:
        p, p_mask = _pad([it["premise"] for it in items], pad_id)
        h, h_mask = _pad([it["hypothesis"] for it in items], pad_id)
        inputs = {"premise": p, "premise_mask": p_mask, "hypothesis": h, "hypothesis_mask": h_mask}
    else:
        tokens, mask = _pad([it["tokens"] for it in items], pad_id)
        inputs = {"tokens": tokens, "padding_mask": mask}
        if "token_types" in items[0]:
            inputs["token_types"], _ = _pad([it["token_types"] for it in items], 0)
    if "label" not in items[0]:
        return Batch(inputs, None, len(items))
    if isinstance(items[0]["label"], list):  # per-token tags
        tags, _ = _pad([it["label"] for it in items], IGNORE_INDEX)
        return Batch(inputs, tags, int((tags != IGNORE_INDEX).sum()))
    return Batch(inputs, torch.tensor([it["label"] for it in items], dtype=torch.long), len(items))


def _length(item: dict) -> int:
    return max(len(item[k]) for k in ("tokens", "premise", "hypothesis") if k in item)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The data-order generator of ``epoch`` (re-derived from ``(seed, epoch)``, never carried between
    epochs, so a resumed run draws the same order)."""
    return torch.Generator().manual_seed(seed * 100_003 + epoch)


class BucketBatchSampler:
    """Length-bucketed batches of indices.

    With ``shuffle``: a seeded permutation of the data is cut into pools of ``batch_size × pool_factor``
    examples, each pool is sorted by length and cut into batches (little padding), and the batch order is
    shuffled. Without: batches of length-sorted examples (evaluation). ``batches(epoch)`` depends only on
    ``(seed, epoch)``.
    """

    def __init__(self, items: Sequence[dict], batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 pool_factor: int = 50, drop_last: bool = False):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ArgumentError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if not items:
            raise ArgumentError("cannot batch an empty dataset")
        self.lengths = [_length(it) for it in items]
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.pool_factor, self.drop_last = pool_factor, drop_last

    def __len__(self) -> int:
        n = len(self.lengths)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def generator(self, epoch: int) -> torch.Generator:
        return epoch_generator(self.seed, epoch)

    def batches(self, epoch: int = 0) -> list[list[int]]:
        n, size = len(self.lengths), self.batch_size
        if not self.shuffle:
            order = sorted(range(n), key=lambda i: (self.lengths[i], i))
            return [order[i:i + size] for i in range(0, n, size)]
        g = self.generator(epoch)
        order = torch.randperm(n, generator=g).tolist()
        pool = size * self.pool_factor
        batches = []
        for start in range(0, n, pool):
            chunk = sorted(order[start:start + pool], key=lambda i: self.lengths[i])
            batches += [chunk[i:i + size] for i in range(0, len(chunk), size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == size]
        return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
