"""Encoder layers: residual sublayers (attention, feed-forward) with pre- or post-LayerNorm."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._validation import check_choice, check_positive_int, check_probability
from .attention.registry import create_attention

NORMS = ("pre", "post")

__all__ = ["FeedForward", "Residual", "EncoderLayer", "NORMS"]


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``W2 · act(W1 x + b1) + b2`` (Vaswani et al., 2017)."""

    def __init__(self, d_model: int, ffn_dim: int, *, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_positive_int(ffn_dim, "ffn_dim")
        self.activation = check_choice(activation, "activation", ("relu", "gelu"))
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = F.relu if self.activation == "relu" else F.gelu
        return self.fc2(self.dropout(act(self.fc1(x))))


class Residual(nn.Module):
    """``x + dropout(f(LN(x)))`` (pre-LN) or ``LN(x + dropout(f(x)))`` (post-LN) around a sublayer ``f``."""

    def __init__(self, d_model: int, *, norm: str = "pre", dropout: float = 0.0):
        super().__init__()
        self.norm_position = check_choice(norm, "norm", NORMS)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.norm_position == "pre":
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """One encoder layer: a registered self-attention sublayer, then a feed-forward sublayer.

    ``attention`` is a registry name (see :func:`maskattn.list_attentions`) built with
    ``attention_options``; padded positions of the output are 0.
    """

    def __init__(self, d_model: int, num_heads: int, *, attention: str = "mha", attention_options: dict | None = None,
                 ffn_dim: int | None = None, dropout: float = 0.0, norm: str = "pre"):
        super().__init__()
        self.attention = create_attention(attention, d_model, num_heads, **(attention_options or {}))
        self.attention_residual = Residual(d_model, norm=norm, dropout=dropout)
        self.ffn = FeedForward(d_model, ffn_dim or 4 * d_model, dropout=dropout)
        self.ffn_residual = Residual(d_model, norm=norm, dropout=dropout)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attention_residual(x, lambda h: self.attention(h, key_padding_mask=key_padding_mask))
        x = self.ffn_residual(x, self.ffn)
        if key_padding_mask is not None:
            x = x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)
        return x
