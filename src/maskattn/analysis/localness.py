"""Localness of attention maps (MAN §4.3, Eq. 13, Table 5).

``attn_s_{w,l} = 1/|D| Σ_{X_i ∈ D} 1/T_i Σ_{j ≤ T_i} Σ_{|k − j| ≤ w} s̄_i[j, k]`` — the attention mass a
query puts on keys within distance ``w`` of itself, averaged over the real tokens of a sentence and
then over the sentences, where ``s̄_i`` is the head-averaged attention map ``S_M(Q, K)`` of Eq. 4.
MAN Table 5 reports it in percent (multiply by 100).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import check_key_padding_mask, describe

__all__ = ["localness", "localness_per_sequence"]


def _check_window(window) -> int:
    if isinstance(window, bool) or not isinstance(window, int):
        raise ArgumentTypeError(f"window must be an int >= 0 (distance w of Eq. 13), got {describe(window)}")
    if window < 0:
        raise ArgumentError(f"window must be >= 0, got {window}")
    return window


def _as_batch(attention) -> torch.Tensor:
    """(B, H, n, n) | (B, n, n) | (n, n) → head-averaged (B, n, n)."""
    if not isinstance(attention, torch.Tensor) or not attention.is_floating_point():
        raise ArgumentTypeError(f"attention must be a float tensor of shape (batch, heads, n, n), (batch, n, n) or (n, n), "
                        f"got {describe(attention)}")
    if attention.dim() not in (2, 3, 4) or attention.shape[-1] != attention.shape[-2]:
        raise ArgumentError(f"attention must have shape (batch, heads, n, n), (batch, n, n) or (n, n) with square "
                         f"query × key maps, got {tuple(attention.shape)}")
    if attention.dim() == 4:
        attention = attention.mean(1)  # s̄: average over heads
    elif attention.dim() == 2:
        attention = attention[None]
    return attention


def localness_per_sequence(attention: torch.Tensor, window: int,
                           key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``1/T_i Σ_j Σ_{|k−j|≤w} s̄_i[j, k]`` for each sequence: a ``(B,)`` tensor (see :func:`localness`)."""
    w = _check_window(window)
    s = _as_batch(attention)  # (B, n, n)
    B, n, _ = s.shape
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, n, lambda: f"attention maps are {n} × {n} "
                                 f"for batch {B}")
    pos = torch.arange(n, device=s.device)
    near = (pos[:, None] - pos[None, :]).abs() <= w  # (n, n)
    mass = (s * near).sum(-1)  # (B, n): mass within the window, per query
    if kpm is None:
        return mass.mean(-1)
    real = (~kpm).to(s.dtype)
    mass = mass * real  # padded queries do not count
    return mass.sum(-1) / real.sum(-1).clamp_min(1.0)


def localness(attention: torch.Tensor | Sequence[torch.Tensor], window: int,
              key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Average attention mass within distance ``window`` of each query, MAN Eq. 13.

    Args:
        attention: maps ``S_M(Q, K)`` as ``(B, H, n, n)`` (averaged over heads), ``(B, n, n)`` or
            ``(n, n)``; or a sequence of such tensors (e.g. one per sentence, of different lengths),
            every sequence counting once.
        window: ``w >= 0``; key ``k`` counts for query ``j`` when ``|k − j| <= w``.
        key_padding_mask: ``(B, n)`` bool, True = padding, for a single batched tensor: padded
            queries are excluded, so ``T_i`` is each sequence's real length.

    Returns:
        A scalar tensor in ``[0, 1]`` for row-stochastic maps (Table 5 lists it × 100).
    """
    if isinstance(attention, torch.Tensor):
        return localness_per_sequence(attention, window, key_padding_mask).mean()
    if not isinstance(attention, Sequence) or not attention:
        raise ArgumentTypeError(f"attention must be a tensor or a non-empty sequence of tensors, got {describe(attention)}")
    if key_padding_mask is not None:
        raise ArgumentError("key_padding_mask applies to a single batched tensor; pass unpadded maps in a list instead")
    return torch.cat([localness_per_sequence(a, window) for a in attention]).mean()
