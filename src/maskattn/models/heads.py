"""Sentence pooling (multi-dim source2token, mean, max, first token) and the MLP classifier head."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import ArgumentError
from ..attention import Source2Token

__all__ = ["Pool", "MLP", "POOLS"]

POOLS = ("source2token", "mean", "max", "cls")


class Pool(nn.Module):
    """``(B, n, d)`` + padding mask → ``(B, d)``: multi-dim source2token attention (MTSA Eq. 9 pooling),
    the mean / max over non-padding tokens, or (``cls``) the first token — the ``[CLS]`` / ``<s>`` of a
    pretrained encoder's input."""

    def __init__(self, d_model: int, kind: str = "source2token", *, dropout: float = 0.0):
        super().__init__()
        if kind not in POOLS:
            raise ArgumentError(f"unknown model.pool {kind!r}; expected one of {', '.join(POOLS)}")
        self.kind = kind
        self.attention = Source2Token(d_model, dropout=dropout) if kind == "source2token" else None

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.attention is not None:
            return self.attention(x, key_padding_mask=key_padding_mask)
        if self.kind == "cls":
            return x[:, 0]  # (B, n, d) -> (B, d)
        if key_padding_mask is None:
            return x.mean(1) if self.kind == "mean" else x.amax(1)
        keep = (~key_padding_mask).unsqueeze(-1)  # (B, n, 1)
        if self.kind == "mean":
            return (x * keep).sum(1) / keep.sum(1).clamp(min=1)
        return x.masked_fill(~keep, float("-inf")).amax(1).nan_to_num(0.0, neginf=0.0)


class MLP(nn.Module):
    """``layers`` hidden layers (``activation``, dropout) then a linear output layer."""

    def __init__(self, d_in: int, hidden: int, d_out: int, *, layers: int = 1, activation: str = "relu",
                 dropout: float = 0.0):
        super().__init__()
        acts = {"relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU, "tanh": nn.Tanh}
        if activation not in acts:
            raise ArgumentError(f"unknown model.activation {activation!r}; expected one of {', '.join(acts)}")
        blocks, width = [], d_in
        for _ in range(layers):
            blocks += [nn.Dropout(dropout), nn.Linear(width, hidden), acts[activation]()]
            width = hidden
        blocks += [nn.Dropout(dropout), nn.Linear(width, d_out)]
        self.net = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
