"""Per-head (parameter-untied) linear maps and the feature-wise source2token score of MTSA Eq. 9.

Every map takes an optional ``input_dropout``: dropout on its own input, as the authors' dense layers do
(``multi_head_dense_layer`` / ``bn_dense_layer`` with ``dense_keep_prob`` in taoshen58/mtsa ``MTSA_API/mtsa.py``);
:func:`project_heads` applies a full-width input map with one dropout mask per head (their code tiles the
input per head "to make the dropout different for each head", ``mtsa.py`` line 134).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArgumentError
from ..validation import check_probability
from ..functional.activations import ACTIVATIONS, check_activation
from .base import split_heads

__all__ = ["ACTIVATIONS", "project_heads", "HeadwiseLinear", "HeadwiseSource2Token", "HeadwiseFusionGate"]


def project_heads(linear: nn.Linear, x: torch.Tensor, num_heads: int, *, input_dropout: float = 0.0,
                  training: bool = False) -> torch.Tensor:
    """``linear(x)`` split into heads, ``(B, n, d_in)`` → ``(B, H, n, d_out / H)``; with ``input_dropout`` in
    training, each head's slice of the map reads ``x`` through its own dropout mask."""
    if not (training and input_dropout > 0):
        return split_heads(linear(x), num_heads)
    B, n, d_in = x.shape
    dropped = F.dropout(x.unsqueeze(1).expand(B, num_heads, n, d_in), input_dropout, True)  # (B, H, n, d_in)
    weight = linear.weight.view(num_heads, -1, d_in)  # (H·d_h, d_in) -> (H, d_h, d_in)
    out = torch.einsum("bhni,hoi->bhno", dropped, weight)  # (B, H, n, d_h)
    return out if linear.bias is None else out + linear.bias.view(num_heads, 1, -1)


class HeadwiseLinear(nn.Module):
    """``H`` independent linear maps applied to ``(B, H, n, d_in)``: ``y[:, h] = x[:, h] @ W[h] + b[h]``;
    ``input_dropout`` drops the input first (training only)."""

    def __init__(self, num_heads: int, d_in: int, d_out: int, *, bias: bool = True, input_dropout: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads, d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(num_heads, 1, d_out)) if bias else None
        self.input_dropout = check_probability(input_dropout, "input_dropout")
        # Glorot initialisation per head (MTSA Appendix B), biases zero.
        bound = math.sqrt(6.0 / (d_in + d_out))
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.input_dropout > 0:
            x = F.dropout(x, self.input_dropout, True)
        B, H, n, d_in = x.shape
        # one batched matmul over heads; a broadcast (1, H, d_in, d_out) weight would be expanded to
        # B·H copies and kept for backward
        heads_first = x.transpose(0, 1).reshape(H, B * n, d_in)  # (B, H, n, d_in) -> (H, B·n, d_in)
        y = torch.bmm(heads_first, self.weight) if self.bias is None else \
            torch.baddbmm(self.bias, heads_first, self.weight)  # (H, B·n, d_out)
        return y.view(H, B, n, y.shape[-1]).transpose(0, 1)  # (B, H, n, d_out), a view


class HeadwiseSource2Token(nn.Module):
    """Feature-wise source2token scores per head, MTSA Eq. 9: ``S = W_s2 σ_m(W_s1 k + b_s1) + b_s2``
    (``layers=2``), or the single map ``S = W_s k + b_s`` (``layers=1``: the authors' stacked MTSA,
    ``add_layer_for_multi=False``, ``MTSA_API/mtsa.py`` lines 214–220)."""

    def __init__(self, num_heads: int, d_in: int, d_hidden: int, d_out: int, *, activation: str = "elu",
                 layers: int = 2, input_dropout: float = 0.0):
        super().__init__()
        check_activation(activation, "s2t_activation", optional=False)
        if isinstance(layers, bool) or layers not in (1, 2):
            raise ArgumentError(f"s2t_layers must be 1 (one linear map) or 2 (MTSA Eq. 9), got {layers!r}")
        self.activation = activation
        self.hidden = HeadwiseLinear(num_heads, d_in, d_hidden, input_dropout=input_dropout) if layers == 2 else None
        self.score = HeadwiseLinear(num_heads, d_hidden if layers == 2 else d_in, d_out, input_dropout=input_dropout)

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        if self.hidden is None:
            return self.score(k)  # (B, H, n, d_in) -> (B, H, n, d_out)
        hidden = self.hidden(k)
        if self.activation in ("elu", "relu"):
            # in place: ELU / ReLU backward only needs the output, so the pre-activation is not kept
            hidden = F.elu(hidden, inplace=True) if self.activation == "elu" else F.relu(hidden, inplace=True)
        else:
            hidden = ACTIVATIONS[self.activation](hidden)
        return self.score(hidden)  # (B, H, n, d_in) -> (B, H, n, d_out)


class HeadwiseFusionGate(nn.Module):
    """Per-head fusion gate of DiSA / the MTSA authors' code: ``g = σ(W_1 v + W_2 a + b)``,
    output ``g ⊙ v + (1 − g) ⊙ a``."""

    def __init__(self, num_heads: int, d_head: int, *, input_dropout: float = 0.0):
        super().__init__()
        self.from_input = HeadwiseLinear(num_heads, d_head, d_head, bias=False, input_dropout=input_dropout)
        self.from_attention = HeadwiseLinear(num_heads, d_head, d_head, input_dropout=input_dropout)

    def forward(self, v: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.from_input(v) + self.from_attention(attended))
        return gate * v + (1.0 - gate) * attended
