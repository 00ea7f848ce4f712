"""MTSA (Shen et al. 2019, Eq. 9–12) in a pretrained encoder layer, equal to the original at initialisation.

MTSA Eq. 10–12: ``f_ijl = σ_t(q_i·k_j/√d) + S_jl + M_ij``, ``p_ijl = softmax_j f_ijl``,
``o_il = Σ_j p_ijl v_jl``, with the feature-wise source2token score of Eq. 9,
``S_j = W_s2 σ_m(W_s1 k_j + b_s1) + b_s2`` per head. Initialised with ``σ_t`` the identity
(``scale="identity"``), ``W_s2 = 0`` (so ``S = 0``) and the ``full`` mask on every head, Eq. 10 is the
scaled dot product for every feature and Eq. 11–12 are the pretrained softmax attention exactly.

``b_s2`` is left out: a per-feature constant over the keys cancels in the softmax over ``j`` of Eq. 11, so
it never changes the output and never receives a gradient. At initialisation ``W_s2`` receives a gradient
and ``W_s1``, ``b_s1`` (behind ``W_s2 = 0``) do not; after one step all three learn.

The paper's form — ``σ_t`` the log-sigmoid and forward / backward masks per head (MTSA §3.2) — is
``scale="log_sigmoid"`` with ``head_masks="directional"``; it changes the outputs at initialisation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..errors import ArgumentError, warn_renamed
from .. import masks
from ..functional import ACTIVATIONS, SCALES, activation, tensorized_attention
from .base import ConvertedSelfAttention
from .options import check_choice, check_int, check_known, describe

HEAD_MASK_NAMES = ("full", "directional")


def __getattr__(name: str):
    if name == "HEAD_MASK_PRESETS":  # its name before "preset" came to mean a run configuration only
        warn_renamed("maskattn.hf.mtsa.HEAD_MASK_PRESETS", "HEAD_MASK_NAMES")
        return HEAD_MASK_NAMES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _head_mask_names(head_masks, num_heads: int) -> list[str]:
    """One mask name per head from ``"full"``, ``"directional"`` or a list of names."""
    if head_masks == "full":
        return ["full"] * num_heads
    if head_masks == "directional":
        if num_heads % 2:
            raise ArgumentError(f"head_masks='directional' needs an even number of heads (forward on the first "
                             f"half, backward on the second, MTSA §3.2), got {num_heads} heads")
        return ["forward"] * (num_heads // 2) + ["backward"] * (num_heads // 2)
    if isinstance(head_masks, str) or not isinstance(head_masks, Sequence):
        raise ArgumentError(f"head_masks must be 'full', 'directional' or a list with one mask name per head "
                         f"({', '.join(masks.MASK_NAMES)} or 'window:R'), got {describe(head_masks)}")
    if len(head_masks) != num_heads:
        raise ArgumentError(f"head_masks has {len(head_masks)} entries; expected one per head ({num_heads})")
    for name in head_masks:
        masks.from_name(name)  # raises a ValueError naming the unknown mask
    return list(head_masks)


class TensorizedSelfAttention(ConvertedSelfAttention):
    """The pretrained layer's q/k/v with MTSA's feature-wise attention (MTSA Eq. 9–12).

    New parameters, per head: ``s2t_hidden_weight`` ``W_s1`` (heads, d, s2t_hidden), ``s2t_hidden_bias``
    ``b_s1`` (heads, 1, s2t_hidden) and ``s2t_score_weight`` ``W_s2`` (heads, s2t_hidden, d), zero. Options:
    ``scale`` (``"identity"``, exact; ``"log_sigmoid"``, the paper), ``head_masks`` (``"full"``, exact;
    ``"directional"``, the paper; or one mask name per head), ``s2t_hidden`` (default: the head width) and
    ``s2t_activation`` (``σ_m``: a name of :data:`maskattn.functional.ACTIVATIONS`, default ``"elu"``).
    """

    mechanism = "mtsa"
    DEFAULTS = {"scale": "identity", "head_masks": "full", "s2t_hidden": None, "s2t_activation": "elu"}

    @classmethod
    def check_options(cls, options: dict, num_heads: int) -> dict:
        check_known(options, cls.DEFAULTS, cls.mechanism)
        resolved = {**cls.DEFAULTS, **options}
        check_choice(resolved["scale"], "scale", SCALES)
        names = _head_mask_names(resolved["head_masks"], num_heads)
        if not isinstance(resolved["head_masks"], str):
            resolved["head_masks"] = names
        if resolved["s2t_hidden"] is not None:
            check_int(resolved["s2t_hidden"], "s2t_hidden", 1, "hidden width of the source2token map, Eq. 9")
        check_choice(resolved["s2t_activation"], "s2t_activation", tuple(ACTIVATIONS))
        return resolved

    @classmethod
    def change_note(cls, options: dict) -> str | None:
        changes = []
        if options["scale"] != "identity":
            changes.append(f"scale={options['scale']!r} (exact: 'identity')")
        if options["head_masks"] != "full":
            changes.append(f"head_masks={options['head_masks']!r} (exact: 'full')")
        return ", ".join(changes) or None

    def __init__(self, original, **options):
        super().__init__(original, options)
        H, d = self.num_attention_heads, self.attention_head_size
        hidden = options["s2t_hidden"] or d
        bound = math.sqrt(6.0 / (d + hidden))  # Glorot per head (MTSA Appendix B)
        self.s2t_hidden_weight = self.new_parameter(torch.empty(H, d, hidden).uniform_(-bound, bound))
        self.s2t_hidden_bias = self.new_parameter(torch.zeros(H, 1, hidden))
        self.s2t_score_weight = self.new_parameter(torch.zeros(H, hidden, d))  # W_s2 = 0: S = 0 (exact start)
        names = _head_mask_names(options["head_masks"], H)
        full = all(name == "full" for name in names)
        self.head_mask = None if full else masks.per_head([masks.from_name(name) for name in names])

    def source2token(self, k: torch.Tensor) -> torch.Tensor:
        """``S = W_s2 σ_m(W_s1 k + b_s1)`` per head, MTSA Eq. 9 (without ``b_s2``): (B, H, n, d) -> (B, H, n, d)."""
        dtype = k.dtype
        hidden = torch.matmul(k, self.s2t_hidden_weight.to(dtype)) + self.s2t_hidden_bias.to(dtype)  # (B, H, n, a)
        hidden = activation(self.options["s2t_activation"])(hidden)
        return torch.matmul(hidden, self.s2t_score_weight.to(dtype))  # (B, H, n, a) @ (H, a, d) -> (B, H, n, d)

    def attend(self, hidden_states, q, k, v, key_padding_mask):
        return tensorized_attention(q, k, v, self.source2token(k), self.head_mask, scale=self.options["scale"],
                                    key_padding_mask=key_padding_mask, dropout_p=self.dropout_p,
                                    training=self.training)
