"""Multi-mask tensorized self-attention (MTSA; Shen et al., NAACL 2019).

Per head ``c`` (MTSA §3.1–3.2, Eq. 7–13)::

    q, k = W_q x, W_k x   (d_k each),   v = W_v x   (d_h)                      (7)
    R_ij = q_i·k_j / √d_k                                                      (8)
    S_j  = W_s2 σ_m(W_s1 k_j + b_s1) + b_s2 ∈ R^{d_h}                          (9)
    f_ijl = σ_t(R_ij) + S_jl + M^c_ij,   p = softmax_j f,   H^c_i = Σ_j p_ij ⊙ v_j   (10–12)
    s = W_o [H^1; …; H^h]                                                      (13)

computed by :func:`maskattn.functional.tensorized_attention` without n×n×d tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from .. import masks as M
from ..validation import check_choice, check_positive_int
from ..functional.tensorized import SCALES, tensorized_attention, tensorized_attention_maps
from .base import AttentionMaps, SelfAttention, check_input, merge_heads, split_heads, zero_padding
from .headwise import ACTIVATIONS, HeadwiseFusionGate, HeadwiseLinear, HeadwiseSource2Token
from .registry import register_attention


def directional_head_masks(num_heads: int, *, include_diagonal: bool = True, name: str = "num_heads") -> list[M.Mask]:
    """Forward masks on the first half of the heads, backward masks on the second half (MTSA §3.2)."""
    if num_heads % 2:
        raise ValueError(f"{name} must be even for the default forward/backward split, got {num_heads}; "
                         "pass head_masks=[...] with one mask per head instead")
    half = num_heads // 2
    return [M.forward(include_diagonal)] * half + [M.backward(include_diagonal)] * half


def resolve_head_masks(head_masks, num_heads: int, include_diagonal: bool) -> M.Mask:
    """One :class:`~maskattn.masks.Mask` covering every head, from a per-head list (names or Masks)."""
    if head_masks is None:
        per_head = directional_head_masks(num_heads, include_diagonal=include_diagonal)
    else:
        if isinstance(head_masks, (str, M.Mask)) or not isinstance(head_masks, Sequence):
            raise TypeError("head_masks must be a list with one mask (a Mask or a name such as 'forward', "
                            f"'backward', 'window:3') per head, got {type(head_masks).__name__}")
        if len(head_masks) != num_heads:
            raise ValueError(f"head_masks has {len(head_masks)} entries but num_heads is {num_heads}; "
                             "expected one mask per head")
        per_head = [M.from_name(m) for m in head_masks]
    return M.per_head(per_head)


class TensorizedSelfAttention(SelfAttention):
    """What MTSA and Fast-DiSA share: per-head masks, the tensorized attention of MTSA Eq. 10–12 on
    ``project(x) = (q, k, v, S)``, an optional fusion gate (``self.fusion_gate``, set by the subclass), the
    heads concatenated, then :meth:`output`."""

    family = "tensorized"

    def __init__(self, d_model, num_heads, *, dropout, backend, head_masks, strict_masks, scale):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend)
        self.d_head = d_model // num_heads
        self.scale = check_choice(scale, "scale", SCALES)
        if not isinstance(strict_masks, bool):
            raise TypeError(f"strict_masks must be a bool, got {strict_masks!r}")
        self.mask = resolve_head_masks(head_masks, num_heads, include_diagonal=not strict_masks)

    def project(self, x: torch.Tensor):
        """Per-head ``q, k`` (B, H, n, d_k), values ``v`` and source2token scores ``S`` (B, H, n, d_h)."""
        raise NotImplementedError

    def output(self, heads: torch.Tensor) -> torch.Tensor:
        """The concatenated heads ``(B, n, d_model)`` → the module output (identity: no output projection)."""
        return heads

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d_model) → (B, n, d_model); padded positions are 0."""
        kpm = check_input(x, self.d_model, key_padding_mask)
        q, k, v, s2t = self.project(x)
        attended = tensorized_attention(q, k, v, s2t, self.mask, scale=self.scale, backend=self.backend,
                                        key_padding_mask=kpm, dropout_p=self.dropout, training=self.training)
        if self.fusion_gate is not None:
            attended = self.fusion_gate(v, attended)
        return zero_padding(self.output(merge_heads(attended)), kpm)  # (B, n, d_model)

    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionMaps:
        """``attention``: the token2token probabilities (B, H, n, n); ``source2token``: the feature-wise
        source2token weights (B, H, n, d_h) (see :func:`~maskattn.functional.tensorized_attention_maps`; the
        feature-wise attention of Eq. 11 is ``p_ijl ∝ attention_ij · source2token_jl``)."""
        kpm = check_input(x, self.d_model, key_padding_mask)
        q, k, _, s2t = self.project(x)
        t2t, s2t_probs = tensorized_attention_maps(q, k, s2t, self.mask, scale=self.scale, key_padding_mask=kpm)
        return AttentionMaps(attention=t2t, source2token=s2t_probs)


@register_attention("mtsa", description="multi-mask tensorized self-attention (MTSA, Shen et al. 2019)")
class MTSA(TensorizedSelfAttention):
    """Multi-mask tensorized self-attention.

    Args:
        d_model: input and output width; each head has ``d_h = d_model // num_heads`` value features.
        num_heads: number of heads; by default half use the forward mask, half the backward mask.
        dropout: attention dropout (Appendix A.3): keep probability ``sqrt(1 - dropout)`` on each of
            the two numerator factors of Algorithm 1 step 7, denominator undropped.
        backend: ``"auto"`` | ``"reference"`` | ``"sdpa"`` | ``"flex"`` | ``"banded"`` (window heads).
        head_masks: one mask per head (``Mask`` objects or names: ``"forward"``, ``"backward"``,
            ``"forward_strict"``, ``"backward_strict"``, ``"full"``, ``"window:R"``).
        strict_masks: exclude the diagonal from the default forward/backward masks — the masks of
            MTSA §2.2 as written (``M^fw_ij = 0`` only for ``j < i``) and the authors' code default.
            The default (diagonal included) lets every token see itself without a fusion gate.
        scale: ``σ_t``, ``"log_sigmoid"`` (paper default) or ``"identity"``.
        d_k: per-head query/key width ``d_i`` (default ``d_h``).
        s2t_hidden: hidden width ``d_a`` of the source2token map (default ``d_h``).
        s2t_activation: ``σ_m``, ``"elu"`` (default) or ``"relu"``.
        s2t_input: compute the source2token score from ``"k"`` (paper, Eq. 9) or ``"v"`` (authors' code).
        qk_input: compute q/k from ``"x"`` (paper, Eq. 7) or from ``"v"`` per head (authors' code).
        fusion_gate: per-head gate ``g ⊙ v + (1 − g) ⊙ attention`` (authors' code).
        out_proj: apply ``W_o`` (Eq. 13); ``False`` concatenates the heads, as the authors' code.
    """

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 head_masks: Sequence[M.Mask | str] | None = None, strict_masks: bool = False,
                 scale: str = "log_sigmoid", d_k: int | None = None, s2t_hidden: int | None = None,
                 s2t_activation: str = "elu", s2t_input: str = "k", qk_input: str = "x",
                 fusion_gate: bool = False, out_proj: bool = True):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, head_masks=head_masks,
                         strict_masks=strict_masks, scale=scale)
        self.d_k = self.d_head if d_k is None else check_positive_int(d_k, "d_k")
        self.s2t_input = check_choice(s2t_input, "s2t_input", ("k", "v"))
        self.qk_input = check_choice(qk_input, "qk_input", ("x", "v"))
        check_choice(s2t_activation, "s2t_activation", tuple(ACTIVATIONS))

        self.v_proj = nn.Linear(d_model, d_model)
        if self.qk_input == "x":
            self.q_proj = nn.Linear(d_model, num_heads * self.d_k)
            self.k_proj = nn.Linear(d_model, num_heads * self.d_k)
        else:
            self.q_from_v = HeadwiseLinear(num_heads, self.d_head, self.d_k)
            self.k_from_v = HeadwiseLinear(num_heads, self.d_head, self.d_k)
        s2t_in = self.d_k if self.s2t_input == "k" else self.d_head
        self.source2token = HeadwiseSource2Token(num_heads, s2t_in, s2t_hidden or self.d_head, self.d_head,
                                                 activation=s2t_activation)
        self.fusion_gate = HeadwiseFusionGate(num_heads, self.d_head) if fusion_gate else None
        self.out_proj = nn.Linear(d_model, d_model) if out_proj else None
        for linear in (self.v_proj, getattr(self, "q_proj", None), getattr(self, "k_proj", None), self.out_proj):
            if linear is not None:
                nn.init.xavier_uniform_(linear.weight)
                nn.init.zeros_(linear.bias)

    def output(self, heads: torch.Tensor) -> torch.Tensor:
        return heads if self.out_proj is None else self.out_proj(heads)  # W_o of Eq. 13

    def project(self, x: torch.Tensor):
        """Per-head ``q, k`` (B, H, n, d_k), ``v`` and source2token scores ``S`` (B, H, n, d_h)."""
        v = split_heads(self.v_proj(x), self.num_heads)  # (B, H, n, d_h)
        if self.qk_input == "x":
            q = split_heads(self.q_proj(x), self.num_heads)  # (B, H, n, d_k)
            k = split_heads(self.k_proj(x), self.num_heads)
        else:
            q, k = self.q_from_v(v), self.k_from_v(v)
        s2t = self.source2token(k if self.s2t_input == "k" else v)
        return q, k, v, s2t
