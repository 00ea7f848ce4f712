"""Positional encodings added to a stack's input (MTSA needs none: its masks encode order)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..errors import ArgumentError
from ..validation import check_choice, check_positive_int

__all__ = ["PositionalEncoding", "POSITIONAL"]

POSITIONAL = ("none", "sinusoidal", "learned")


class PositionalEncoding(nn.Module):
    """Adds positions to ``(B, n, d)`` inputs: ``"sinusoidal"`` (Vaswani et al. 2017, fixed) or
    ``"learned"`` (a trained table of ``max_len`` rows). MTSA needs none: its masks encode order."""

    def __init__(self, d_model: int, kind: str = "sinusoidal", max_len: int = 512):
        super().__init__()
        self.kind = check_choice(kind, "positional", POSITIONAL[1:])
        self.max_len = check_positive_int(max_len, "max_len")
        if kind == "learned":
            self.table = nn.Parameter(torch.empty(max_len, d_model).normal_(0.0, 0.02))
        else:
            position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
            rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
            table = torch.zeros(max_len, d_model)
            table[:, 0::2] = torch.sin(position * rate)
            table[:, 1::2] = torch.cos(position * rate[: d_model // 2])
            self.register_buffer("table", table, persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Add positions ``offset … offset + n − 1`` to ``x`` ``(B, n, d)``; ``offset`` > 0 continues a
        sequence (incremental decoding)."""
        n = x.shape[1]
        if offset + n > self.max_len:
            raise ArgumentError(f"sequence length {offset + n} exceeds the positional encoding's max_len {self.max_len}; "
                             "raise max_len or truncate inputs")
        return x + self.table[offset:offset + n].to(x.dtype)
