"""Fast directional self-attention (Fast-DiSA; Shen et al., 2018), the earlier parameterisation of MTSA.

Per head ``l`` (Fast-DiSA §3, Eq. 1–6)::

    x^l = W^m_l x                                           (6)
    f^t_ij = <W_t1 x^l_i, W_t2 x^l_j> / √d_h                (1)
    f^s_j  = W_s2 σ_s(W_s1 x^l_j + b_s1) + b_s2             (2)
    f_ijk  = σ_t(f^t_ij) + f^s_jk + M_ij                    (3)
    s_i    = Σ_j softmax_j(f_ij) ⊙ x^l_j                     (4–5)

Values are the projected input itself and the heads are concatenated with no output projection.
Same engine as MTSA (:func:`maskattn.functional.tensorized_attention`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from .. import masks as M
from ..functional.tensorized import SCALES, tensorized_attention, tensorized_attention_maps
from ._common import check_choice, check_dims, check_input, check_probability, merge_heads, split_heads, zero_padding
from ._headwise import ACTIVATIONS, HeadwiseFusionGate, HeadwiseLinear, HeadwiseSource2Token
from .mtsa import resolve_head_masks
from .registry import register_attention


@register_attention("fast_disa", description="fast directional self-attention (Fast-DiSA, Shen et al. 2018)")
class FastDiSA(nn.Module):
    """Fast directional self-attention.

    Args:
        d_model: input and output width (``num_heads`` heads of ``d_model // num_heads`` features).
        dropout, backend, head_masks, scale: as in :class:`~maskattn.MTSA`.
        strict_masks: exclude the diagonal from the default forward/backward masks. Fast-DiSA §3.1
            enables self-attention of a token to itself unless a fusion gate is used, so the default
            is ``False``.
        s2t_activation: ``σ_s`` of Eq. 2, ``"elu"`` or ``"relu"``.
        fusion_gate: DiSA's fusion gate ``g ⊙ x^l + (1 − g) ⊙ s`` per head (footnote 1).
    """

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 head_masks: Sequence[M.Mask | str] | None = None, strict_masks: bool = False,
                 scale: str = "log_sigmoid", s2t_activation: str = "elu", fusion_gate: bool = False):
        super().__init__()
        check_dims(d_model, num_heads)
        self.d_model, self.num_heads = d_model, num_heads
        self.d_head = d_model // num_heads
        self.dropout = check_probability(dropout, "dropout")
        self.backend = check_choice(backend, "backend", ("auto", "reference", "sdpa", "flex"))
        self.scale = check_choice(scale, "scale", SCALES)
        check_choice(s2t_activation, "s2t_activation", tuple(ACTIVATIONS))
        if not isinstance(strict_masks, bool):
            raise TypeError(f"strict_masks must be a bool, got {strict_masks!r}")
        self.mask = resolve_head_masks(head_masks, num_heads, include_diagonal=not strict_masks)
        self.head_proj = nn.Linear(d_model, d_model)  # the W^m_l of all heads, stacked
        nn.init.xavier_uniform_(self.head_proj.weight)
        nn.init.zeros_(self.head_proj.bias)
        self.query = HeadwiseLinear(num_heads, self.d_head, self.d_head, bias=False)
        self.key = HeadwiseLinear(num_heads, self.d_head, self.d_head, bias=False)
        self.source2token = HeadwiseSource2Token(num_heads, self.d_head, self.d_head, self.d_head,
                                                 activation=s2t_activation)
        self.fusion_gate = HeadwiseFusionGate(num_heads, self.d_head) if fusion_gate else None

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, return_attention: bool = False):
        """x: (B, n, d_model) → (B, n, d_model); ``return_attention`` adds the maps of MTSA."""
        kpm = check_input(x, self.d_model, key_padding_mask)
        xl = split_heads(self.head_proj(x), self.num_heads)  # (B, H, n, d_h): x^l of Eq. 6
        q, k = self.query(xl), self.key(xl)
        s2t = self.source2token(xl)
        backend = "reference" if return_attention else self.backend
        attended = tensorized_attention(q, k, xl, s2t, self.mask, scale=self.scale, backend=backend,
                                        key_padding_mask=kpm, dropout_p=self.dropout, training=self.training)
        if self.fusion_gate is not None:
            attended = self.fusion_gate(xl, attended)
        out = zero_padding(merge_heads(attended), kpm)
        if not return_attention:
            return out
        t2t, s2t_probs = tensorized_attention_maps(q, k, s2t, self.mask, scale=self.scale, key_padding_mask=kpm)
        return out, {"token2token": t2t, "source2token": s2t_probs}
