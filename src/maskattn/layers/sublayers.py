"""The non-attention sublayers of a layer: the position-wise feed-forward network and the residual wrapper."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..validation import check_choice, check_positive_int, check_probability

__all__ = ["FeedForward", "Residual", "NORMS", "FFN_ACTIVATIONS"]

NORMS = ("pre", "post")
FFN_ACTIVATIONS = ("relu", "gelu")


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``W2 · dropout(act(W1 x + b1)) + b2`` (Vaswani et al., 2017); MAN's
    identity-mask attention (MAN Eq. 8–9). ``dropout`` is the inner (activation) dropout."""

    def __init__(self, d_model: int, ffn_dim: int, *, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_positive_int(ffn_dim, "ffn_dim")
        self.activation = check_choice(activation, "activation", FFN_ACTIVATIONS)
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
