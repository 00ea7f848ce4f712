"""Scaled dot-product attention with a boolean structure (Vaswani et al. 2017; MAN Eq. 6–7's SAN) — the one
implementation of plain attention in the library.

``o_i = Σ_j softmax_j(q_i·k_j · scale + bias_ij | j allowed) v_j``, allowed = the mask (a
:class:`~maskattn.masks.Mask` or a bool tensor, True = attend) and not a padding key. A query with no
allowed key returns 0, with finite gradients. Multi-head attention, SAN, SMAN with a per-sentence radius,
encoder–decoder attention and every incremental decoding step run through :func:`dot_product_attention`;
MAN's Eq. 4 (:mod:`.mask_attention`) adds its ``log M`` through :func:`fused_attention`'s ``bias``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ArgumentError
from .. import backends
from ..validation import check_attn_mask, check_key_padding_mask, check_probability, check_qkv, checking, entry_point
from ..kernels.flex import flex_attention_call
from ..kernels.softmax import masked_softmax
from ..masks import Mask, allowed as allowed_pairs, predicate

__all__ = ["dot_product_attention", "dot_product_attention_reference", "attention_weights", "fused_attention",
           "zero_empty_rows", "is_empty", "empty_output", "depends_on_batch"]


def depends_on_batch(mask: Mask | torch.Tensor | None) -> bool:
    """Does ``mask`` (a :class:`~maskattn.masks.Mask`, a bool tensor or None) differ between the sequences of a
    batch?"""
    if isinstance(mask, Mask):
        return not mask.static
    return mask is not None and mask.shape[0] > 1


def is_empty(q: torch.Tensor, k: torch.Tensor) -> bool:
    """No query or no key: the kernels have nothing to do (and some would divide by zero)."""
    return q.numel() == 0 or k.shape[-2] == 0


def empty_output(q: torch.Tensor, v: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """The result of attention with no query or no key: zeros ``(B, H, n, d_v)``, still connected to every input
    so that backward runs (and gives zero gradients)."""
    out = q.new_zeros(*q.shape[:-1], v.shape[-1])
    for t in (q, v, *inputs):
        if t.requires_grad:
            out = out + t.sum() * 0
    return out


def zero_empty_rows(out: torch.Tensor, has_key: torch.Tensor | None) -> torch.Tensor:
    """``out`` with the rows where ``has_key`` (broadcastable bool, None = every row) is False set to 0."""
    if has_key is None:
        return out
    return torch.where(has_key, out, torch.zeros((), dtype=out.dtype, device=out.device))


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, allowed: torch.Tensor | None = None,
                    bias: torch.Tensor | None = None, dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with a bool structure ``allowed`` and/or an additive ``bias``, both
    broadcastable to (B, H, n, m); rows with no allowed key are 0. Such rows are opened up before the kernel
    (so no ``-inf``-only row produces NaN in forward or backward) and zeroed after it."""
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    has_key = allowed.any(-1, keepdim=True)
    safe = allowed | ~has_key
    if bias is None:
        mask = safe
    else:
        mask = bias.masked_fill(~safe, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return zero_empty_rows(out, has_key)


def _validate(q, k, v, mask, key_padding_mask, dropout_p):
    """``(mask, key_padding_mask)`` checked (a bool mask as a 4-D view) — in the outermost entry point only."""
    if not checking():
        return mask, key_padding_mask
    B, H, n, m = check_qkv(q, k, v)
    if mask is not None and not isinstance(mask, Mask):
        mask = check_attn_mask(mask, "mask", (B, H, n, m))
        if mask.device != q.device:
            raise ArgumentError(f"mask is on {mask.device} but q is on {q.device}")
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, m, lambda: f"k has batch {B} and {m} keys")
    check_probability(dropout_p, "dropout_p")
    return mask, kpm


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: Mask | torch.Tensor | None = None, *,
                      key_padding_mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                      scale: float | None = None) -> torch.Tensor:
    """The attention probabilities ``(B, H, n, m)`` (rows sum to 1, or 0 when a query has no allowed key),
    computed explicitly in the inputs' dtype: the reference backend and the maps of every module."""
    B, H, n, _ = q.shape
    m = k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, n, m)
    if bias is not None:
        scores = scores + bias
    return masked_softmax(scores, allowed_pairs(mask, key_padding_mask, n, m, batch=B, heads=H, device=q.device))


@entry_point
def dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | torch.Tensor | None = None,
                          *, key_padding_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                          training: bool = False, backend: str = "auto", scale: float | None = None) -> torch.Tensor:
    """Masked scaled dot-product attention.

    Args:
        q: ``(B, H, n, d_k)``; k: ``(B, H, m, d_k)``; v: ``(B, H, m, d_v)``.
        mask: a :class:`maskattn.masks.Mask` or a bool tensor broadcastable to ``(B, H, n, m)`` (True =
            attend); None attends everywhere.
        key_padding_mask: ``(B, m)`` bool, True = padding key (excluded).
        dropout_p, training: attention-probability dropout, applied when ``training``.
        backend: ``"auto"`` | ``"reference"`` | ``"sdpa"`` | ``"flex"`` (family ``dot_product`` of
            :data:`maskattn.backends.FAMILIES`).
        scale: score scale, default ``1/sqrt(d_k)``.

    Returns:
        ``(B, H, n, d_v)``; a query with no allowed key returns 0.
    """
    mask, kpm = _validate(q, k, v, mask, key_padding_mask, dropout_p)
    if is_empty(q, k):
        return empty_output(q, v, k)
    drop = dropout_p if training else 0.0
    chosen = backends.resolve("dot_product", backend, backends.Situation.of(
        q, k, v, dropout=drop > 0, batch_mask=kpm is not None or depends_on_batch(mask)))
    B, H, n, _ = q.shape
    m = k.shape[2]
    if chosen == "reference":
        probs = attention_weights(q, k, mask, key_padding_mask=kpm, scale=scale)
        return torch.matmul(F.dropout(probs, drop, training=True) if drop > 0 else probs, v)
    if chosen == "flex":  # FlexAttention returns 0 for a query with no allowed key
        return flex_attention_call(q, k, v, mask=predicate(mask, kpm, batch=B, heads=H, q_len=n, kv_len=m), scale=scale)
    allowed = allowed_pairs(mask, kpm, n, m, batch=B, heads=H, device=q.device)
    return fused_attention(q, k, v, allowed=allowed, dropout_p=drop, scale=scale)


@entry_point
def dot_product_attention_reference(q, k, v, mask=None, *, key_padding_mask=None, scale=None) -> torch.Tensor:
    """:func:`dot_product_attention` written out in float64 — the test oracle."""
    mask, kpm = _validate(q, k, v, mask, key_padding_mask, 0.0)
    probs = attention_weights(q.double(), k.double(), mask, key_padding_mask=kpm, scale=scale)
    return torch.matmul(probs, v.double())
