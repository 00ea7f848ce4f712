"""Multi-head scaled dot-product attention (Vaswani et al., 2017) — the baseline of every paper here."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..backends import flex_attention_call, resolve_backend
from ..masks import Mask, as_dense, from_name
from ._common import (
    add_qkv_projections,
    check_choice,
    check_dims,
    check_input,
    check_probability,
    merge_heads,
    needs_grad,
    split_heads,
    zero_padding,
)
from .registry import register_attention


def scaled_dot_product_reference(q, k, v, allowed: torch.Tensor | None, dropout_p: float = 0.0):
    """Explicit softmax(q kᵀ/√d) v with a bool mask (True = attend); returns (output, probabilities).
    Rows with no allowed key give probability 0 and output 0."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, n, m)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if allowed is not None:
        probs = torch.where(allowed.any(-1, keepdim=True), probs, torch.zeros((), dtype=probs.dtype,
                                                                              device=probs.device))
    dropped = F.dropout(probs, dropout_p, training=True) if dropout_p > 0 else probs
    return torch.matmul(dropped, v), probs


@register_attention("mha", description="multi-head scaled dot-product attention (SDPA)")
class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product self-attention on ``F.scaled_dot_product_attention``.

    Args:
        d_model: input/output width; num_heads: heads (``d_model`` must divide evenly).
        dropout: attention-probability dropout. backend: ``auto`` | ``reference`` | ``sdpa`` | ``flex``.
        mask: an optional structural mask for every head (a :class:`~maskattn.masks.Mask` or a name
            such as ``"causal"``); ``None`` attends everywhere.
        bias: whether the projections have biases.
    """

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 mask: Mask | str | None = None, bias: bool = True):
        super().__init__()
        check_dims(d_model, num_heads)
        self.d_model, self.num_heads = d_model, num_heads
        self.dropout = check_probability(dropout, "dropout")
        self.backend = check_choice(backend, "backend", ("auto", "reference", "sdpa", "flex"))
        self.mask = from_name(mask) if mask is not None else None
        add_qkv_projections(self, d_model, bias=bias)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, return_attention: bool = False):
        """x: (B, n, d_model) → (B, n, d_model); with ``return_attention`` also ``{"attention": (B, H, n, n)}``."""
        kpm = check_input(x, self.d_model, key_padding_mask)
        B, n, _ = x.shape
        q, k, v = (split_heads(t, self.num_heads) for t in self.in_proj(x).chunk(3, dim=-1))  # (B, H, n, d_h)
        drop = self.dropout if self.training else 0.0
        backend = "reference" if return_attention else resolve_backend(
            self.backend, device=x.device, needs_grad=needs_grad(self, x), flex_ok=drop == 0.0, prefer_flex_on_cuda=False)
        allowed = as_dense(self.mask, n, n, batch=B, heads=self.num_heads, device=x.device)
        if kpm is not None:
            keep = ~kpm[:, None, None, :]  # (B, 1, 1, n)
            allowed = keep if allowed is None else allowed & keep
        maps = None
        if backend == "reference":
            out, probs = scaled_dot_product_reference(q, k, v, allowed, drop)
            maps = {"attention": probs}
        elif backend == "flex":
            out = flex_attention_call(q, k, v, mask=allowed)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=drop)
            if allowed is not None:  # rows with no allowed key are 0, whatever the kernel returns
                out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
        out = zero_padding(self.out_proj(merge_heads(out)), kpm)
        return (out, maps) if return_attention else out
