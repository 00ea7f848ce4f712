"""Directional self-attention (DiSA; Shen et al., AAAI 2018) — the multi-dim token2token baseline.

Per direction (head) ``c`` with mask ``M^c`` (MTSA §2.2, Eq. 6; DiSA §3.3)::

    h = elu(W_h x + b_h)
    f_ij = c · tanh((W_1 h_i + W_2 h_j + b) / c) + M_ij        (feature-wise, c = 5)
    s_i  = Σ_j softmax_j(f_ij) ⊙ h_j
    u_i  = g_i ⊙ h_i + (1 − g_i) ⊙ s_i,  g_i = σ(W_f1 s_i + W_f2 h_i + b_f)   (fusion gate)

The alignment scores form a ``(B, H, n, n, d_h)`` tensor by construction; this is the memory baseline
of MTSA Fig. 1, so only the ``reference`` backend exists.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArgumentError
from ..validation import entry_point
from .. import masks as M
from ..kernels.softmax import masked_softmax
from .base import AttentionMaps, SelfAttention, check_input, merge_heads, split_heads, zero_padding
from .headwise import HeadwiseFusionGate, HeadwiseLinear
from .mtsa import resolve_head_masks
from .registry import register_attention


@register_attention("disa", description="directional self-attention (DiSA), n×n×d baseline")
class DiSA(SelfAttention):
    """Directional self-attention with forward/backward heads (strict masks and a fusion gate by
    default, as in DiSA). ``tanh_scale`` is the constant ``c`` of Eq. 6."""

    family = "multi_dim"

    def __init__(self, d_model: int, num_heads: int = 2, *, dropout: float = 0.0, backend: str = "auto",
                 head_masks: Sequence[M.Mask | str] | None = None, strict_masks: bool = True,
                 tanh_scale: float = 5.0, fusion_gate: bool = True):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend)
        self.d_head = d_model // num_heads
        if not isinstance(tanh_scale, (int, float)) or isinstance(tanh_scale, bool) or tanh_scale <= 0:
            raise ArgumentError(f"tanh_scale must be a positive number, got {tanh_scale!r}")
        self.tanh_scale = float(tanh_scale)
        self.mask = resolve_head_masks(head_masks, num_heads, include_diagonal=not strict_masks)
        self.input_proj = nn.Linear(d_model, d_model)
        self.key_score = HeadwiseLinear(num_heads, self.d_head, self.d_head, bias=False)
        self.query_score = HeadwiseLinear(num_heads, self.d_head, self.d_head)
        self.fusion_gate = HeadwiseFusionGate(num_heads, self.d_head) if fusion_gate else None

    def _probabilities(self, x: torch.Tensor, kpm: torch.Tensor | None):
        """``h`` (B, H, n, d_h) and the feature-wise probabilities (B, H, n, n, d_h) of Eq. 6."""
        n = x.shape[1]
        h = split_heads(F.elu(self.input_proj(x)), self.num_heads)  # (B, H, n, d_h)
        c = self.tanh_scale
        # (B, H, n, 1, d_h) + (B, H, 1, n, d_h) -> (B, H, n_query, n_key, d_h)
        scores = c * torch.tanh((self.query_score(h).unsqueeze(3) + self.key_score(h).unsqueeze(2)) / c)
        allowed = M.allowed(self.mask, kpm, n, n, batch=x.shape[0], heads=self.num_heads, device=x.device)
        return h, masked_softmax(scores, None if allowed is None else allowed.unsqueeze(-1), dim=3)

    @entry_point
    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d_model) → (B, n, d_model); padded positions are 0."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        h, probs = self._probabilities(x, kpm)
        dropped = F.dropout(probs, self.dropout, training=self.training) if self.dropout > 0 else probs
        attended = (dropped * h.unsqueeze(2)).sum(dim=3)  # (B, H, n, d_h)
        if self.fusion_gate is not None:
            attended = self.fusion_gate(h, attended)
        return zero_padding(merge_heads(attended), kpm)

    @entry_point
    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionMaps:
        """``attention``: the feature-wise probabilities (B, H, n, n, d_h)."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        return AttentionMaps(attention=self._probabilities(x, kpm)[1])
