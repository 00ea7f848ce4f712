"""Per-head (parameter-untied) linear maps and the feature-wise source2token score of MTSA Eq. 9."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = {"elu": F.elu, "relu": F.relu}


class HeadwiseLinear(nn.Module):
    """``H`` independent linear maps applied to ``(B, H, n, d_in)``: ``y[:, h] = x[:, h] @ W[h] + b[h]``."""

    def __init__(self, num_heads: int, d_in: int, d_out: int, *, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads, d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(num_heads, 1, d_out)) if bias else None
        # Glorot initialisation per head (MTSA Appendix B), biases zero.
        bound = math.sqrt(6.0 / (d_in + d_out))
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, n, d_in = x.shape
        # one batched matmul over heads; a broadcast (1, H, d_in, d_out) weight would be expanded to
        # B·H copies and kept for backward
        heads_first = x.transpose(0, 1).reshape(H, B * n, d_in)  # (B, H, n, d_in) -> (H, B·n, d_in)
        y = torch.bmm(heads_first, self.weight) if self.bias is None else \
            torch.baddbmm(self.bias, heads_first, self.weight)  # (H, B·n, d_out)
        return y.view(H, B, n, y.shape[-1]).transpose(0, 1)  # (B, H, n, d_out), a view


class HeadwiseSource2Token(nn.Module):
    """Feature-wise source2token scores per head, MTSA Eq. 9: ``S = W_s2 σ_m(W_s1 k + b_s1) + b_s2``."""

    def __init__(self, num_heads: int, d_in: int, d_hidden: int, d_out: int, *, activation: str = "elu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown s2t_activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
        self.activation = activation
        self.hidden = HeadwiseLinear(num_heads, d_in, d_hidden)
        self.score = HeadwiseLinear(num_heads, d_hidden, d_out)

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        hidden = self.hidden(k)
        # in place: ELU / ReLU backward only needs the output, so the pre-activation is not kept
        hidden = F.elu(hidden, inplace=True) if self.activation == "elu" else F.relu(hidden, inplace=True)
        return self.score(hidden)  # (B, H, n, d_in) -> (B, H, n, d_out)


class HeadwiseFusionGate(nn.Module):
    """Per-head fusion gate of DiSA / the MTSA authors' code: ``g = σ(W_1 v + W_2 a + b)``,
    output ``g ⊙ v + (1 − g) ⊙ a``."""

    def __init__(self, num_heads: int, d_head: int):
        super().__init__()
        self.from_input = HeadwiseLinear(num_heads, d_head, d_head, bias=False)
        self.from_attention = HeadwiseLinear(num_heads, d_head, d_head)

    def forward(self, v: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.from_input(v) + self.from_attention(attended))
        return gate * v + (1.0 - gate) * attended
