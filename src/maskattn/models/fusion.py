"""Context fusion: ``(B, n, d_in)`` + padding mask → ``(B, n, out_dim)``. The baselines of MTSA Table 1
(Bi-LSTM, Bi-GRU, Multi-CNN, Hrchy-CNN) in a few lines each; attention stacks come from a layer recipe
(``"mtsa"``, ``"mha"`` with positional encodings, ``"disa"``, …) through :meth:`maskattn.Encoder.from_recipe`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..layers import Encoder

__all__ = ["BiRNN", "MultiCNN", "HierarchicalCNN", "RecipeFusion", "BASELINES", "list_fusions"]


def _zero_padding(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x.masked_fill(mask.unsqueeze(-1), 0.0)


class BiRNN(nn.Module):
    """Bi-LSTM / Bi-GRU (MTSA §4: 300D forward + 300D backward); packed, so padding never leaks into the
    backward direction. ``out_dim = 2 · hidden``."""

    def __init__(self, d_in: int, *, hidden: int | None = None, cell: str = "lstm", layers: int = 1):
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.hidden = hidden or d_in
        self.rnn = rnn(d_in, self.hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.out_dim = 2 * self.hidden

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, n, _ = x.shape
        lengths = torch.full((B,), n) if key_padding_mask is None else (~key_padding_mask).sum(1).cpu()
        packed = pack_padded_sequence(x, lengths.clamp(min=1), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=n)  # (B, n, 2·hidden)
        return _zero_padding(out, key_padding_mask)


class MultiCNN(nn.Module):
    """Kim (2014)-style convolutions over 3/4/5-grams (MTSA §4: 200 channels each), ReLU, concatenated
    per token (``out_dim = channels · len(kernels)``); a pooling layer follows."""

    def __init__(self, d_in: int, *, channels: int = 200, kernels: Sequence[int] = (3, 4, 5)):
        super().__init__()
        self.d_in, self.channels, self.kernels = d_in, channels, tuple(kernels)
        self.convs = nn.ModuleList(nn.Conv1d(d_in, channels, k) for k in kernels)
        self.out_dim = channels * len(kernels)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = _zero_padding(x, key_padding_mask).transpose(1, 2)  # (B, d_in, n)
        # "same" length per kernel: (k-1)//2 zeros on the left, k//2 on the right
        outs = [F.relu(conv(F.pad(h, ((k - 1) // 2, k // 2)))) for k, conv in zip(self.kernels, self.convs)]
        out = torch.cat(outs, dim=1).transpose(1, 2)  # (B, n, out_dim)
        return _zero_padding(out, key_padding_mask)


class HierarchicalCNN(nn.Module):
    """Hrchy-CNN (Gehring et al. 2017; MTSA §4): ``layers`` stacked convolutions (kernel 5) with gated
    linear units and residual connections, ``x ← x + GLU(conv(x))``; ``out_dim = d_in``."""

    def __init__(self, d_in: int, *, layers: int = 3, kernel: int = 5, dropout: float = 0.0):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(d_in, 2 * d_in, kernel, padding="same") for _ in range(layers))
        self.dropout = nn.Dropout(dropout)
        self.out_dim = d_in

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for conv in self.convs:
            h = _zero_padding(x, key_padding_mask).transpose(1, 2)  # (B, d, n)
            x = x + self.dropout(F.glu(conv(h), dim=1).transpose(1, 2))  # GLU halves 2d → d
        return _zero_padding(x, key_padding_mask)


class RecipeFusion(nn.Module):
    """An attention :class:`~maskattn.Encoder` built from a layer recipe; ``out_dim = d_in``."""

    def __init__(self, d_in: int, recipe, *, num_heads: int, **encoder_kw):
        super().__init__()
        self.encoder = Encoder.from_recipe(d_in, num_heads, recipe, **encoder_kw)
        self.out_dim = d_in

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(x, key_padding_mask=key_padding_mask)


#: the baseline context fusions by name: ``factory(d_in, **options)`` → a module with an ``out_dim``
BASELINES: dict[str, Callable[..., nn.Module]] = {
    "bilstm": lambda d, **kw: BiRNN(d, cell="lstm", **kw),
    "bigru": lambda d, **kw: BiRNN(d, cell="gru", **kw),
    "multi_cnn": MultiCNN,
    "hrchy_cnn": HierarchicalCNN,
}


def list_fusions() -> list[str]:
    """The baseline context-fusion names (anything else is parsed as a layer recipe)."""
    return sorted(BASELINES)
