"""Token and label vocabularies: frequency-ranked, with a minimum frequency, a padding and an unknown
token, serialisable to JSON (saved inside checkpoints)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import torch
from ..errors import ArgumentError

__all__ = ["Vocabulary", "LabelSet", "PAD", "UNK"]

PAD, UNK = "<pad>", "<unk>"


class Vocabulary:
    """Map tokens to ids: ``0`` is padding, ``1`` the unknown token, then tokens by decreasing frequency
    (ties alphabetically, so a vocabulary is a pure function of its corpus)."""

    def __init__(self, tokens: Sequence[str]):
        tokens = list(tokens)
        if tokens[:2] != [PAD, UNK]:
            raise ArgumentError(f"a vocabulary must start with {PAD!r}, {UNK!r}; got {tokens[:2]}")
        if len(set(tokens)) != len(tokens):
            raise ArgumentError("vocabulary tokens must be unique")
        self.itos = tokens
        self.stoi = {t: i for i, t in enumerate(tokens)}

    pad_id, unk_id = 0, 1

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], *, min_freq: int = 1, max_size: int | None = None) -> Vocabulary:
        """Tokens seen at least ``min_freq`` times, most frequent first, at most ``max_size`` of them."""
        if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
            raise ArgumentError(f"min_freq must be an int >= 1, got {min_freq!r}")
        counts = Counter(t for sentence in sentences for t in sentence)
        ranked = sorted((t for t, c in counts.items() if c >= min_freq and t not in (PAD, UNK)),
                        key=lambda t: (-counts[t], t))
        return cls([PAD, UNK] + ranked[:max_size])

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    def encode(self, tokens: Sequence[str]) -> list[int]:
        return [self.stoi.get(t, self.unk_id) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]

    def to_list(self) -> list[str]:
        return list(self.itos)

    @classmethod
    def from_list(cls, tokens: Sequence[str]) -> Vocabulary:
        return cls(tokens)


class LabelSet:
    """Class labels ↔ ids, in sorted order (so every split agrees on the mapping)."""

    def __init__(self, labels: Iterable[str]):
        self.itos = sorted(set(labels))
        if not self.itos:
            raise ArgumentError("a label set needs at least one label")
        self.stoi = {label: i for i, label in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other) -> bool:
        return isinstance(other, LabelSet) and self.itos == other.itos

    def encode(self, label: str, where: str = "") -> int:
        if label not in self.stoi:
            raise ArgumentError(f"{where + ': ' if where else ''}unknown label {label!r}; expected one of {self.itos}")
        return self.stoi[label]

    def decode(self, ids: torch.Tensor | Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]
