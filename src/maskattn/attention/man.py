"""Mask Attention Networks (Fan et al., NAACL 2021): DMAN (Eq. 12) and SMAN (Eq. 11, §4.2) modules.

Both are multi-head mask attention (Eq. 5)::

    H^{l+1} = F([A_{M^1}, …, A_{M^I}]) W_H,   A_{M^i} = A_{M^i}(H W_Q^i, H W_K^i, H W_V^i)

with the mask attention function of Eq. 4 (:func:`maskattn.functional.mask_attention`) and ``F``
the identity (paper) or ReLU (``activation="relu"``, as the authors' code does).

Incremental decoding (causal DMAN / SMAN): pass ``cache=AttentionCache()`` and feed the new
positions; ``forward`` returns ``(out, new_cache)`` and the step-by-step outputs equal the
full-sequence causal outputs. ``AttentionCache.reorder(index)`` selects batch rows (beam search).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._validation import check_positive_int, describe
from ..functional.local import banded_attention
from ..functional.mask_attention import (
    _dman_reference,
    dynamic_mask,
    dynamic_mask_attention,
    mask_attention,
    mask_attention_weights,
    static_window_mask,
)
from ._common import (
    add_qkv_projections,
    check_choice,
    check_dims,
    check_input,
    check_probability,
    merge_heads,
    split_heads,
    zero_padding,
)
from .registry import register_attention

__all__ = ["AttentionCache", "DynamicMaskAttention", "StaticMaskAttention", "ACTIVATIONS"]

ACTIVATIONS = (None, "relu")


@dataclass(frozen=True)
class AttentionCache:
    """Keys and values of the positions decoded so far, for causal incremental self-attention.

    ``key``/``value``: ``(B, H, t, d_h)`` (``None`` before the first step); ``padding``: ``(B, t)``
    bool, True = padding, or ``None`` when no cached position is padding. Immutable: ``forward``
    returns a new cache. ``len(cache)`` is the number of cached positions ``t`` — the absolute
    position of the next query.
    """

    key: torch.Tensor | None = None
    value: torch.Tensor | None = None
    padding: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.key is None else self.key.shape[2]

    @property
    def batch_size(self) -> int | None:
        return None if self.key is None else self.key.shape[0]

    def extend(self, key: torch.Tensor, value: torch.Tensor, padding: torch.Tensor | None) -> AttentionCache:
        """A new cache with ``key``/``value`` ``(B, H, n_new, d_h)`` appended along positions."""
        if self.key is None:
            return AttentionCache(key, value, padding)
        old_pad, new_pad = self.padding, padding
        if old_pad is not None or new_pad is not None:
            B = key.shape[0]
            if old_pad is None:
                old_pad = torch.zeros(B, len(self), dtype=torch.bool, device=key.device)
            if new_pad is None:
                new_pad = torch.zeros(B, key.shape[2], dtype=torch.bool, device=key.device)
            padding = torch.cat([old_pad, new_pad], dim=1)
        return AttentionCache(torch.cat([self.key, key], dim=2), torch.cat([self.value, value], dim=2), padding)

    def reorder(self, index: torch.Tensor) -> AttentionCache:
        """Select / repeat batch rows (``index``: 1-D long tensor), e.g. to follow beams."""
        if self.key is None:
            return self
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in (torch.long, torch.int):
            raise TypeError(f"index must be a 1-D integer tensor of batch rows, got {describe(index)}")
        index = index.to(self.key.device)
        pad = None if self.padding is None else self.padding.index_select(0, index)
        return AttentionCache(self.key.index_select(0, index), self.value.index_select(0, index), pad)


def _check_activation(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of None (identity, paper Eq. 7) or "
                         "'relu' (authors' code)")
    return activation


def _check_cache(cache, B: int, causal: bool, name: str) -> AttentionCache:
    if not isinstance(cache, AttentionCache):
        raise TypeError(f"cache must be a maskattn.AttentionCache (start with AttentionCache()), got {describe(cache)}")
    if not causal:
        raise ValueError(f"cache (incremental decoding) needs a causal {name}; construct it with causal=True")
    if cache.batch_size is not None and cache.batch_size != B:
        raise ValueError(f"cache holds batch size {cache.batch_size} but the input has batch size {B}; "
                         "reorder the cache with cache.reorder(index) after changing the batch")
    return cache


class _MaskAttentionBase(nn.Module):
    """Q/K/V projections, head split, output activation ``F`` and projection ``W_H`` (Eq. 5)."""

    def __init__(self, d_model, num_heads, *, dropout, backend, activation, bias, causal):
        super().__init__()
        check_dims(d_model, num_heads)
        self.d_model, self.num_heads = d_model, num_heads
        self.dropout = check_probability(dropout, "dropout")
        self.backend = check_choice(backend, "backend", ("auto", "reference", "sdpa", "flex"))
        self.activation = _check_activation(activation)
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {describe(causal)}")
        self.causal = causal
        add_qkv_projections(self, d_model, bias=bias)

    def _project(self, x):
        return [split_heads(t, self.num_heads) for t in self.in_proj(x).chunk(3, dim=-1)]  # 3 × (B, H, n, d_h)

    def _prepare(self, x, key_padding_mask, cache):
        """Validate, project; with a cache, append the new keys/values. Returns
        (kpm of the new positions, q, k, v, key padding over all keys, q_offset, new cache)."""
        kpm = check_input(x, self.d_model, key_padding_mask)
        q, k, v = self._project(x)
        if cache is None:
            return kpm, q, k, v, kpm, 0, None
        cache = _check_cache(cache, x.shape[0], self.causal, type(self).__name__)
        offset = len(cache)
        new_cache = cache.extend(k, v, kpm)
        return kpm, q, new_cache.key, new_cache.value, new_cache.padding, offset, new_cache

    def _finish(self, out, kpm, maps, return_attention, cache):
        if self.activation == "relu":
            out = F.relu(out)
        out = zero_padding(self.out_proj(merge_heads(out)), kpm)  # (B, n, d_model)
        result = (out, maps) if return_attention else (out,)
        if cache is not None:
            result = result + (cache,)
        return result if len(result) > 1 else result[0]


@register_attention("dman", description="MAN dynamic mask attention: M = sigmoid(x_t W + P[t-s] + U_h) (Eq. 12)")
class DynamicMaskAttention(_MaskAttentionBase):
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
            incremental decoding with ``cache``.
        activation: ``F`` of Eq. 5 — ``None`` (identity) or ``"relu"`` (authors' code).
        bias: biases of the Q/K/V and output projections.

    ``forward(x, key_padding_mask=None, return_attention=False, *, cache=None)``: ``x`` ``(B, n, d)``;
    returns ``out`` (padded positions 0), ``(out, {"attention", "mask"})`` with ``return_attention``
    (both ``(B, H, n, m)``), and ``(…, new_cache)`` when a cache is passed.
    """

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 max_distance: int = 128, causal: bool = False, activation: str | None = None, bias: bool = True):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, activation=activation, bias=bias,
                         causal=causal)
        self.max_distance = check_positive_int(max_distance, "max_distance")
        self.mask_query = nn.Linear(d_model, 1, bias=False)  # W of Eq. 12
        self.distance_bias = nn.Parameter(torch.zeros(2 * max_distance + 1))  # P[t − s], index D + (t − s)
        self.head_bias = nn.Parameter(torch.zeros(num_heads))  # U[h]

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, max_distance={self.max_distance}, "
                f"causal={self.causal}, activation={self.activation}, backend={self.backend!r}")

    def _query_logit(self, x):
        return self.mask_query(x).squeeze(-1)  # (B, n, 1) -> (B, n): x_t W

    def dynamic_mask(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The mask ``M`` of Eq. 12 for input ``x`` ``(B, n, d)``: ``(B, H, n, n)`` in ``[0, 1]``; entries of
        padded keys (and future keys when ``causal``) are 0. Differentiable; plot it with ``imshow``."""
        kpm = check_input(x, self.d_model, key_padding_mask)
        return dynamic_mask(self._query_logit(x), self.distance_bias, self.head_bias, causal=self.causal,
                            key_padding_mask=kpm)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, return_attention: bool = False,
                *, cache: AttentionCache | None = None):
        kpm, q, k, v, key_pad, offset, cache = self._prepare(x, key_padding_mask, cache)
        a = self._query_logit(x)
        drop = self.dropout if self.training else 0.0
        maps = None
        if return_attention:
            out, probs, mask = _dman_reference(q, k, v, a, self.distance_bias, self.head_bias, self.causal, key_pad,
                                               offset, drop)
            maps = {"attention": probs, "mask": mask}
        else:
            out = dynamic_mask_attention(q, k, v, a, self.distance_bias, self.head_bias, causal=self.causal,
                                         key_padding_mask=key_pad, q_offset=offset, backend=self.backend,
                                         dropout_p=drop, training=self.training)
        return self._finish(out, kpm, maps, return_attention, cache)


RADIUS_MODES = ("sqrt",)


def _check_radius(radius):
    if isinstance(radius, str):
        if radius not in RADIUS_MODES:
            raise ValueError(f"radius must be a number >= 0 or 'sqrt' (b = sqrt(L)/2, MAN §4.2), got {radius!r}")
        return radius
    if isinstance(radius, bool) or not isinstance(radius, (int, float)) or math.isnan(radius):
        raise TypeError(f"radius must be a number >= 0 or 'sqrt', got {describe(radius)}")
    if radius < 0:
        raise ValueError(f"radius must be >= 0 or 'sqrt', got {radius}")
    return radius


@register_attention("sman", description="MAN static mask attention: attend within |t-s| <= b (Eq. 11)")
class StaticMaskAttention(_MaskAttentionBase):
    """Static Mask Attention Network (MAN Eq. 11, §4.2): ``SM[t, s] = 1`` if ``|t − s| <= b`` else 0.

    Args:
        radius: the boundary ``b`` — a number (SMAN₂ uses 4) or ``"sqrt"`` for ``b = sqrt(L)/2`` with
            ``L`` each sequence's own length (padding excluded; SMAN₁).
        causal: additionally hide future keys (decoder); enables ``cache`` (fixed ``radius`` only).
        dropout, backend, activation, bias: as :class:`DynamicMaskAttention`.

    With ``return_attention`` the maps are ``{"attention": (B, H, n, m), "mask": (B|1, 1, n, m)}``.
    """

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 radius: float | str = 4, causal: bool = False, activation: str | None = None, bias: bool = True):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, activation=activation, bias=bias,
                         causal=causal)
        self.radius = _check_radius(radius)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, radius={self.radius!r}, causal={self.causal}, "
                f"activation={self.activation}, backend={self.backend!r}")

    def static_mask(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """SM of Eq. 11 for ``x`` ``(B, n, d)`` as a float ``(B|1, 1, n, n)`` 0/1 tensor (padded keys 0)."""
        kpm = check_input(x, self.d_model, key_padding_mask)
        return self._allowed(x.shape[1], x.shape[1], 0, kpm, kpm, x.device).to(x.dtype)

    def _allowed(self, n, m, offset, kpm_new, key_pad, device):
        if self.radius == "sqrt":
            lengths = (~kpm_new).sum(-1) if kpm_new is not None else torch.full((1,), n, device=device)
            radius = lengths.to(torch.float64).sqrt() / 2  # (B,) or (1,): b = sqrt(L)/2
        else:
            radius = self.radius
        allowed = static_window_mask(n, m, radius=radius, q_offset=offset, device=device)  # (B|1, 1, n, m)
        if self.causal:
            t = torch.arange(offset, offset + n, device=device)[:, None]
            allowed = allowed & (torch.arange(m, device=device)[None, :] <= t)
        if key_pad is not None:
            allowed = allowed & ~key_pad[:, None, None, :]
        return allowed

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, return_attention: bool = False,
                *, cache: AttentionCache | None = None):
        if cache is not None and self.radius == "sqrt":
            raise ValueError("radius='sqrt' depends on the whole sequence length and cannot be decoded "
                             "incrementally; use a fixed radius with cache")
        kpm, q, k, v, key_pad, offset, cache = self._prepare(x, key_padding_mask, cache)
        drop = self.dropout if self.training else 0.0
        maps = None
        if (not return_attention and self.backend == "auto" and self.radius != "sqrt" and offset == 0
                and q.shape[2] == k.shape[2]):
            # a fixed band |t - s| <= b: the library's O(n·b) local path (CSAN's banded kernel / flex block
            # mask), never an n × n tensor
            b = math.floor(self.radius)
            out = banded_attention(q, k, v, (b, 0) if self.causal else b, key_padding_mask=key_pad, dropout_p=drop,
                                   training=self.training)
            return self._finish(out, kpm, maps, return_attention, cache)
        allowed = self._allowed(q.shape[2], k.shape[2], offset, kpm, key_pad, x.device)
        if return_attention:
            probs = mask_attention_weights(q, k, attn_mask=allowed)
            maps = {"attention": probs, "mask": allowed.to(q.dtype)}
            out = torch.matmul(F.dropout(probs, drop, training=True) if drop > 0 else probs, v)
        else:
            out = mask_attention(q, k, v, attn_mask=allowed, backend=self.backend, dropout_p=drop,
                                 training=self.training)
        return self._finish(out, kpm, maps, return_attention, cache)
