"""The mask attention function of Mask Attention Networks (Fan et al., NAACL 2021), MAN Eq. 4.

MAN multiplies the exponentiated scores by a mask ``M ∈ [0, 1]`` before normalising (Eq. 4)::

    S_M(Q, K)_ij = M_ij exp(q_i·k_j / √d_k) / Σ_l M_il exp(q_i·k_l / √d_k)
    A_M(Q, K, V) = S_M(Q, K) V

Because ``M_ij exp(s_ij) = exp(s_ij + log M_ij)``, the mask enters as an additive *log-weight bias* (a
weight of exactly 0 becomes ``-inf``: the key is excluded), so Eq. 4 runs on every backend of plain
attention (:mod:`.dot_product`). The all-ones mask gives plain attention (SAN, Eq. 6–7) and the identity
mask gives ``V`` (FFN, Eq. 8). DMAN's learned mask (Eq. 12) is :mod:`.dman`; SMAN's static mask (Eq. 11)
is a boolean band (:func:`maskattn.masks.window`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ArgumentError, ArgumentTypeError
from .. import backends
from ..validation import broadcastable, check_attn_mask, check_probability, check_qkv, checking, describe, entry_point
from ..kernels.flex import flex_attention_call
from ..masks import Mask, as_dense, predicate
from .dot_product import attention_weights, depends_on_batch, dot_product_attention, fused_attention, is_empty

__all__ = ["mask_attention", "mask_attention_reference", "mask_attention_weights", "log_weight_bias"]


def _check_mask_weights(mask_weights, target, device) -> torch.Tensor | None:
    """``mask_weights`` as a 4-D view, checked in the outermost entry point."""
    if mask_weights is None:
        return None
    if checking():
        _check_weight_values(mask_weights, target, device)
    while mask_weights.dim() < 4:
        mask_weights = mask_weights.unsqueeze(0)
    return mask_weights


def _check_weight_values(mask_weights, target, device) -> None:
    if not isinstance(mask_weights, torch.Tensor):
        raise ArgumentTypeError(f"mask_weights must be a float tensor with values in [0, 1], broadcastable to "
                        f"(batch, heads, queries, keys) = {target}, got {describe(mask_weights)}")
    if not mask_weights.is_floating_point():
        raise ArgumentTypeError(f"mask_weights must be a floating-point tensor with values in [0, 1], got dtype "
                        f"{mask_weights.dtype}; convert a bool mask with `.float()` or pass it as attn_mask")
    if not broadcastable(tuple(mask_weights.shape), target):
        raise ArgumentError(f"mask_weights has shape {tuple(mask_weights.shape)}, which does not broadcast to "
                         f"(batch, heads, queries, keys) = {target}")
    if mask_weights.device != device:
        raise ArgumentError(f"mask_weights is on {mask_weights.device} but q is on {device}")
    if mask_weights.numel() and not torch.compiler.is_compiling():  # a value check reads the tensor on the host
        w = mask_weights.detach()
        if not bool(((w >= 0) & (w <= 1)).all()):
            lo, hi = float(w.min()), float(w.max())
            raise ArgumentError(f"mask_weights must lie in [0, 1] (MAN Eq. 4: M_ij ∈ [0, 1]); got values in "
                             f"[{lo}, {hi}]" + (" (with NaN)" if bool(torch.isnan(w).any()) else ""))


def _validate(q, k, v, mask_weights, attn_mask):
    """``((B, H, n, m), mask_weights, attn_mask)`` (as 4-D views), checked in the outermost entry point."""
    target = check_qkv(q, k, v) if checking() else (*q.shape[:3], k.shape[2])
    mw = _check_mask_weights(mask_weights, target, q.device)
    if attn_mask is not None and not isinstance(attn_mask, Mask):
        if checking():
            attn_mask = check_attn_mask(attn_mask, "attn_mask", target)
            if attn_mask.device != q.device:
                raise ArgumentError(f"attn_mask is on {attn_mask.device} but q is on {q.device}")
        attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    return target, mw, attn_mask


def log_weight_bias(mask_weights: torch.Tensor) -> torch.Tensor:
    """``log M`` with ``log 0 = -inf``; a weight of exactly 0 passes no gradient (it is a hard
    exclusion, like a boolean mask), any weight ``> 0`` gets the exact gradient ``1 / M``."""
    tiny = torch.finfo(mask_weights.dtype).tiny
    return torch.where(mask_weights > 0, torch.log(mask_weights.clamp_min(tiny)),
                       torch.full((), float("-inf"), dtype=mask_weights.dtype, device=mask_weights.device))


def _admissible(mw: torch.Tensor, attn_mask, target) -> torch.Tensor:
    """(B|1, H|1, n, m) bool: keys with a positive weight that the structural mask allows."""
    B, H, n, m = target
    dense = as_dense(attn_mask, n, m, batch=B, heads=H, device=mw.device)
    return (mw > 0) if dense is None else (mw > 0) & dense


@entry_point
def mask_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_weights: torch.Tensor | None = None, *,
                   attn_mask: torch.Tensor | Mask | None = None, backend: str = "auto", dropout_p: float = 0.0,
                   training: bool = False) -> torch.Tensor:
    """Mask attention function ``A_M(Q, K, V) = S_M(Q, K) V`` of MAN Eq. 4.

    Args:
        q, k: ``(B, H, n, d_k)`` and ``(B, H, m, d_k)``; v: ``(B, H, m, d_v)``.
        mask_weights: ``M``, float in ``[0, 1]``, broadcastable to ``(B, H, n, m)`` (rows = queries);
            multiplies ``exp(q·k/√d_k)`` before normalisation. ``None`` is the all-ones mask (SAN).
        attn_mask: optional bool (``True`` = attend) broadcastable to ``(B, H, n, m)``, or a
            :class:`maskattn.masks.Mask` predicate.
        backend: ``"auto"``, ``"reference"``, ``"sdpa"`` or ``"flex"`` (flex: inference only on CPU).
        dropout_p, training: attention-probability dropout, applied when ``training``.

    Returns:
        ``(B, H, n, d_v)``. A weight of exactly 0 excludes the key; a row whose weights are all 0
        (or that has no allowed key) returns 0. The identity mask returns ``V`` (FFN, Eq. 8); the
        all-ones mask is plain scaled dot-product attention (SAN, Eq. 6).
    """
    target, mw, attn_mask = _validate(q, k, v, mask_weights, attn_mask)
    if checking():
        check_probability(dropout_p, "dropout_p")
    if mw is None or is_empty(q, k):
        return dot_product_attention(q, k, v, attn_mask, backend=backend, dropout_p=dropout_p, training=training)
    drop = dropout_p if training else 0.0
    admissible = _admissible(mw, attn_mask, target)
    chosen = backends.resolve("mask_attention", backend, backends.Situation.of(
        q, k, v, mw, dropout=drop > 0, batch_mask=depends_on_batch(admissible)))
    if chosen == "reference":
        probs = attention_weights(q, k, admissible, bias=log_weight_bias(mw))
        return torch.matmul(F.dropout(probs, drop, training=True) if drop > 0 else probs, v)
    log_m = torch.log(mw.clamp_min(torch.finfo(mw.dtype).tiny))  # finite; the excluded keys are masked apart
    if chosen == "flex":
        log_m = log_m.expand(target)
        B, H, n, m = target
        return flex_attention_call(q, k, v, score_mod=lambda s, b, h, qi, kv: s + log_m[b, h, qi, kv],
                                   mask=predicate(admissible, None, batch=B, heads=H, q_len=n, kv_len=m))
    return fused_attention(q, k, v, allowed=admissible, bias=log_m, dropout_p=drop)


@entry_point
def mask_attention_weights(q: torch.Tensor, k: torch.Tensor, mask_weights: torch.Tensor | None = None, *,
                           attn_mask: torch.Tensor | Mask | None = None) -> torch.Tensor:
    """The attention map ``S_M(Q, K)`` of Eq. 4, ``(B, H, n, m)`` (rows sum to 1, or 0 when empty)."""
    target, mw, attn_mask = _validate(q, k, k, mask_weights, attn_mask)
    if mw is None:
        return attention_weights(q, k, attn_mask)
    return attention_weights(q, k, _admissible(mw, attn_mask, target), bias=log_weight_bias(mw))


def eq4_float64(q, k, v, mask_weights, allowed=None):
    """Eq. 4 literally, in float64: explicit exp, multiply by M (None = all ones; 0 where ``allowed`` is
    False), normalise. Returns (out, S_M)."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, n, m)
    m_full = torch.ones_like(scores) if mask_weights is None else mask_weights.double().expand_as(scores)
    if allowed is not None:
        m_full = m_full * allowed
    admissible = m_full > 0
    shift = scores.masked_fill(~admissible, float("-inf")).amax(-1, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))  # any constant cancels
    numer = m_full * torch.exp((scores - shift).masked_fill(~admissible, 0.0))
    denom = numer.sum(-1, keepdim=True)
    empty = denom == 0  # no admissible key: 0 (a NaN denominator is not empty: NaN inputs give NaN)
    probs = torch.where(empty, torch.zeros_like(numer), numer / torch.where(empty, torch.ones_like(denom), denom))
    return torch.matmul(probs, v), probs


@entry_point
def mask_attention_reference(q, k, v, mask_weights=None, *, attn_mask=None) -> torch.Tensor:
    """MAN Eq. 4 written out in float64 (``M ⊙ exp(QKᵀ/√d_k)``, row-normalised, times ``V``) — the
    test oracle for :func:`mask_attention`. Returns a float64 ``(B, H, n, d_v)``."""
    (B, H, n, m), mw, attn_mask = _validate(q, k, v, mask_weights, attn_mask)
    return eq4_float64(q, k, v, mw, as_dense(attn_mask, n, m, batch=B, heads=H, device=q.device))[0]
