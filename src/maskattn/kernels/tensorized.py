"""MTSA's factorised attention (docs/design.md §1) with log-sigmoid token2token scores, in one autograd node.

``out = N / D`` with ``[N ; D] = (w ⊙ mask) @ [v ⊙ E ; E]``, ``w_ij = σ(R_ij)`` scaled per query row by
its largest allowed value (which cancels in the ratio and keeps rows of very negative scores exact) and
``E = exp(S − c)`` (:func:`source2token_weights`). Works block by block over the batch, so the augmented
values, the weights and their gradients only ever exist for one block; saves q, k, v, S (the caller's
tensors, no copies), the output and D; E and the weights are recomputed in backward. Half-precision inputs
are computed in float32; under ``torch.compile`` the same math runs as plain differentiable operations.
"""

from __future__ import annotations

import math

import torch

from .precision import in_working_precision
from .sigmoid import masked_sigmoid_attention, sigmoid_attention_backward, sigmoid_attention_forward

__all__ = ["fused_sigmoid_tensorized", "source2token_weights", "reliable_denominator", "FUSED_BLOCK_ELEMENTS"]

#: elements of the per-block working set (augmented values and their gradients) of the fused path.
FUSED_BLOCK_ELEMENTS = 1 << 18


def source2token_weights(s2t: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
    """``E_jl = exp(S_jl − c_l)`` with ``c_l`` the maximum over non-padding keys; padding keys (``pad``
    broadcastable to ``s2t``, True = padding) get exactly 0 and no gradient, whatever their score (the score
    is replaced before the exponential, so a padded key far above ``c`` cannot overflow into ``0 · inf``).
    ``c`` cancels in the ratio, so it carries no gradient."""
    if pad is not None:
        s2t = s2t.masked_fill(pad, float("-inf"))
    c = s2t.detach().amax(dim=-2, keepdim=True)
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    return torch.exp(s2t - c)


def reliable_denominator(denominator: torch.Tensor) -> torch.Tensor:
    """Denominators large enough that ``N / D`` keeps full precision (elsewhere: recompute exactly)."""
    info = torch.finfo(denominator.dtype)
    return denominator > info.tiny / info.eps


def _batch_blocks(batch: int, per_item: int) -> list[slice]:
    step = max(1, FUSED_BLOCK_ELEMENTS // max(1, per_item))
    return [slice(b0, min(batch, b0 + step)) for b0 in range(0, batch, step)]


def _batch_block(t: torch.Tensor | None, bs: slice) -> torch.Tensor | None:
    """Batch block of a tensor whose batch dimension may be broadcast (size 1)."""
    return None if t is None else t[bs] if t.shape[0] > 1 else t


class _FusedSigmoidTensorized(torch.autograd.Function):
    """Where D is too small to divide by, D is stored as ``inf``: the output there is 0 and so are its
    gradients (the caller recomputes those rows exactly). Returns (out, reliable)."""

    @staticmethod
    def forward(ctx, q, k, v, s2t, blocked, pad, scale):
        B, H, n, _ = q.shape
        m, d_v = v.shape[2], v.shape[3]
        # (B, n, H, d_v) memory seen as (B, H, n, d_v): merging the heads afterwards is a free view
        out = v.new_empty(B, n, H, d_v).transpose(1, 2)
        denominator = v.new_empty(B, H, n, d_v)
        for bs in _batch_blocks(B, H * max(n, m) * 2 * d_v):
            e = source2token_weights(s2t[bs], _batch_block(pad, bs))
            y = sigmoid_attention_forward(q[bs].contiguous(), k[bs].contiguous(), torch.cat([v[bs] * e, e], dim=-1),
                                          _batch_block(blocked, bs), scale, row_normalise=True)  # (b, H, n, 2 d_v)
            numerator, den = y.split(d_v, dim=-1)
            den = torch.where(reliable_denominator(den), den, torch.full_like(den, math.inf))
            denominator[bs] = den
            out[bs] = numerator / den
        ctx.save_for_backward(q, k, v, s2t, out, denominator,
                              blocked if blocked is not None else torch.empty(0),
                              pad if pad is not None else torch.empty(0))
        ctx.has_blocked, ctx.has_pad, ctx.scale = blocked is not None, pad is not None, scale
        reliable = torch.isfinite(denominator)
        ctx.mark_non_differentiable(reliable)
        return out, reliable

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, _grad_reliable):
        q, k, v, s2t, out, denominator, blocked, pad = ctx.saved_tensors
        blocked = blocked if ctx.has_blocked else None
        pad = pad if ctx.has_pad else None
        B, H, n, _ = q.shape
        m, d_v = v.shape[2], v.shape[3]
        grad_q, grad_k = torch.empty_like(q), torch.empty_like(k)
        grad_v, grad_s2t = torch.empty_like(v), torch.empty_like(s2t)
        for bs in _batch_blocks(B, H * max(n, m) * 2 * d_v):
            e = source2token_weights(s2t[bs], _batch_block(pad, bs))
            v_b = v[bs]
            grad_num = grad_out[bs] / denominator[bs]  # out = N / D: dN = g / D (0 where D = inf)
            grad_y = torch.cat([grad_num, -grad_num * out[bs]], dim=-1)  # dD = -g · out / D
            gq, gk, gx = sigmoid_attention_backward(grad_y, q[bs].contiguous(), k[bs].contiguous(),
                                                    torch.cat([v_b * e, e], dim=-1), _batch_block(blocked, bs),
                                                    ctx.scale, row_normalise=True)
            grad_ve, grad_e = gx.split(d_v, dim=-1)
            grad_q[bs], grad_k[bs] = gq, gk
            grad_v[bs] = grad_ve * e
            grad_s2t[bs] = (grad_ve * v_b + grad_e) * e  # dE/dS = E (0 on padding keys)
        return grad_q, grad_k, grad_v, grad_s2t, None, None, None


def _traceable(q, k, v, s2t, blocked, pad, scale):
    """The same function as plain differentiable operations (``torch.compile``)."""
    d_v = v.shape[-1]
    e = source2token_weights(s2t, pad)
    y = masked_sigmoid_attention(q, k, torch.cat([v * e, e], dim=-1), None if blocked is None else ~blocked, scale,
                                 row_normalise=True)
    numerator, denominator = y.split(d_v, dim=-1)
    reliable = reliable_denominator(denominator)
    out = torch.where(reliable, numerator / torch.where(reliable, denominator, torch.ones_like(denominator)), 0.0)
    return out, reliable


def fused_sigmoid_tensorized(q, k, v, s2t, blocked, pad, scale):
    """``(out, reliable)``: MTSA's output for log-sigmoid scores, q/k ``(B, H, n|m, d_k)``, v/s2t ``(B, H, m, d_v)``,
    ``blocked`` the inverted bool mask (True = excluded) broadcastable to (B, H, n, m) or None, ``pad`` ``(B, 1, m,
    1)`` True = padding key or None; ``reliable`` (non-differentiable) is False where the denominator underflowed
    and the output is 0."""
    if torch.compiler.is_compiling():
        return in_working_precision(_traceable, q, k, v, s2t, blocked=blocked, pad=pad, scale=scale)
    return in_working_precision(lambda q, k, v, s2t: _FusedSigmoidTensorized.apply(q, k, v, s2t, blocked, pad, scale),
                                q, k, v, s2t)
