"""Backend dispatch: one switch, one truth (DESIGN.md §2).

* ``reference`` — explicit math with materialised scores; float64-capable; the specification.
* ``sdpa``      — PyTorch's dense kernels: ``F.scaled_dot_product_attention`` where the score is a plain
  (masked) dot product, and :func:`masked_sigmoid_attention` — a query-chunked matmul kernel that
  recomputes in backward — where the probabilities are ``sigmoid`` of the score (``softmax`` of
  ``log_sigmoid`` scores, up to a row normalisation that cancels in MTSA). Neither keeps an
  ``n × n`` tensor alive for backward beyond one query chunk (SDPA's fused path keeps none).
* ``flex``      — ``torch.nn.attention.flex_attention`` with ``score_mod`` / ``mask_mod`` and a block
  mask. Compiled on CUDA (training and inference); eager, inference only, on CPU (torch raises
  "FlexAttention does not support backward on CPU").
* ``auto``      — the fastest valid backend for the device, dtype and whether gradients are needed.
"""

from __future__ import annotations

import functools
import warnings

import torch

from ._validation import check_choice
from .masks import Mask

BACKENDS = ("reference", "sdpa", "flex")
BACKEND_CHOICES = ("auto",) + BACKENDS

__all__ = ["BACKENDS", "BACKEND_CHOICES", "flex_available", "resolve_backend", "masked_sigmoid_attention",
           "flex_attention_call"]


@functools.cache
def flex_available() -> bool:
    """Whether ``torch.nn.attention.flex_attention`` can be imported in this PyTorch."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:  # pragma: no cover - depends on the installed torch
        return False
    return True


def resolve_backend(backend: str, *, device: torch.device, needs_grad: bool, flex_ok: bool = True,
                    prefer_flex_on_cuda: bool = True) -> str:
    """Validate ``backend`` and turn ``"auto"`` into a concrete backend.

    ``needs_grad`` is True when autograd will run through the call; ``flex_ok`` is False when the
    caller needs a feature flex lacks (e.g. attention dropout). An explicit choice that cannot run
    raises ``ValueError`` saying why.
    """
    check_choice(backend, "backend", BACKEND_CHOICES)
    on_cuda = device.type == "cuda"
    if backend == "auto":
        if on_cuda and prefer_flex_on_cuda and flex_ok and flex_available():
            return "flex"
        return "sdpa"
    if backend == "flex":
        if not flex_available():
            raise ValueError("backend='flex' needs torch.nn.attention.flex_attention (PyTorch >= 2.5)")
        if not flex_ok:
            raise ValueError("backend='flex' does not support attention dropout; use backend='sdpa' or 'auto'")
        if needs_grad and not on_cuda:
            raise ValueError("backend='flex' supports backward only on CUDA (PyTorch raises 'FlexAttention does "
                             "not support backward on CPU'); use backend='sdpa' or 'auto' for CPU training, or "
                             "call under torch.no_grad() for CPU inference")
    return backend


# --------------------------------------------------------------------------------------------------
# sdpa backend: chunked sigmoid attention
# --------------------------------------------------------------------------------------------------

#: elements of one (batch-block × heads × query-chunk × keys) weight block; bounds the kernel's workspace.
CHUNK_ELEMENTS = 1 << 21
#: query rows per block: batched matmuls over few rows are slow on CPU, so keep blocks tall.
QUERY_CHUNK = 256


def _blocks(batch: int, heads: int, q_len: int, kv_len: int):
    """(batch slice, query slice) pairs covering the output, each block ≤ CHUNK_ELEMENTS weights."""
    rows = min(q_len, QUERY_CHUNK)
    per_batch = heads * rows * kv_len
    batch_step = max(1, CHUNK_ELEMENTS // max(1, per_batch))
    if batch_step == 1:
        rows = max(1, min(rows, CHUNK_ELEMENTS // max(1, heads * kv_len)))
    for b0 in range(0, batch, batch_step):
        for i0 in range(0, q_len, rows):
            yield slice(b0, min(batch, b0 + batch_step)), slice(i0, min(q_len, i0 + rows))


def sigmoid_attention_forward(q, k, x, blocked, scale, n_drop=0, drop_p=0.0, seed=0):
    """Blocked forward of ``(sigmoid(scale · q kᵀ) ⊙ ~blocked) @ x``; ``blocked`` is the inverted bool
    mask (True = excluded) or None. Returns (B, H, n, d_x)."""
    B, H, n, _ = q.shape
    out = q.new_empty(B, H, n, x.shape[-1])
    gen = _generator(q.device, seed) if drop_p > 0 else None
    for bs, rs in _blocks(B, H, n, k.shape[-2]):
        a = _sigmoid_weights(q[bs, :, rs], k[bs], _mask_block(blocked, bs, rs), scale)  # (b, H, r, m)
        if gen is None:
            out[bs, :, rs] = torch.matmul(a, x[bs])
        else:
            keep = _keep_mask(a, drop_p, gen)
            out[bs, :, rs, :n_drop] = torch.matmul(a * keep, x[bs, ..., :n_drop])
            out[bs, :, rs, n_drop:] = torch.matmul(a, x[bs, ..., n_drop:])
    return out


def sigmoid_attention_backward(grad_out, q, k, x, blocked, scale, needs=(True, True, True), n_drop=0,
                               drop_p=0.0, seed=0):
    """Gradients (q, k, x) of :func:`sigmoid_attention_forward`, recomputing the weights block by block."""
    B, H, n, _ = q.shape
    grad_q = torch.empty_like(q) if needs[0] else None
    grad_k = torch.zeros_like(k) if needs[1] else None
    grad_x = torch.zeros_like(x) if needs[2] else None
    gen = _generator(q.device, seed) if drop_p > 0 else None
    nd = n_drop
    for bs, rs in _blocks(B, H, n, k.shape[-2]):
        q_c, k_c, x_c, g_c = q[bs, :, rs], k[bs], x[bs], grad_out[bs, :, rs]
        a = _sigmoid_weights(q_c, k_c, _mask_block(blocked, bs, rs), scale)  # (b, H, r, m)
        if gen is None:
            grad_a = torch.matmul(g_c, x_c.transpose(-1, -2))
            if grad_x is not None:
                grad_x[bs] += torch.matmul(a.transpose(-1, -2), g_c)
        else:
            keep = _keep_mask(a, drop_p, gen)
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
    dropped-out copy of the weights. Saves only q, k, x (and the bool mask); the weights are rebuilt
    block by block in backward, as in FlashAttention."""

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


def _mask_block(blocked, bs, rs):
    if blocked is None:
        return None
    return blocked[bs if blocked.shape[0] > 1 else slice(None), :, rs]


def _sigmoid_weights(q_c, k_c, blocked, scale):
    a = torch.matmul(q_c, k_c.transpose(-1, -2)).mul_(scale).sigmoid_()
    if blocked is not None:
        a = a.masked_fill_(blocked, 0.0)
    return a


def _generator(device, seed):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _keep_mask(a, drop_p, gen):
    keep = torch.rand(a.shape, generator=gen, device=a.device, dtype=a.dtype) >= drop_p
    return keep.to(a.dtype).div_(1.0 - drop_p)


def masked_sigmoid_attention(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None,
                             scale: float, *, n_drop: int = 0, drop_p: float = 0.0) -> torch.Tensor:
    """``(sigmoid(scale · q kᵀ) ⊙ mask) @ x`` without keeping the ``n × m`` weights for backward.

    q: (B, H, n, d_k), k: (B, H, m, d_k), x: (B, H, m, d_x); mask: bool broadcastable to
    (B, H, n, m) or None. With ``drop_p > 0`` the first ``n_drop`` output columns use the weights after
    inverted dropout (probability ``drop_p``); the remaining columns use them undropped.
    """
    seed = int(torch.randint(0, 2**62, (1,)).item()) if drop_p > 0 else 0
    return _MaskedSigmoidAttention.apply(q, k, x, mask, float(scale), int(n_drop), float(drop_p), seed)


# --------------------------------------------------------------------------------------------------
# flex backend
# --------------------------------------------------------------------------------------------------

@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _mask_mod_from(mask, batch: int, heads: int, q_len: int, kv_len: int):
    if mask is None:
        return None
    if isinstance(mask, Mask):
        return mask.mask_mod
    dense = mask.expand(batch, heads, q_len, kv_len)
    return lambda b, h, q, kv: dense[b, h, q, kv]


def flex_attention_call(q, k, v, *, score_mod=None, mask=None, scale: float | None = None) -> torch.Tensor:
    """FlexAttention with a ``score_mod`` and a mask (a :class:`~maskattn.masks.Mask` or a bool tensor
    broadcastable to (B, H, n, m)); empty blocks are skipped through a block mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, n, _ = q.shape
    m = k.shape[-2]
    mask_mod = _mask_mod_from(mask, B, H, n, m)
    block_mask = None
    if mask_mod is not None:
        per_batch = not (isinstance(mask, Mask) and mask.static) and not (
            isinstance(mask, torch.Tensor) and mask.shape[0] == 1)
        block_mask = create_block_mask(mask_mod, B if per_batch else None, H, n, m, device=q.device)
    if q.device.type == "cuda":
        return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

