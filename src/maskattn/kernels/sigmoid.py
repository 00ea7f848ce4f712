"""Blocked sigmoid attention: ``(sigmoid(scale · q kᵀ) ⊙ mask) @ x`` without keeping the ``n × m`` weights.

MTSA's token2token score is ``log σ(R)``, and ``softmax_j(log σ(R_ij)) ∝ σ(R_ij)``: in the factorised form
(docs/design.md §1) the row normalisation cancels, so the fast path is a plain product with the sigmoid
weights. Forward and backward walk (batch block × query block) tiles of at most :data:`CHUNK_ELEMENTS`
weights; backward rebuilds each tile's weights from q and k (one extra ``q kᵀ``), as FlashAttention does.

``row_normalise=True`` divides each query row by its largest allowed weight, ``w_ij = exp(log σ(R_ij) −
max_j log σ(R_ij))``: rows whose sigmoids would all underflow (scores below about −88 in float32) keep full
precision. The factor is treated as a constant, so the result is exact for *ratios* of output columns of
one row (how MTSA uses it: numerator over denominator), not for the columns themselves.

Under ``torch.compile`` the same math runs as plain differentiable operations (no Python loop over tiles, no
custom backward), which Inductor traces for any sequence length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .precision import in_working_precision
from .random import keep_mask, new_seed, seeded_generator

__all__ = ["masked_sigmoid_attention", "sigmoid_attention_forward", "sigmoid_attention_backward", "sigmoid_weights",
           "CHUNK_ELEMENTS", "QUERY_CHUNK"]

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


def sigmoid_weights(q, k, blocked, scale, row_normalise):
    """``(w, slope)``: the weights ``σ(R) ⊙ mask`` (or, with ``row_normalise``, ``exp(log σ(R) − max_j log
    σ(R))`` ⊙ mask) of ``R = scale · q kᵀ`` and ``dw/dR`` for backward (the row maximum held constant)."""
    r = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    if not row_normalise:
        w = r.sigmoid_()
        if blocked is not None:
            w = w.masked_fill_(blocked, 0.0)
        return w, None
    w = F.logsigmoid(r)
    if blocked is not None:
        w = w.masked_fill_(blocked, float("-inf"))
    row_max = w.amax(-1, keepdim=True)
    w = w.sub_(torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))).exp_()  # 0 where blocked
    return w, r.neg_().sigmoid_()  # d log σ(r)/dr = σ(−r)


def sigmoid_attention_forward(q, k, x, blocked, scale, n_drop=0, drop_p=0.0, seed=0, row_normalise=False):
    """Forward of ``(sigmoid(scale · q kᵀ) ⊙ ~blocked) @ x``; ``blocked`` is the inverted bool mask (True =
    excluded) or None. The first ``n_drop`` columns of x see the weights after dropout. Returns (B, H, n, d_x)."""
    B, H, n, _ = q.shape
    out = q.new_empty(B, H, n, x.shape[-1])
    gen = seeded_generator(q.device, seed) if drop_p > 0 else None
    for bs, rs in _tiles(B, H, n, k.shape[-2]):
        a, _ = sigmoid_weights(q[bs, :, rs], k[bs], _blocked_tile(blocked, bs, rs), scale, row_normalise)
        if gen is None:
            out[bs, :, rs] = torch.matmul(a, x[bs])
        else:
            keep = keep_mask(a, drop_p, gen)
            out[bs, :, rs, :n_drop] = torch.matmul(a * keep, x[bs, ..., :n_drop])
            out[bs, :, rs, n_drop:] = torch.matmul(a, x[bs, ..., n_drop:])
    return out


def sigmoid_attention_backward(grad_out, q, k, x, blocked, scale, needs=(True, True, True), n_drop=0,
                               drop_p=0.0, seed=0, row_normalise=False):
    """Gradients (q, k, x) of :func:`sigmoid_attention_forward`, recomputing the weights tile by tile."""
    B, H, n, _ = q.shape
    grad_q = torch.empty_like(q) if needs[0] else None
    grad_k = torch.zeros_like(k) if needs[1] else None
    grad_x = torch.zeros_like(x) if needs[2] else None
    gen = seeded_generator(q.device, seed) if drop_p > 0 else None
    nd = n_drop
    for bs, rs in _tiles(B, H, n, k.shape[-2]):
        q_c, k_c, x_c, g_c = q[bs, :, rs], k[bs], x[bs], grad_out[bs, :, rs]
        a, slope = sigmoid_weights(q_c, k_c, _blocked_tile(blocked, bs, rs), scale, row_normalise)  # (b, H, r, m)
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
        # d sigmoid(r)/dr = a (1 - a); row-normalised: dw/dr = w σ(−r). Masked entries have a = 0: no gradient.
        if slope is None:
            grad_r = torch.ops.aten.sigmoid_backward(grad_a, a).mul_(scale)
        else:
            grad_r = grad_a.mul_(a).mul_(slope).mul_(scale)
        if grad_q is not None:
            grad_q[bs, :, rs] = torch.matmul(grad_r, k_c)
        if grad_k is not None:
            grad_k[bs] += torch.matmul(grad_r.transpose(-1, -2), q_c)
    return grad_q, grad_k, grad_x


class _MaskedSigmoidAttention(torch.autograd.Function):
    """``out = (sigmoid(scale · q kᵀ) ⊙ mask) @ x`` with the first ``n_drop`` columns of ``x`` seeing a
    dropped-out copy of the weights. Saves only q, k, x (and the bool mask)."""

    @staticmethod
    def forward(ctx, q, k, x, mask, scale, n_drop, drop_p, seed, row_normalise=False):
        q, k, x = q.contiguous(), k.contiguous(), x.contiguous()
        blocked = None if mask is None else ~mask
        out = sigmoid_attention_forward(q, k, x, blocked, scale, n_drop, drop_p, seed, row_normalise)
        ctx.save_for_backward(q, k, x, blocked if blocked is not None else torch.empty(0))
        ctx.has_mask = mask is not None
        ctx.scale, ctx.n_drop, ctx.drop_p, ctx.seed, ctx.row_normalise = scale, n_drop, drop_p, seed, row_normalise
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, x, blocked = ctx.saved_tensors
        grads = sigmoid_attention_backward(grad_out.contiguous(), q, k, x, blocked if ctx.has_mask else None,
                                           ctx.scale, ctx.needs_input_grad[:3], ctx.n_drop, ctx.drop_p, ctx.seed,
                                           ctx.row_normalise)
        return (*grads, None, None, None, None, None, None)


def _traceable(q, k, x, mask, scale, n_drop, drop_p, row_normalise):
    """The same function as plain differentiable operations (``torch.compile``): the weights are kept for
    backward by autograd; with ``row_normalise`` the row maximum is held constant (detached)."""
    r = torch.matmul(q, k.transpose(-1, -2)) * scale
    if row_normalise:
        w = F.logsigmoid(r)
        if mask is not None:
            w = w.masked_fill(~mask, float("-inf"))
        row_max = w.detach().amax(-1, keepdim=True)
        w = torch.exp(w - torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)))
    else:
        w = torch.sigmoid(r) if mask is None else torch.sigmoid(r).masked_fill(~mask, 0.0)
    if drop_p == 0:
        return torch.matmul(w, x)
    return torch.cat([torch.matmul(F.dropout(w, drop_p, training=True), x[..., :n_drop]),
                      torch.matmul(w, x[..., n_drop:])], dim=-1)


def masked_sigmoid_attention(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None,
                             scale: float, *, n_drop: int = 0, drop_p: float = 0.0,
                             row_normalise: bool = False) -> torch.Tensor:
    """``(sigmoid(scale · q kᵀ) ⊙ mask) @ x`` without keeping the ``n × m`` weights for backward.

    q: (B, H, n, d_k), k: (B, H, m, d_k), x: (B, H, m, d_x); mask: bool broadcastable to (B, H, n, m)
    (True = attend) or None. With ``drop_p > 0`` the first ``n_drop`` output columns use the weights
    after inverted dropout (probability ``drop_p``); the remaining columns use them undropped.
    ``row_normalise``: see the module docstring. Half-precision inputs are computed in float32.
    """
    if torch.compiler.is_compiling():
        return in_working_precision(_traceable, q, k, x, mask=mask, scale=float(scale), n_drop=int(n_drop),
                                    drop_p=float(drop_p), row_normalise=row_normalise)
    seed = new_seed() if drop_p > 0 else 0
    return in_working_precision(lambda q, k, x: _MaskedSigmoidAttention.apply(
        q, k, x, mask, float(scale), int(n_drop), float(drop_p), seed, row_normalise), q, k, x)
