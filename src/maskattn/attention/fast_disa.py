"""Fast directional self-attention (Fast-DiSA; Shen et al., 2018), the earlier parameterisation of MTSA.

Per head ``l`` (Fast-DiSA §3, Eq. 1–6)::

    x^l = W^m_l x                                           (6)
    f^t_ij = <W_t1 x^l_i, W_t2 x^l_j> / √d_h                (1)
    f^s_j  = W_s2 σ_s(W_s1 x^l_j + b_s1) + b_s2             (2)
    f_ijk  = σ_t(f^t_ij) + f^s_jk + M_ij                    (3)
    s_i    = Σ_j softmax_j(f_ij) ⊙ x^l_j                     (4–5)

Values are the projected input itself and the heads are concatenated with no output projection.
Same engine as MTSA (:func:`maskattn.functional.tensorized_attention`). The authors' function (taoshen58/DiSAN
``Fast-DiSA/fast_disa.py``) is MTSA's with other defaults; :meth:`FastDiSA.authors_config` sets them
(docs/fidelity.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from .. import masks as M
from ..validation import check_bool, check_choice
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
        v_activation: ``None`` (Eq. 6, Algorithm 1 step 3) or ``"elu"`` / ``"relu"``: ``x^l = σ(W^m_l x + b)``,
            the authors' ``apply_act_for_v=True`` (their default); q/k, ``S`` and the gate see ``σ(x^l)``.
        dense_dropout: dropout on the input of every linear map, one mask per head for ``W^m`` (the authors'
            ``dense_keep_prob = 1 − dense_dropout``); 0 by default.
    """

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 head_masks: Sequence[M.Mask | str] | None = None, strict_masks: bool = False,
                 scale: str = "log_sigmoid", s2t_activation: str = "elu", fusion_gate: bool = False,
                 v_activation: str | None = None, dense_dropout: float = 0.0):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, head_masks=head_masks,
                         strict_masks=strict_masks, scale=scale, v_activation=v_activation,
                         dense_dropout=dense_dropout)
        check_choice(s2t_activation, "s2t_activation", tuple(ACTIVATIONS))
        check_bool(fusion_gate, "fusion_gate")
        self.head_proj = nn.Linear(d_model, d_model)  # the W^m_l of all heads, stacked
        nn.init.xavier_uniform_(self.head_proj.weight)
        nn.init.zeros_(self.head_proj.bias)
        self.query = HeadwiseLinear(num_heads, self.d_head, self.d_head, bias=False, input_dropout=dense_dropout)
        self.key = HeadwiseLinear(num_heads, self.d_head, self.d_head, bias=False, input_dropout=dense_dropout)
        self.source2token = HeadwiseSource2Token(num_heads, self.d_head, self.d_head, self.d_head,
                                                 activation=s2t_activation, input_dropout=dense_dropout)
        self.fusion_gate = HeadwiseFusionGate(num_heads, self.d_head, input_dropout=dense_dropout) if fusion_gate \
            else None

    @classmethod
    def authors_config(cls, d_model: int, num_heads: int = 2, **overrides) -> FastDiSA:
        """Fast-DiSA as the authors' ``fast_directional_self_attention`` builds it with its defaults and the
        README's single-layer recommendations (taoshen58/DiSAN ``Fast-DiSA/fast_disa.py`` lines 60-68,
        ``Fast-DiSA/README.md``): strict masks, fusion gate, sigmoid token2token scale, ReLU on the values
        and in the source2token map; ``overrides`` replace any of them. The authors released no training
        script for it, so ``d_model`` (their ``hn``) is the caller's."""
        return cls(d_model, num_heads, **{**AUTHORS_OPTIONS, **overrides})

    def project(self, x: torch.Tensor):
        """``q, k`` from ``x^l`` (Eq. 1), values ``x^l = W^m_l x`` (Eq. 6) and ``S`` (Eq. 2), per head."""
        xl = self.activate_values(self.heads_from_input(self.head_proj, x))  # (B, H, n, d_h): x^l of Eq. 6
        return self.query(xl), self.key(xl), xl, self.source2token(xl)


#: The options of the authors' Fast-DiSA function: ``use_direction=True, attn_self=False, use_fusion_gate=True,
#: activation_func_name='relu', apply_act_for_v=True`` (its defaults) and ``dot_activation_name='sigmoid'``
#: (its README's single-layer column; the function's own default is ``'exp'``, i.e. ``scale="identity"``).
AUTHORS_OPTIONS = {"strict_masks": True, "fusion_gate": True, "scale": "log_sigmoid", "v_activation": "relu",
                   "s2t_activation": "relu"}
