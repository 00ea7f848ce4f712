"""Local (windowed) self-attention: CSAN 1D / 2D and a banded kernel whose cost grows with n·window.

CSAN (Yang et al., NAACL 2019) restricts the query ``q_i^h`` of head ``h`` to the keys and values of a
window of ``M + 1`` positions centred on ``i`` (Eq. 4–6)::

    K̂^h = {k^h_{i-M/2}, …, k^h_i, …, k^h_{i+M/2}}                  (4)
    V̂^h = {v^h_{i-M/2}, …, v^h_i, …, v^h_{i+M/2}}                  (5)
    o^h_i = Att(q^h_i, K̂^h) V̂^h                                     (6)

and, in 2D, to the union of those windows over the ``N + 1`` heads centred on ``h`` (Eq. 7–9)::

    K̃^h = ∪[K̂^{h-N/2}, …, K̂^h, …, K̂^{h+N/2}]                       (7)
    Ṽ^h = ∪[V̂^{h-N/2}, …, V̂^h, …, V̂^{h+N/2}]                       (8)
    o^h_i = Att(q^h_i, K̃^h) Ṽ^h                                     (9)

with ONE softmax over the whole ``(N+1) × (M+1)`` area. Windows are truncated at the sequence edges;
the head area is truncated at the first and last heads (``head_edges="truncate"``, the paper) or
wraps around for keys *and* values (``head_edges="circular"``). The authors' code wraps the keys but
not the values; that mismatched form is deliberately not offered.

Backends (``backend=``; family ``local`` of :data:`maskattn.backends.FAMILIES`):

* ``"triton"``    — the fused band kernel of :mod:`maskattn.kernels.triton.band` (FlashAttention-2 over the
  band and the head area; CUDA).
* ``"banded"``    — the O(n · window) band kernel of :mod:`maskattn.kernels.banded`, forward *and*
  backward; no ``n × n`` tensor exists. CPU and GPU.
* ``"flex"``      — FlexAttention with a block mask that skips empty blocks (O(n · window) on CUDA;
  eager and inference-only on CPU).
* ``"sdpa"``      — dense masked ``F.scaled_dot_product_attention`` (O(n²); the baseline).
* ``"reference"`` — the explicit gathered-keys form of docs/design.md §1: keys of heads ``h−N/2 … h+N/2``
  stacked along the key axis (``(B, H, n, (N+1)·n)`` scores), float64-capable; the specification.
* ``"auto"``      — ``triton`` on CUDA, ``banded`` elsewhere (:data:`maskattn.backends.FAMILIES`).

:func:`banded_attention` is the same band kernel for any static local mask of the library (SMAN's
radius, MTSA window heads): softmax attention over ``i − left ≤ j ≤ i + right`` with an optional
elementwise ``score_mod`` applied to the scaled score before the softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..errors import ArgumentError, ArgumentTypeError
from .. import backends
from ..validation import check_choice, check_key_padding_mask, check_probability, check_qkv, checking, describe, entry_point
from ..kernels.banded import banded_kernel, gather_heads
from ..kernels.flex import flex_attention_call
from ..kernels.triton.band import band_triton
from ..kernels.softmax import masked_softmax
from ..masks import Mask, band as band_mask
from .dot_product import empty_output, fused_attention, is_empty

HEAD_EDGES = ("truncate", "circular")

ScoreMod = Callable[[torch.Tensor], torch.Tensor]

__all__ = [
    "local_attention",
    "local_attention_maps",
    "banded_attention",
    "check_window",
    "check_head_window",
    "check_radius",
    "HEAD_EDGES",
]


# --------------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------------

def check_window(window, name: str = "window") -> int:
    """An odd positive int ``M + 1`` (the number of positions centred on the query)."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise ArgumentTypeError(f"{name} must be an odd positive int (M+1 positions centred on the query), "
                        f"got {describe(window)}")
    if window < 1 or window % 2 == 0:
        raise ArgumentError(f"{name} must be an odd positive int (M+1 positions centred on the query), got {window}")
    return window


def check_head_window(head_window, num_heads: int) -> int:
    """An odd positive int ``N + 1`` no larger than ``num_heads``."""
    check_window(head_window, "head_window")
    if head_window > num_heads:
        raise ArgumentError(f"head_window ({head_window}) must not exceed the number of heads ({num_heads}); "
                         "CSAN's area spans N+1 <= H heads")
    return head_window


def check_radius(radius) -> tuple[int, int]:
    """A band radius as ``(left, right)``: an int ``r >= 0`` means ``(r, r)``."""
    pair = radius if isinstance(radius, tuple) else (radius, radius)
    if len(pair) != 2 or any(isinstance(r, bool) or not isinstance(r, int) for r in pair):
        raise ArgumentTypeError(f"radius must be an int >= 0 or a tuple (left, right) of ints >= 0, got {describe(radius)}")
    if pair[0] < 0 or pair[1] < 0:
        raise ArgumentError(f"radius must be >= 0 (|i - j| <= radius), got {radius}")
    return pair


def _check_inputs(q, k, v, key_padding_mask):
    """The key padding mask, the inputs checked in the outermost entry point only."""
    if not checking():
        return key_padding_mask
    B, H, n, _ = check_qkv(q, k, v, self_attention=True)
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, n, lambda: f"q has batch {B} and {n} positions")
    if kpm is not None and kpm.device != q.device:
        raise ArgumentError(f"key_padding_mask is on {kpm.device} but q is on {q.device}")
    return kpm


def _check_scale(scale, d_k: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ArgumentError(f"scale must be a positive float or None (1/sqrt(d_k)), got {describe(scale)}")
    return float(scale)


# --------------------------------------------------------------------------------------------------
# the head area of CSAN 2D (Eq. 7–8)
# --------------------------------------------------------------------------------------------------

def head_area(num_heads: int, head_window: int, head_edges: str,
              device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(index, valid)``: head ``h``'s area holds heads ``index[h, a]`` (offsets ``−N/2 … N/2``), both
    ``(H, head_window)``; ``valid`` is False where a truncated area falls off the head axis. ``index`` is
    None for CSAN 1D (each head on its own) and ``valid`` None when every entry exists."""
    if head_window == 1:
        return None, None
    offsets = torch.arange(head_window, device=device) - head_window // 2  # (A,)
    source = torch.arange(num_heads, device=device)[:, None] + offsets[None, :]  # (H, A)
    if head_edges == "circular":
        return source % num_heads, None
    return source.clamp(0, num_heads - 1), (source >= 0) & (source < num_heads)


def _gathered(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """The keys (or values) of every head's area side by side along the key axis: (B, H, A·n, d)."""
    B, H, n, d = t.shape
    area = gather_heads(t, index)  # (B, H, A, n, d)
    return area.reshape(B, H, area.shape[2] * n, d)


def _area_allowed(n, left, right, index, valid, kpm, device) -> torch.Tensor:
    """(B|1, H|1, n, A·n) bool for the gathered-keys form: the band on the key position, valid area heads,
    non-padding keys."""
    A = 1 if index is None else index.shape[1]
    allowed = band_mask(left, right).materialize(n, device=device)[:, :, :, None, :]  # (1, 1, n, 1, n)
    if valid is not None:
        allowed = allowed & valid[None, :, None, :, None]  # (1, H, n, A, n)
    if kpm is not None:
        allowed = allowed & ~kpm[:, None, None, None, :]  # (B, H|1, n, A|1, n)
    allowed = allowed.expand(*allowed.shape[:3], A, n)
    return allowed.reshape(*allowed.shape[:3], A * n)


# --------------------------------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------------------------------

def _reference(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop):
    """The gathered-keys form (docs/design.md §1): keys of the area heads stacked along the key axis, the
    band applied on ``kv_idx mod n``, one softmax over the (N+1)·n keys. Returns (out, probs) with probs
    ``(B, H, n, A·n)``."""
    scores = torch.matmul(q, _gathered(k, index).transpose(-1, -2)) * scale  # (B, H, n, A·n)
    if score_mod is not None:
        scores = score_mod(scores)
    probs = masked_softmax(scores, _area_allowed(q.shape[2], left, right, index, valid, kpm, q.device))
    dropped = F.dropout(probs, drop, training=True) if drop > 0 else probs
    return torch.matmul(dropped, _gathered(v, index)), probs


def _sdpa(q, k, v, left, right, index, valid, kpm, scale, drop):
    allowed = _area_allowed(q.shape[2], left, right, index, valid, kpm, q.device)
    return fused_attention(q, _gathered(k, index), _gathered(v, index), allowed=allowed, dropout_p=drop, scale=scale)


def _flex(q, k, v, left, right, index, valid, kpm, scale, score_mod):
    B, H, n, _ = q.shape
    A = 1 if index is None else index.shape[1]
    keep = None if kpm is None else (~kpm).repeat(1, A)  # (B, A·n): key slot kv_idx is position kv_idx mod n
    truncated = valid is not None  # the area of an edge head stops at the head axis (CSAN 2D, "truncate")
    # every integer the predicate uses is a plain captured value, never an expression of them (-left, A // 2):
    # compiled with dynamic shapes, they become symbols, and torch 2.11's CUDA lowering of flex cannot take a
    # captured symbolic *expression* as a mask buffer (ShapeAsConstantBuffer has no dtype)
    lowest, half, past_last = -left, A // 2, H + A // 2

    def mask_mod(b, h, q_idx, kv_idx):
        j = kv_idx % n
        rel = j - q_idx
        ok = (rel >= lowest) & (rel <= right)
        if keep is not None:
            ok = ok & keep[b, kv_idx]
        if truncated:
            # key slot a = kv_idx // n holds head h + a − A/2, which exists when kv_idx lies in [(A/2 − h)·n,
            # (H + A/2 − h)·n); written arithmetically and through torch.where (Inductor's CPU code for a captured
            # table, or for `&` with this comparison, does not compile in torch 2.13)
            ok = torch.where((kv_idx >= (half - h) * n) & (kv_idx < (past_last - h) * n), ok, False)
        return ok

    key = ("csan", left, right, H, A, truncated) + (() if kpm is None else (id(kpm),))
    mask = Mask(mask_mod, f"band({left}, {right}) x heads", static=kpm is None, cache_key=key)
    mod = None if score_mod is None else (lambda s, b, h, q_idx, kv_idx: score_mod(s))
    return flex_attention_call(q, _gathered(k, index), _gathered(v, index), score_mod=mod, mask=mask, scale=scale)


def _dispatch(q, k, v, left, right, index, valid, kpm, *, scale, score_mod, dropout_p, training, backend):
    if is_empty(q, k):
        return empty_output(q, v, k)
    if not torch.compiler.is_compiling():
        # a band wider than the sequence covers it all: clipped to n − 1 on each side, it costs what full attention
        # costs at this length, whatever the window or radius (the band kernels size their work by the band). Not
        # under torch.compile: there the length is a symbol, and a band that depends on it would make the tiling
        # (and so the graph) specialise on every length (docs/design.md §3)
        n = q.shape[2]
        left, right = min(left, n - 1), min(right, n - 1)
    drop = dropout_p if training else 0.0
    kind = None if score_mod is None else "logsigmoid" if score_mod is F.logsigmoid else "other"
    chosen = backends.resolve("local", backend, backends.Situation.of(
        q, k, v, dropout=drop > 0, band=True, batch_mask=kpm is not None, score_mod=kind))
    if chosen == "triton":
        return band_triton(q, k, v, left, right, index, valid, kpm, scale, score_mod is not None, drop)
    if chosen == "banded":
        return banded_kernel(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop)
    if chosen == "reference":
        return _reference(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop)[0]
    if chosen == "flex":
        return _flex(q, k, v, left, right, index, valid, kpm, scale, score_mod)
    return _sdpa(q, k, v, left, right, index, valid, kpm, scale, drop)


# --------------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------------

@entry_point
def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, radius: int | tuple[int, int], *,
                     score_mod: ScoreMod | None = None, key_padding_mask: torch.Tensor | None = None,
                     scale: float | None = None, dropout_p: float = 0.0, training: bool = False,
                     backend: str = "auto") -> torch.Tensor:
    """Softmax attention over the band ``|i − j| ≤ radius`` in O(n · radius) time and memory.

    ``o_i = Σ_j softmax_j(score_mod(q_i·k_j · scale) | j allowed) v_j`` with ``j`` allowed when
    ``i − left ≤ j ≤ i + right`` and key ``j`` is not padding. This is the static local mask of the whole
    library (CSAN Eq. 4–6; MAN's SMAN, MAN Eq. 11; MTSA window heads with ``score_mod=F.logsigmoid``),
    computed without an ``n × n`` tensor on the ``banded`` and ``flex`` backends.

    Args:
        q, k: ``(B, H, n, d_k)``; v: ``(B, H, n, d_v)`` (self-attention: one length ``n``).
        radius: an int ``r >= 0`` (``|i − j| <= r``) or ``(left, right)`` for an asymmetric band
            ``i − left <= j <= i + right`` (e.g. ``(r, 0)``: causal local attention). A radius beyond
            the sequence covers it all.
        score_mod: an elementwise function of the scaled score applied before the softmax, e.g.
            ``torch.nn.functional.logsigmoid`` (MTSA's ``σ_t``); None = identity.
        key_padding_mask: ``(B, n)`` bool, ``True`` = padding key (excluded).
        scale: score scale; None = ``1/sqrt(d_k)``.
        dropout_p, training: dropout on the attention probabilities, applied when ``training``.
        backend: ``"auto"`` | ``"triton"`` | ``"banded"`` | ``"flex"`` | ``"sdpa"`` (dense; no score_mod) |
            ``"reference"``.

    Returns:
        ``(B, H, n, d_v)``; rows with no allowed key (all keys in the band are padding) are 0.
    """
    kpm = _check_inputs(q, k, v, key_padding_mask)
    if checking():
        left, right = check_radius(radius)
        if score_mod is not None and not callable(score_mod):
            raise ArgumentTypeError(f"score_mod must be a callable (elementwise on the scaled score) or None, got "
                            f"{describe(score_mod)}")
        check_probability(dropout_p, "dropout_p")
    else:
        left, right = radius if isinstance(radius, tuple) else (radius, radius)
    return _dispatch(q, k, v, left, right, None, None, kpm, scale=_check_scale(scale, q.shape[-1]),
                     score_mod=score_mod, dropout_p=dropout_p, training=training, backend=backend)


def _local_args(q, k, v, window, head_window, key_padding_mask, head_edges, scale):
    kpm = _check_inputs(q, k, v, key_padding_mask)
    if checking():
        check_window(window)
        check_head_window(head_window, q.shape[1])
        check_choice(head_edges, "head_edges", HEAD_EDGES)
    index, valid = head_area(q.shape[1], head_window, head_edges, q.device)
    return kpm, window // 2, index, valid, _check_scale(scale, q.shape[-1])


@entry_point
def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int = 11, head_window: int = 1,
                    key_padding_mask: torch.Tensor | None = None, head_edges: str = "truncate",
                    scale: float | None = None, dropout_p: float = 0.0, training: bool = False,
                    backend: str = "auto") -> torch.Tensor:
    """Convolutional self-attention, CSAN Eq. 4–6 (1D) and Eq. 7–9 (2D).

    Args:
        q, k: ``(B, H, n, d_k)``; v: ``(B, H, n, d_v)``.
        window: ``M + 1``, odd: the positions ``|i − j| <= M/2`` centred on the query, truncated at the
            sequence edges (a window wider than the sequence covers all of it). Default 11 (paper).
        head_window: ``N + 1``, odd, ``<= H``: the heads ``h − N/2 … h + N/2`` whose windows form the
            query's area (Eq. 7–8); one softmax over the whole area (Eq. 9). 1 = CSAN 1D.
        key_padding_mask: ``(B, n)`` bool, ``True`` = padding key (excluded in every head).
        head_edges: ``"truncate"`` (paper: the area stops at the first/last head) or ``"circular"``
            (keys and values of heads wrap around together).
        scale: score scale; None = ``1/sqrt(d_k)``.
        dropout_p, training: dropout on the attention probabilities, applied when ``training``.
        backend: ``"auto"`` | ``"triton"`` | ``"banded"`` | ``"flex"`` | ``"sdpa"`` | ``"reference"`` (module
            docstring).

    Returns:
        ``(B, H, n, d_v)``; a query whose area holds only padding returns 0.
    """
    kpm, r, index, valid, scale = _local_args(q, k, v, window, head_window, key_padding_mask, head_edges, scale)
    if checking():
        check_probability(dropout_p, "dropout_p")
    return _dispatch(q, k, v, r, r, index, valid, kpm, scale=scale, score_mod=None, dropout_p=dropout_p,
                     training=training, backend=backend)


@entry_point
def local_attention_maps(q: torch.Tensor, k: torch.Tensor, *, window: int = 11, head_window: int = 1,
                         key_padding_mask: torch.Tensor | None = None, head_edges: str = "truncate",
                         scale: float | None = None) -> torch.Tensor:
    """The attention probabilities of :func:`local_attention` (explicit form, for plots and tests).

    Returns ``(B, H, n, H, n)``: ``maps[b, h, i, g, j]`` is the weight query ``i`` of head ``h`` puts on
    key ``j`` of head ``g``; each row ``maps[b, h, i]`` sums to 1 over ``(g, j)`` (0 for a query whose
    area holds only padding). For CSAN 1D only ``g == h`` is non-zero; ``maps.diagonal(dim1=1, dim2=3)``
    gives the usual ``(B, n, n, H)`` per-head maps.
    """
    kpm, r, index, valid, scale = _local_args(q, k, k, window, head_window, key_padding_mask, head_edges, scale)
    _, probs = _reference(q, k, k, r, r, index, valid, kpm, scale, None, 0.0)  # (B, H, n, A·n)
    B, H, n, _ = q.shape
    probs = probs.view(B, H, n, 1 if index is None else index.shape[1], n)  # (B, H, n, A, n)
    if index is None:  # 1D: the area of head h is head h
        index = torch.arange(H, device=q.device)[:, None]
    one_hot = F.one_hot(index, H).to(probs.dtype)  # (H, A, H): area slot a of head h is head g
    if valid is not None:
        one_hot = one_hot * valid[..., None].to(probs.dtype)
    return torch.einsum("bhiaj,hag->bhigj", probs, one_hot)
