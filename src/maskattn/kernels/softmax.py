"""Softmax restricted to allowed entries — the one masked softmax of the library's explicit paths."""

from __future__ import annotations

import torch

__all__ = ["masked_softmax"]


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor | None, dim: int = -1) -> torch.Tensor:
    """Softmax of ``scores`` over ``dim`` restricted to ``allowed`` (bool, broadcastable; None = all).

    A row with no allowed entry gives 0, with finite gradients (its scores are replaced by 0 before the
    softmax and the result is zeroed), so no NaN reaches autograd. Branch-free: no host synchronisation."""
    if allowed is None:
        return torch.softmax(scores, dim=dim)
    row_any = allowed.any(dim, keepdim=True)
    fill = torch.where(row_any, float("-inf"), 0.0).to(scores.dtype)
    probs = torch.softmax(torch.where(allowed, scores, fill), dim=dim)
    return probs * row_any
