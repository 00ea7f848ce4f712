"""The synthetic order task shipped as code (the embedded default job of ``maskattn train`` and the
``maskattn demo``): a sequence of random filler tokens holds two markers ``A`` and ``B``; the label
says whether ``A`` comes before ``B``. Without positional encodings, plain multi-head attention is
permutation invariant and stays at chance; MTSA's forward/backward head masks encode order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .examples import TextExample

__all__ = ["OrderTask", "VOCAB", "MARKER_A", "MARKER_B", "PAD", "order_splits"]

VOCAB, MARKER_A, MARKER_B, PAD = 32, 1, 2, 0


@dataclass
class OrderTask:
    """Batches of (tokens, key_padding_mask, label) for the "does A come before B" task."""

    min_len: int = 8
    max_len: int = 24
    seed: int = 0

    def batch(self, size: int, generator: torch.Generator):
        """(tokens (size, n) ids, padding mask (size, n) True = padding, labels (size,) 1 = A before B)."""
        lengths = torch.randint(self.min_len, self.max_len + 1, (size,), generator=generator)
        n = int(lengths.max())
        tokens = torch.randint(3, VOCAB, (size, n), generator=generator)
        pad = torch.arange(n)[None, :] >= lengths[:, None]
        labels = torch.randint(0, 2, (size,), generator=generator)
        for i in range(size):
            a, b = torch.randperm(int(lengths[i]), generator=generator)[:2].sort().values.tolist()
            first, second = (MARKER_A, MARKER_B) if labels[i] else (MARKER_B, MARKER_A)
            tokens[i, a], tokens[i, b] = first, second
        tokens[pad] = PAD
        return tokens, pad, labels

    def examples(self, size: int, generator: torch.Generator) -> list[TextExample]:
        """The same task as text: markers ``A`` / ``B``, fillers ``w3`` … ``w31``, labels ``before`` /
        ``after``."""
        tokens, pad, labels = self.batch(size, generator)
        names = ["<pad>", "A", "B"] + [f"w{i}" for i in range(3, VOCAB)]
        return [TextExample(tuple(names[t] for t in row[~mask].tolist()), "before" if y else "after")
                for row, mask, y in zip(tokens, pad, labels.tolist())]


def order_splits(train: int = 4000, dev: int = 500, test: int = 1000, *, min_len: int = 8, max_len: int = 24,
                 seed: int = 0):
    """Train / dev / test lists of :class:`TextExample` for the order task (independent seeded draws)."""
    task = OrderTask(min_len, max_len, seed)
    draw = (lambda n, k: task.examples(n, torch.Generator().manual_seed(seed * 1000 + k)))
    return draw(train, 1), draw(dev, 2), draw(test, 3)
