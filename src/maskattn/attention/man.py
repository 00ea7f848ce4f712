"""Mask Attention Networks (Fan et al., NAACL 2021): DMAN (Eq. 12), SMAN (Eq. 11, §4.2) and SAN (Eq. 6–7)
as mask attention modules.

All three are multi-head mask attention (Eq. 5)::

    H^{l+1} = F([A_{M^1}, …, A_{M^I}]) W_H,   A_{M^i} = A_{M^i}(H W_Q^i, H W_K^i, H W_V^i)

with the mask attention function of Eq. 4 and ``F`` the identity (paper) or ReLU (``activation="relu"``,
as the authors' code does for every attention of their layer: LibertFan/MAN
``translation/fairseq/modules/multihead_attention2.py`` line 249). DMAN's mask is learned
(:mod:`maskattn.functional.dman`); SMAN's is the band ``|t − s| <= b`` (:func:`maskattn.masks.window`), which
runs on the library's local kernels; SAN's is all ones (``"man_san"``: plain multi-head attention with ``F``).

Incremental decoding (causal DMAN / SMAN / SAN): ``cache = module.init_cache()``, then
``out, cache = module.step(x_new, cache)``; the step-by-step outputs equal the full-sequence causal
outputs. ``AttentionCache.reorder(index)`` selects batch rows (beam search).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArgumentError, ArgumentTypeError
from .. import backends
from .. import masks as M
from ..validation import check_choice, check_positive_int, check_probability, describe, entry_point
from ..functional.activations import ACTIVATIONS, activation as activation_fn, check_activation
from ..functional.dman import (MASK_FLOOR_MODES, check_mask_floor, check_mask_floor_mode, dynamic_mask,
                               dynamic_mask_attention, dynamic_mask_weights)
from ..functional.dot_product import attention_weights, dot_product_attention
from ..functional.local import banded_attention
from .base import (AttentionCache, AttentionMaps, SelfAttention, check_input, merge_heads,
                   qkv_projections, split_qkv, zero_padding)
from .registry import register_attention

__all__ = ["DynamicMaskAttention", "StaticMaskAttention", "FullMaskAttention", "OUTPUT_ACTIVATIONS",
           "SELF_DISTANCES", "MASK_FLOOR_MODES"]

#: ``F`` of Eq. 5: None (identity, the paper) or a name of the activation table — "relu" (the authors' translation
#: code, ``multihead_attention2.py`` line 249), "gelu" (their summarization model, ``man_base``), …
OUTPUT_ACTIVATIONS = (None, *ACTIVATIONS)

#: DMAN's ``P[0]`` (distance ``t − s = 0``): "learned" like every other distance (Eq. 12) or "zero", fixed at 0
#: as the authors' table is built (``multihead_attention2.py`` lines 100–101).
SELF_DISTANCES = ("learned", "zero")


class _MaskAttention(SelfAttention):
    """Q/K/V projections, head split, output activation ``F`` (and the dropout after it) and projection ``W_H``
    (Eq. 5)."""

    def __init__(self, d_model, num_heads, *, dropout, backend, activation, bias, causal, activation_dropout=0.0):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend)
        self.activation = check_activation(activation, "activation")
        self.activation_dropout = check_probability(activation_dropout, "activation_dropout")
        if not isinstance(causal, bool):
            raise ArgumentTypeError(f"causal must be a bool, got {describe(causal)}")
        self._causal = causal
        self.in_proj, self.out_proj = qkv_projections(d_model, bias=bias)

    @property
    def causal(self) -> bool:
        return self._causal

    def _activation_repr(self) -> str:
        """``activation=…`` (and the dropout after it, when there is one) for ``extra_repr``."""
        dropout = f", activation_dropout={self.activation_dropout}" if self.activation_dropout else ""
        return f"activation={self.activation}{dropout}"

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head ``q, k, v``: three ``(B, H, n, d_h)`` tensors."""
        return split_qkv(self.in_proj(x), self.num_heads)

    def _finish(self, out: torch.Tensor, kpm: torch.Tensor | None) -> torch.Tensor:
        if self.activation is not None:
            out = activation_fn(self.activation)(out)  # F of Eq. 5, per head (elementwise)
        if self.training and self.activation_dropout > 0:  # summarization/model/multihead_attention2.py line 295
            out = F.dropout(out, self.activation_dropout, True)
        return zero_padding(self.out_proj(merge_heads(out)), kpm)  # (B, n, d_model)

    def _attend(self, x, q, k, v, key_padding_mask, q_offset):
        raise NotImplementedError

    @entry_point
    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d_model) → (B, n, d_model); padded positions are 0."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        q, k, v = self.project(x)
        return self._finish(self._attend(x, q, k, v, kpm, 0), kpm)

    @entry_point
    def step(self, x: torch.Tensor, cache: AttentionCache,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, AttentionCache]:
        kpm, q, cache, offset = self._step_inputs(x, cache, key_padding_mask)
        out = self._attend(x, q, cache.key, cache.value, cache.padding, offset)
        return self._finish(out, kpm), cache


@register_attention("dman", description="MAN dynamic mask attention: M = sigmoid(x_t W + P[t-s] + U_h) (Eq. 12)")
class DynamicMaskAttention(_MaskAttention):
    """Dynamic Mask Attention Network (MAN Eq. 12 in Eq. 4/5).

    ``M[b, h, t, s] = sigmoid(x_t·W + P[t − s] + U[h])`` with ``W: d_model → 1`` (no bias), one learned
    scalar ``P`` per signed relative distance and one scalar ``U`` per head, all per layer (module).

    Args:
        d_model, num_heads: width and heads (``d_model`` divisible by ``num_heads``).
        dropout: attention-probability dropout. backend: ``auto`` | ``reference`` | ``sdpa`` | ``flex``.
        max_distance: ``P`` covers ``t − s ∈ [−max_distance, max_distance]``; larger distances use the
            edge value ``P[±max_distance]`` (clipping; the authors' code instead sizes the table to the
            maximum number of positions — use ``max_distance = max_len`` for that). Never out of bounds.
        causal: decoder self-attention (queries see keys at positions ``<=`` their own); enables
            incremental decoding with :meth:`step`.
        activation: ``F`` of Eq. 5 — ``None`` (identity) or a name of the activation table: ``"relu"`` (the
            authors' translation code), ``"gelu"`` (their summarization model), ….
        activation_dropout: dropout after ``F``, before the output projection (0; 0.1 in the authors'
            summarization model, ``summarization/model/multihead_attention2.py`` line 295).
        bias: biases of the Q/K/V and output projections.
        self_distance: ``"learned"`` (Eq. 12: ``P[0]`` is a parameter like every distance) or ``"zero"``
            (``P[0] ≡ 0``, as the authors' code; the stored entry ``distance_bias[max_distance]`` is then unused).
        mask_floor: ``None`` (the exact ``log M``) or ``ε``: ``log max(M, ε)`` — the authors' code clamps ``M``
            at ``1e-10`` before the log; it differs only where ``M < ε`` (there a key keeps the weight
            ``ε·exp(score)`` and passes no gradient to ``W``, ``P``, ``U``).
        mask_floor_mode: what ``mask_floor`` clamps (:data:`~maskattn.functional.dman.MASK_FLOOR_MODES`):
            ``"absolute"`` — ``M`` itself (the authors' translation code, ``multihead_attention2.py`` line 122);
            ``"row_max"`` — ``M`` divided by its maximum over the row's keys, the maximum taken without gradient
            (their summarization code, ``summarization/model/multihead_attention2.py`` line 144): the floor of a
            row is ``ε · max_s M[t, s]``. Needs ``mask_floor``. Backends: ``reference``, ``sdpa`` (the
            materialised formula: the tiled kernel takes a fixed floor only) and ``flex``; ``triton`` declines it.

    :meth:`attention_maps` returns ``attention`` and ``mask`` (the ``M`` used, floored), both ``(B, H, n, n)``.
    """

    family = "dman"

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 max_distance: int = 128, causal: bool = False, activation: str | None = None, bias: bool = True,
                 self_distance: str = "learned", mask_floor: float | None = None,
                 mask_floor_mode: str = "absolute", activation_dropout: float = 0.0):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, activation=activation, bias=bias,
                         causal=causal, activation_dropout=activation_dropout)
        self.max_distance = check_positive_int(max_distance, "max_distance")
        self.self_distance = check_choice(self_distance, "self_distance", SELF_DISTANCES)
        self.mask_floor = check_mask_floor(mask_floor)
        self.mask_floor_mode = check_mask_floor_mode(mask_floor_mode, self.mask_floor)
        self.mask_query = nn.Linear(d_model, 1, bias=False)  # W of Eq. 12
        self.distance_bias = nn.Parameter(torch.zeros(2 * max_distance + 1))  # P[t − s], index D + (t − s)
        self.head_bias = nn.Parameter(torch.zeros(num_heads))  # U[h]

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, max_distance={self.max_distance}, "
                f"causal={self.causal}, {self._activation_repr()}, self_distance={self.self_distance!r}, "
                f"mask_floor={self.mask_floor}, mask_floor_mode={self.mask_floor_mode!r}, backend={self.backend!r}")

    def _query_logit(self, x):
        return self.mask_query(x).squeeze(-1)  # (B, n, 1) -> (B, n): x_t W

    def _distance_table(self) -> torch.Tensor:
        """``P`` as used: with ``self_distance="zero"`` the entry of ``t − s = 0`` is 0 (and gets no gradient)."""
        if self.self_distance == "learned":
            return self.distance_bias
        D = self.max_distance
        return torch.cat([self.distance_bias[:D], self.distance_bias.new_zeros(1), self.distance_bias[D + 1:]])

    @entry_point
    def dynamic_mask(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The mask ``M`` of Eq. 12 for input ``x`` ``(B, n, d)``: ``(B, H, n, n)`` in ``[0, 1]`` (floored at
        ``mask_floor``); entries of padded keys (and future keys when ``causal``) are 0. Differentiable; plot it
        with ``imshow``."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        return dynamic_mask(self._query_logit(x), self._distance_table(), self.head_bias, causal=self.causal,
                            key_padding_mask=kpm, mask_floor=self.mask_floor, mask_floor_mode=self.mask_floor_mode)

    def _attend(self, x, q, k, v, key_padding_mask, q_offset):
        return dynamic_mask_attention(q, k, v, self._query_logit(x), self._distance_table(), self.head_bias,
                                      causal=self.causal, key_padding_mask=key_padding_mask, q_offset=q_offset,
                                      backend=self.backend, dropout_p=self.dropout, training=self.training,
                                      mask_floor=self.mask_floor, mask_floor_mode=self.mask_floor_mode)

    @entry_point
    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionMaps:
        """``attention``: ``S_M`` of Eq. 4 (B, H, n, n); ``mask``: ``M`` of Eq. 12 (B, H, n, n)."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        q, k, _ = self.project(x)
        probs, mask = dynamic_mask_weights(q, k, self._query_logit(x), self._distance_table(), self.head_bias,
                                           causal=self.causal, key_padding_mask=kpm, mask_floor=self.mask_floor,
                                           mask_floor_mode=self.mask_floor_mode)
        return AttentionMaps(attention=probs, mask=mask)


RADIUS_MODES = ("sqrt",)


def _band_radius(radius: float) -> int:
    """SMAN's fixed boundary ``b`` as an int: ``floor(radius)``; an infinite radius is a band past any sequence."""
    return math.floor(min(radius, 2.0**61))


def _check_sman_radius(radius):
    if isinstance(radius, str):
        if radius not in RADIUS_MODES:
            raise ArgumentError(f"radius must be a number >= 0 or 'sqrt' (b = sqrt(L)/2, MAN §4.2), got {radius!r}")
        return radius
    if isinstance(radius, bool) or not isinstance(radius, (int, float)) or math.isnan(radius):
        raise ArgumentTypeError(f"radius must be a number >= 0 or 'sqrt', got {describe(radius)}")
    if radius < 0:
        raise ArgumentError(f"radius must be >= 0 or 'sqrt', got {radius}")
    return radius


@register_attention("sman", description="MAN static mask attention: attend within |t-s| <= b (Eq. 11)")
class StaticMaskAttention(_MaskAttention):
    """Static Mask Attention Network (MAN Eq. 11, §4.2): ``SM[t, s] = 1`` if ``|t − s| <= b`` else 0.

    Args:
        radius: the boundary ``b`` — a number (SMAN₂ uses 4) or ``"sqrt"`` for ``b = sqrt(L)/2`` with
            ``L`` each sequence's own length (padding excluded; SMAN₁).
        causal: additionally hide future keys (decoder); enables :meth:`step` (fixed ``radius`` only).
        dropout, activation, activation_dropout, bias: as :class:`DynamicMaskAttention`.
        backend: ``auto`` | ``triton`` (fixed radius: the fused band kernel; CUDA) | ``banded`` (fixed radius: the
            O(n·b) local kernel) | ``flex`` | ``sdpa`` (dense) | ``reference``.

    :meth:`attention_maps` returns ``attention`` ``(B, H, n, n)`` and ``mask`` ``(B|1, 1, n, n)`` (0/1).
    Decoding steps (:meth:`step`) and ``radius="sqrt"`` attend densely (dense masked attention: a few rows per step,
    where a band kernel saves nothing); the band kernels (``banded``, ``triton``) decline them, so a module that
    decodes keeps ``backend="auto"`` (or a dense backend).
    """

    family = "local"

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 radius: float | str = 4, causal: bool = False, activation: str | None = None, bias: bool = True,
                 activation_dropout: float = 0.0):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, activation=activation, bias=bias,
                         causal=causal, activation_dropout=activation_dropout)
        self.radius = _check_sman_radius(radius)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, radius={self.radius!r}, causal={self.causal}, "
                f"{self._activation_repr()}, backend={self.backend!r}")

    def _structure(self, key_padding_mask: torch.Tensor | None, n: int, device) -> M.Mask:
        """SM of Eq. 11 (and causal) as a mask predicate; for ``"sqrt"``, one radius per sequence."""
        if self.radius == "sqrt":
            lengths = (~key_padding_mask).sum(-1) if key_padding_mask is not None else torch.full((1,), n, device=device)
            return M.sequence_window(lengths.to(torch.float64).sqrt() / 2)  # b = sqrt(L)/2
        b = _band_radius(self.radius)
        return M.band(b, 0) if self.causal else M.window(b)

    @entry_point
    def static_mask(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """SM of Eq. 11 for ``x`` ``(B, n, d)`` as a float ``(B|1, 1, n, n)`` 0/1 tensor (padded keys 0)."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        return self._allowed(kpm, x.shape[0], x.shape[1], x.device).to(x.dtype)

    def _allowed(self, kpm, B, n, device) -> torch.Tensor:
        structure = self._structure(kpm, n, device)
        allowed = M.allowed(structure, kpm, n, n, batch=1 if structure.static else B, heads=1, device=device)
        return allowed if allowed is not None else torch.ones(1, 1, n, n, dtype=torch.bool, device=device)

    def _attend(self, x, q, k, v, key_padding_mask, q_offset):
        structure = self._structure(key_padding_mask, k.shape[2], q.device)
        fixed_band = self.radius != "sqrt" and q_offset == 0 and q.shape[2] == k.shape[2]
        if fixed_band:
            b = _band_radius(self.radius)
            return banded_attention(q, k, v, (b, 0) if self.causal else b, key_padding_mask=key_padding_mask,
                                    dropout_p=self.dropout, training=self.training, backend=self.backend)
        # a per-sentence radius, or a decoding step (queries at positions q_offset …): dense masked attention, one
        # resolution in the local family, whose band kernels decline it (class docstring)
        backend = backends.resolve("local", self.backend, backends.Situation.of(
            q, k, v, dropout=self.training and self.dropout > 0, batch_mask=True))
        return dot_product_attention(q, k, v, structure.shifted(q_offset), key_padding_mask=key_padding_mask,
                                     dropout_p=self.dropout, training=self.training, backend=backend)

    @entry_point
    def step(self, x: torch.Tensor, cache: AttentionCache,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, AttentionCache]:
        if self.radius == "sqrt":
            raise ArgumentError("radius='sqrt' depends on the whole sequence length and cannot be decoded "
                             "incrementally; use a fixed radius with step()")
        return super().step(x, cache, key_padding_mask)

    @entry_point
    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionMaps:
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        q, k, _ = self.project(x)
        allowed = self._allowed(kpm, x.shape[0], x.shape[1], x.device)
        return AttentionMaps(attention=attention_weights(q, k, allowed), mask=allowed.to(q.dtype))


@register_attention("man_san", description="MAN's SAN: the all-ones mask (Eq. 6-7) with Eq. 5's F (activation)")
class FullMaskAttention(_MaskAttention):
    """SAN written as MAN's mask attention (Eq. 6–7: ``M`` all ones) inside Eq. 5, so that it takes ``F``:
    with ``activation=None`` it is :class:`~maskattn.MultiHeadAttention` (same parameters and ``state_dict``
    keys); with ``activation="relu"`` it is the SAN sublayer of the authors' MAN layer, which is the same
    class as their DMAN without the mask and so applies the same ReLU (``multihead_attention2.py`` line 249).

    Args:
        causal: decoder self-attention (queries see keys at positions ``<=`` their own); enables :meth:`step`.
        dropout, backend, activation, activation_dropout, bias: as :class:`DynamicMaskAttention` (backends of
            plain attention).

    :meth:`attention_maps` returns ``attention`` ``(B, H, n, n)``.
    """

    family = "dot_product"

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 causal: bool = False, activation: str | None = None, bias: bool = True,
                 activation_dropout: float = 0.0):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, activation=activation, bias=bias,
                         causal=causal, activation_dropout=activation_dropout)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, causal={self.causal}, "
                f"{self._activation_repr()}, backend={self.backend!r}")

    def _structure(self, q_offset: int) -> M.Mask | None:
        return M.causal().shifted(q_offset) if self.causal else None

    def _attend(self, x, q, k, v, key_padding_mask, q_offset):
        return dot_product_attention(q, k, v, self._structure(q_offset), key_padding_mask=key_padding_mask,
                                     dropout_p=self.dropout, training=self.training, backend=self.backend)

    @entry_point
    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionMaps:
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        q, k, _ = self.project(x)
        return AttentionMaps(attention=attention_weights(q, k, self._structure(0), key_padding_mask=kpm))
