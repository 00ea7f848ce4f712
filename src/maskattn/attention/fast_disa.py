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
from ..validation import check_choice
from .base import split_heads
from .headwise import ACTIVATIONS, HeadwiseFusionGate, HeadwiseLinear, HeadwiseSource2Token
from .mtsa import TensorizedSelfAttention
from .registry import register_attention


@register_attention("fast_disa", description="fast directional self-attention (Fast-DiSA, Shen et al. 2018)")
class FastDiSA(TensorizedSelfAttention):
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
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, head_masks=head_masks,
                         strict_masks=strict_masks, scale=scale)
        check_choice(s2t_activation, "s2t_activation", tuple(ACTIVATIONS))
        self.head_proj = nn.Linear(d_model, d_model)  # the W^m_l of all heads, stacked
        nn.init.xavier_uniform_(self.head_proj.weight)
        nn.init.zeros_(self.head_proj.bias)
        self.query = HeadwiseLinear(num_heads, self.d_head, self.d_head, bias=False)
        self.key = HeadwiseLinear(num_heads, self.d_head, self.d_head, bias=False)
        self.source2token = HeadwiseSource2Token(num_heads, self.d_head, self.d_head, self.d_head,
                                                 activation=s2t_activation)
        self.fusion_gate = HeadwiseFusionGate(num_heads, self.d_head) if fusion_gate else None

    def project(self, x: torch.Tensor):
        """``q, k`` from ``x^l`` (Eq. 1), values ``x^l = W^m_l x`` (Eq. 6) and ``S`` (Eq. 2), per head."""
        xl = split_heads(self.head_proj(x), self.num_heads)  # (B, H, n, d_h): x^l of Eq. 6
        return self.query(xl), self.key(xl), xl, self.source2token(xl)
