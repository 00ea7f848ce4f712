"""Blocked sigmoid attention: ``(sigmoid(scale · q kᵀ) ⊙ mask) @ x`` without keeping the ``n × m`` weights.

MTSA's token2token score is ``log σ(R)``, and ``softmax_j(log σ(R_ij)) ∝ σ(R_ij)``: in the factorised form
(docs/design.md §1) the row normalisation cancels, so the fast path is a plain product with the sigmoid
weights. Forward and backward walk (batch block × query block) tiles of at most :data:`CHUNK_ELEMENTS`
weights; backward rebuilds each tile's weights from q and k (one extra ``q kᵀ``), as FlashAttention does.
"""

from __future__ import annotations

import torch

from .random import keep_mask, new_seed, seeded_generator

__all__ = ["masked_sigmoid_attention", "sigmoid_attention_forward", "sigmoid_attention_backward", "CHUNK_ELEMENTS",
           "QUERY_CHUNK"]

#: elements of one (batch-block × heads × query-chunk × keys) weight tile; bounds the kernel's workspace.
CHUNK_ELEMENTS = 1 << 21
#: query rows per tile: batched matmuls over few rows are slow on CPU, so keep tiles tall.
QUERY_CHUNK = 256


def _tiles(batch: int, heads: int, q_len: int, kv_len: int):
    """(batch slice, query slice) pairs covering the output, each tile ≤ CHUNK_ELEMENTS weights."""
    rows = min(q_len, QUERY_CHUNK)
    per_batch = heads * rows * kv_len
    batch_step = max(1, CHUNK_ELEMENTS // max(1, per_batch))
    if batch_step == 1:
        rows = max(1, min(rows, CHUNK_ELEMENTS // max(1, heads * kv_len)))
    for b0 in range(0, batch, batch_step):
        for i0 in range(0, q_len, rows):
            yield slice(b0, min(batch, b0 + batch_step)), slice(i0, min(q_len, i0 + rows))


def _blocked_tile(blocked, bs, rs):
    """The tile of the (possibly batch-broadcast) inverted mask."""
    if blocked is None:
        return None
    return blocked[bs if blocked.shape[0] > 1 else slice(None), :, rs]


def _sigmoid_weights(q_tile, k_tile, blocked, scale):
    a = torch.matmul(q_tile, k_tile.transpose(-1, -2)).mul_(scale).sigmoid_()
    if blocked is not None:
        a = a.masked_fill_(blocked, 0.0)
    return a


def sigmoid_attention_forward(q, k, x, blocked, scale, n_drop=0, drop_p=0.0, seed=0):
    """Forward of ``(sigmoid(scale · q kᵀ) ⊙ ~blocked) @ x``; ``blocked`` is the inverted bool mask (True =
    excluded) or None. The first ``n_drop`` columns of x see the weights after dropout. Returns (B, H, n, d_x)."""
    B, H, n, _ = q.shape
    out = q.new_empty(B, H, n, x.shape[-1])
    gen = seeded_generator(q.device, seed) if drop_p > 0 else None
    for bs, rs in _tiles(B, H, n, k.shape[-2]):
        a = _sigmoid_weights(q[bs, :, rs], k[bs], _blocked_tile(blocked, bs, rs), scale)  # (b, H, r, m)
        if gen is None:
            out[bs, :, rs] = torch.matmul(a, x[bs])
        else:
            keep = keep_mask(a, drop_p, gen)
            out[bs, :, rs, :n_drop] = torch.matmul(a * keep, x[bs, ..., :n_drop])
            out[bs, :, rs, n_drop:] = torch.matmul(a, x[bs, ..., n_drop:])
    return out


def sigmoid_attention_backward(grad_out, q, k, x, blocked, scale, needs=(True, True, True), n_drop=0,
                               drop_p=0.0, seed=0):
    """Gradients (q, k, x) of :func:`sigmoid_attention_forward`, recomputing the weights tile by tile."""
    B, H, n, _ = q.shape
    grad_q = torch.empty_like(q) if needs[0] else None
    grad_k = torch.zeros_like(k) if needs[1] else None
    grad_x = torch.zeros_like(x) if needs[2] else None
    gen = seeded_generator(q.device, seed) if drop_p > 0 else None
    nd = n_drop
    for bs, rs in _tiles(B, H, n, k.shape[-2]):
        q_c, k_c, x_c, g_c = q[bs, :, rs], k[bs], x[bs], grad_out[bs, :, rs]
        a = _sigmoid_weights(q_c, k_c, _blocked_tile(blocked, bs, rs), scale)  # (b, H, r, m)
        if gen is None:
            grad_a = torch.matmul(g_c, x_c.transpose(-1, -2))
            if grad_x is not None:
                grad_x[bs] += torch.matmul(a.transpose(-1, -2), g_c)
        else:
            keep = keep_mask(a, drop_p, gen)
            grad_a = torch.matmul(g_c[..., :nd], x_c[..., :nd].transpose(-1, -2)).mul_(keep)
            grad_a += torch.matmul(g_c[..., nd:], x_c[..., nd:].transpose(-1, -2))
            if grad_x is not None:
                grad_x[bs, ..., :nd] += torch.matmul((a * keep).transpose(-1, -2), g_c[..., :nd])
                grad_x[bs, ..., nd:] += torch.matmul(a.transpose(-1, -2), g_c[..., nd:])
        # d sigmoid(r)/dr = a (1 - a); masked entries have a = 0 and so get no gradient.
        grad_r = torch.ops.aten.sigmoid_backward(grad_a, a).mul_(scale)
        if grad_q is not None:
            grad_q[bs, :, rs] = torch.matmul(grad_r, k_c)
        if grad_k is not None:
            grad_k[bs] += torch.matmul(grad_r.transpose(-1, -2), q_c)
    return grad_q, grad_k, grad_x


class _MaskedSigmoidAttention(torch.autograd.Function):
    """``out = (sigmoid(scale · q kᵀ) ⊙ mask) @ x`` with the first ``n_drop`` columns of ``x`` seeing a
    dropped-out copy of the weights. Saves only q, k, x (and the bool mask)."""

    @staticmethod
    def forward(ctx, q, k, x, mask, scale, n_drop, drop_p, seed):
        q, k, x = q.contiguous(), k.contiguous(), x.contiguous()
        blocked = None if mask is None else ~mask
        out = sigmoid_attention_forward(q, k, x, blocked, scale, n_drop, drop_p, seed)
        ctx.save_for_backward(q, k, x, blocked if blocked is not None else torch.empty(0))
        ctx.has_mask = mask is not None
        ctx.scale, ctx.n_drop, ctx.drop_p, ctx.seed = scale, n_drop, drop_p, seed
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, x, blocked = ctx.saved_tensors
        grads = sigmoid_attention_backward(grad_out.contiguous(), q, k, x, blocked if ctx.has_mask else None,
                                           ctx.scale, ctx.needs_input_grad[:3], ctx.n_drop, ctx.drop_p, ctx.seed)
        return (*grads, None, None, None, None, None)


def masked_sigmoid_attention(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None,
                             scale: float, *, n_drop: int = 0, drop_p: float = 0.0) -> torch.Tensor:
    """``(sigmoid(scale · q kᵀ) ⊙ mask) @ x`` without keeping the ``n × m`` weights for backward.

    q: (B, H, n, d_k), k: (B, H, m, d_k), x: (B, H, m, d_x); mask: bool broadcastable to (B, H, n, m)
    (True = attend) or None. With ``drop_p > 0`` the first ``n_drop`` output columns use the weights
    after inverted dropout (probability ``drop_p``); the remaining columns use them undropped.
    """
    seed = new_seed() if drop_p > 0 else 0
    return _MaskedSigmoidAttention.apply(q, k, x, mask, float(scale), int(n_drop), float(drop_p), seed)
