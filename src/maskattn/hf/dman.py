"""DMAN (MAN, Fan et al. 2021, Eq. 12) in a pretrained encoder layer, equal to the original at initialisation.

MAN Eq. 4 and 12: ``S_M(Q, K)_ts = M_ts exp(q_t·k_s/√d) / Σ_l M_tl exp(q_t·k_l/√d)`` with the learned mask
``M[b, h, t, s] = σ(x_t·W + P[t − s] + U_h)``. With ``W = 0`` and ``P = 0`` the mask is ``σ(U_h)`` for every
query and key of head ``h``: a constant factor of a whole row, which the normalisation of Eq. 4 cancels —
the layer computes exactly the pretrained softmax attention, for any ``U``. ``U`` is therefore initialised
to 0 (``M = 1/2``) rather than to a large value: ``σ'`` is then 1/4, whereas ``U = 30`` (``M ≈ 1``) is just as
exact but scales every gradient through the mask by ``σ'(30) ≈ 1e-13`` and leaves ``P`` and ``W`` frozen in
practice.

At initialisation only ``P`` receives a gradient: ``x_t·W`` and ``U_h`` shift whole rows of the log-mask, and
softmax is invariant to that shift while ``P`` is constant; once ``P`` has moved, ``W`` and ``U`` learn too.
"""

from __future__ import annotations

import torch

from ..functional import dynamic_mask_attention
from .base import ConvertedSelfAttention
from .options import check_float, check_int, check_known


class DynamicMaskSelfAttention(ConvertedSelfAttention):
    """The pretrained layer's q/k/v with DMAN's mask (MAN Eq. 12) on its attention (MAN Eq. 4).

    New parameters: ``mask_query`` ``W`` (hidden,), ``distance_bias`` ``P`` (2·max_distance + 1,),
    ``head_bias`` ``U`` (heads,). Options: ``max_distance`` (default 128; larger ``|t − s|`` share the edge
    entry of ``P``) and ``head_bias_init`` (default 0.0; any value keeps the layer exact at initialisation).
    """

    mechanism = "dman"
    DEFAULTS = {"max_distance": 128, "head_bias_init": 0.0}

    @classmethod
    def check_options(cls, options: dict, num_heads: int) -> dict:
        check_known(options, cls.DEFAULTS, cls.mechanism)
        resolved = {**cls.DEFAULTS, **options}
        check_int(resolved["max_distance"], "max_distance", 1, "the largest |t − s| with its own entry of P")
        resolved["head_bias_init"] = check_float(resolved["head_bias_init"], "head_bias_init",
                                                 "the initial U_h of MAN Eq. 12")
        return resolved

    @classmethod
    def change_note(cls, options: dict) -> None:
        return None  # exact for every option value (module docstring)

    def __init__(self, original, **options):
        super().__init__(original, options)
        hidden = self.query.in_features
        self.mask_query = self.new_parameter(torch.zeros(hidden))  # W: x_t·W, MAN Eq. 12
        self.distance_bias = self.new_parameter(torch.zeros(2 * options["max_distance"] + 1))  # P[t − s]
        self.head_bias = self.new_parameter(torch.full((self.num_attention_heads,), options["head_bias_init"]))

    def attend(self, hidden_states, q, k, v, key_padding_mask):
        dtype = q.dtype  # the projections' dtype, bfloat16 under autocast
        query_logit = hidden_states.to(dtype) @ self.mask_query.to(dtype)  # (B, n, hidden) @ (hidden,) -> (B, n)
        return dynamic_mask_attention(q, k, v, query_logit, self.distance_bias.to(dtype), self.head_bias.to(dtype),
                                      key_padding_mask=key_padding_mask, dropout_p=self.dropout_p,
                                      training=self.training)
