"""What every attention module shares: argument checks, head reshapes, the typed attention maps, the
incremental-decoding cache, and the module conventions (:class:`SelfAttention`).

Conventions (docs/design.md §4): ``Cls(d_model, num_heads, *, dropout=0.0, backend="auto", **options)``;
``forward(x, key_padding_mask=None) -> Tensor`` with ``x`` ``(B, n, d_model)`` and ``key_padding_mask``
``(B, n)`` bool, True = padding (outputs at padded positions are exactly 0);
``attention_maps(x, key_padding_mask=None) -> AttentionMaps`` computed by the reference math, so asking for
maps never changes which kernel trains the model; causal modules add
``step(x, cache, key_padding_mask=None) -> (Tensor, AttentionCache)`` for incremental decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import ClassVar

import torch
import torch.nn as nn

from ..errors import ArgumentError, ArgumentTypeError
from .. import backends
from ..validation import check_key_padding_mask, check_positive_int, check_probability, checking, describe

__all__ = ["SelfAttention", "AttentionMaps", "AttentionCache", "check_dims", "check_input", "split_heads",
           "merge_heads", "zero_padding", "qkv_projections", "split_qkv"]


def check_dims(d_model, num_heads, *, divisible: bool = True) -> tuple[int, int]:
    check_positive_int(d_model, "d_model")
    check_positive_int(num_heads, "num_heads")
    if divisible and d_model % num_heads:
        raise ArgumentError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
    return d_model, num_heads


def check_input(x, d_model: int, key_padding_mask, name: str = "x", mask_name: str = "key_padding_mask", *,
                module: torch.nn.Module | None = None):
    """Validate a module input ``x`` ``(B, n, d_model)`` and its ``(B, n)`` padding mask (True = padding) — in
    the outermost :func:`~maskattn.validation.entry_point` only; returns the padding mask. ``name`` and
    ``mask_name`` are the arguments' names in messages. With ``module``, ``x`` must have the dtype of its
    parameters unless autocast is on for ``x``'s device (a bfloat16 input to a float32 module is a mistake PyTorch
    reports deep inside, as a matmul's)."""
    if not checking():
        return key_padding_mask
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a tensor of shape (batch, seq_len, {d_model}), got {describe(x)}")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ArgumentError(f"{name} must have shape (batch, seq_len, {d_model}), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ArgumentTypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if module is not None:
        weight = next((p for p in module.parameters() if p.is_floating_point()), None)
        if weight is not None and weight.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
            raise ArgumentTypeError(f"{name} has dtype {x.dtype} but the {type(module).__name__}'s parameters are "
                                    f"{weight.dtype}; cast one to the other (module.to({x.dtype})) or run under "
                                    f"torch.autocast({x.device.type!r})")
    B, n, _ = x.shape
    what = "input" if name == "x" else name
    kpm = check_key_padding_mask(key_padding_mask, mask_name, B, n, lambda: f"{what} is {tuple(x.shape)}")
    if kpm is not None and kpm.device != x.device:
        raise ArgumentError(f"{mask_name} is on {kpm.device} but {name} is on {x.device}")
    return kpm


def qkv_projections(d_model: int, *, bias: bool) -> tuple[nn.Linear, nn.Linear]:
    """The standard fused ``in_proj`` (q, k, v) and ``out_proj`` of multi-head attention, Glorot-initialised
    with zero biases; shared so that MHA-style modules have identical parameters and ``state_dict`` keys."""
    in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
    out_proj = nn.Linear(d_model, d_model, bias=bias)
    nn.init.xavier_uniform_(in_proj.weight)
    if bias:
        nn.init.zeros_(in_proj.bias)
        nn.init.zeros_(out_proj.bias)
    return in_proj, out_proj


def split_qkv(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head ``q, k, v`` ``(B, H, n, d_h)`` of a fused projection ``(B, n, 3·d)``."""
    q, k, v = qkv.chunk(3, dim=-1)  # (B, n, 3·d) -> 3 × (B, n, d)
    return split_heads(q, num_heads), split_heads(k, num_heads), split_heads(v, num_heads)


def split_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    B, n, d = t.shape
    return t.view(B, n, num_heads, d // num_heads).transpose(1, 2)  # (B, n, d) -> (B, H, n, d/H)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    B, H, n, d_h = t.shape
    return t.transpose(1, 2).reshape(B, n, H * d_h)  # (B, H, n, d_h) -> (B, n, H·d_h)


def zero_padding(out: torch.Tensor, kpm) -> torch.Tensor:
    """Outputs at padded positions are exactly 0."""
    if kpm is None:
        return out
    return out.masked_fill(kpm.unsqueeze(-1), 0.0)


@dataclass(frozen=True)
class AttentionMaps:
    """The maps of one attention call, for plots and analysis (every module's :meth:`attention_maps`).

    ``attention``: the weight each query puts on each key — ``(B, H, n, m)`` for multi-head attention,
    DMAN, SMAN, CSAN 1D and MTSA / Fast-DiSA (their token2token probabilities ``softmax_j(σ_t(R_ij) +
    M_ij)``); ``(B, H, n, H, n)`` for CSAN 2D (``[b, h, i, g, j]``: query ``i`` of head ``h`` on key ``j``
    of head ``g``); ``(B, H, n, n, d_h)`` for DiSA (feature-wise). ``mask``: MAN's mask ``M`` — DMAN's
    ``(B, H, n, m)`` in [0, 1], SMAN's ``(B|1, 1, n, m)`` 0/1 — else None. ``source2token``: MTSA /
    Fast-DiSA's feature-wise source2token weights ``softmax_j(S_jl)`` ``(B, H, m, d_h)``, else None.
    """

    attention: torch.Tensor
    mask: torch.Tensor | None = None
    source2token: torch.Tensor | None = None

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> AttentionMaps:
        """The maps with ``fn`` applied to every tensor (e.g. ``lambda t: t[0].cpu()``)."""
        return replace(self, **{f.name: fn(getattr(self, f.name)) for f in fields(self)
                                if getattr(self, f.name) is not None})

    def items(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the maps that are present."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]


@dataclass(frozen=True)
class AttentionCache:
    """Keys and values of the positions decoded so far, for causal incremental self-attention.

    ``key``/``value``: ``(B, H, t, d_h)`` (``None`` before the first step); ``padding``: ``(B, t)``
    bool, True = padding, or ``None`` when no cached position is padding. Immutable: ``step`` returns a
    new cache. ``len(cache)`` is the number of cached positions ``t`` — the absolute position of the next
    query.
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
        if self.key is None or self.value is None:
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
        if self.key is None or self.value is None:
            return self
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in (torch.long, torch.int):
            raise ArgumentTypeError(f"index must be a 1-D integer tensor of batch rows, got {describe(index)}")
        index = index.to(self.key.device)
        pad = None if self.padding is None else self.padding.index_select(0, index)
        return AttentionCache(self.key.index_select(0, index), self.value.index_select(0, index), pad)


class SelfAttention(nn.Module):
    """Base of the registered self-attention modules: stores ``d_model``, ``num_heads``, ``dropout`` and
    ``backend`` (validated against the module's kernel ``family`` in :data:`maskattn.backends.FAMILIES`).
    Subclasses implement :meth:`forward` and :meth:`attention_maps`; causal ones :meth:`step`."""

    #: the kernel family of :data:`maskattn.backends.FAMILIES` that runs this mechanism
    family: ClassVar[str]

    def __init__(self, d_model: int, num_heads: int, *, dropout: float, backend: str, divisible: bool = True):
        super().__init__()
        check_dims(d_model, num_heads, divisible=divisible)
        self.d_model, self.num_heads = d_model, num_heads
        self.dropout = check_probability(dropout, "dropout")
        self.backend = backends.check_backend(backend, self.family)

    @property
    def causal(self) -> bool:
        """Whether queries see only keys at positions ``<=`` their own (decoder self-attention)."""
        return False

    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionMaps:
        raise NotImplementedError

    def init_cache(self) -> AttentionCache:
        """An empty incremental-decoding cache (causal modules only)."""
        self._check_causal("init_cache")
        return AttentionCache()

    def step(self, x: torch.Tensor, cache: AttentionCache,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, AttentionCache]:
        """One incremental-decoding step: ``x`` ``(B, n_new, d)`` holds the new positions, ``cache`` the keys and
        values of the earlier ones; returns ``(out, new cache)``, equal to the full causal forward's outputs at
        those positions."""
        raise ArgumentTypeError(f"{type(self).__name__} has no incremental decoding; decoder self-attention must be a causal "
                        "mha, dman or sman")

    def _check_causal(self, what: str) -> None:
        if not self.causal:
            option = "mask='causal'" if self.family == "dot_product" else "causal=True"
            raise ArgumentError(f"{what} (incremental decoding) needs a causal {type(self).__name__}; construct it with "
                             f"{option}")

    def _step_inputs(self, x: torch.Tensor, cache: AttentionCache, key_padding_mask: torch.Tensor | None):
        """A decoding step's checked inputs: ``(kpm, q, cache extended by the new keys/values, offset)``, where
        ``offset`` is the absolute position of the first new query (uses ``self.project``)."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        cache = self._check_cache(cache, x.shape[0])
        q, k, v = self.project(x)
        return kpm, q, cache.extend(k, v, kpm), len(cache)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The per-head projections of ``x`` ``(B, n, d_model)``: ``q, k, v`` ``(B, H, n, d_h)`` (MTSA adds its
        source2token scores ``S``)."""
        raise NotImplementedError

    def _check_cache(self, cache, batch: int) -> AttentionCache:
        if not isinstance(cache, AttentionCache):
            raise ArgumentTypeError(f"cache must be a maskattn.AttentionCache (start with module.init_cache()), got "
                            f"{describe(cache)}")
        self._check_causal("step")
        if cache.batch_size is not None and cache.batch_size != batch:
            raise ArgumentError(f"cache holds batch size {cache.batch_size} but the input has batch size {batch}; "
                             "reorder the cache with cache.reorder(index) after changing the batch")
        return cache
