"""The anchor of the offline performance report (docs/gpu/offline-perf.md): FlashAttention-2-class fused softmax
attention in Triton — forward, and backward in two passes without atomics — written here from the published
algorithm (Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", 2023,
Algorithms 1 and 2; the structure of Triton's fused-attention tutorial: scores in log₂ units, ``exp2``, one
log-sum-exp per row kept for backward, ``Δ = rowsum(dO ⊙ O)`` from a pre-pass).

It is the reference that :mod:`maskattn.kernels.triton.offline.perf_report` compiles beside maskattn's kernels, at the same
shapes and architectures, so that each maskattn pass reads as a ratio to what an FA2-class kernel spends per score
(docs/design.md §3, "The Triton kernels"; §8). The passes match maskattn's split, so each pass has a counterpart:

* ``anchor_fwd``: per query tile, an online softmax over the key tiles (causal: up to the diagonal), one loop whose
  body masks only the tiles that cross the diagonal or the sequence end (a branch uniform over the program);
* ``anchor_bwd_kv``: per key tile, ``dV += Pᵀ·dO``, ``dK += dSᵀ·Q`` over the query tiles that see it;
* ``anchor_bwd_q``: per query tile, ``dQ += dS·K`` over the key tiles it sees (with ``Δ`` from the pre-pass
  ``anchor_bwd_delta``).

Per score: forward 4d FLOPs (``QKᵀ``, ``PV``) and one ``exp2``; backward 8d in the key pass (``QKᵀ`` recomputed,
``dO·Vᵀ``, ``Pᵀ·dO``, ``dSᵀ·Q``) and 6d in the query pass. As lean as the tutorial where it matters: the score
scale is folded into the exponent's argument (``exp2(s·scale₂ − m)``: one FMA per score, the maximum taken of the
unscaled scores), interior tiles neither mask nor select, and whole tiles (``EVEN``: the length a multiple of both
tile sizes, the head width a power of two) load without masks. Compiled beside Triton's fused-attention tutorial at
its own tiles (:mod:`maskattn.kernels.triton.offline.tutorial`), it issues as many warp instructions per score as
the tutorial within 2 % at d = 64 on sm_90 (the one width and architecture at which the tutorial's fixed tiles do
not spill), with the same ``MUFU`` and tensor work. Launches go through :func:`maskattn.kernels.triton.runtime.launch`
(one grid axis), so the report can record them without a GPU and a GPU run launches them as they are.
Tiles: :data:`TILES`, per pass, shared-memory class and head width.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from maskattn.kernels.triton import runtime

__all__ = ["TILES", "anchor_tiles", "attention", "forward", "backward", "KERNELS"]

LOG2E = 1.4426950408889634
KERNELS = ("anchor_fwd", "anchor_bwd_kv", "anchor_bwd_q")

#: (block_m, block_n, warps, stages) per pass × shared-memory class × head width: the forward holds BLOCK_M
#: queries and streams BLOCK_N keys; the key pass holds BLOCK_N keys and streams BLOCK_M queries; the query pass holds
#: BLOCK_M queries. For each, the tiles with the fewest warp instructions per score among those that compile without
#: spilling (Triton 3.9, bfloat16; candidates: FlashAttention-2's and the tutorial's shapes, 4 and 8 warps, 1-5
#: stages — docs/gpu/offline-perf.md, "The anchor").
TILES: dict[tuple[str, str, int], tuple[int, int, int, int]] = {
    ("anchor_fwd", "227K", 64): (128, 128, 8, 3), ("anchor_fwd", "227K", 128): (128, 128, 8, 2),
    ("anchor_fwd", "163K", 64): (128, 128, 8, 2), ("anchor_fwd", "163K", 128): (128, 64, 8, 3),
    ("anchor_bwd_kv", "227K", 64): (64, 128, 8, 2), ("anchor_bwd_kv", "227K", 128): (32, 128, 8, 2),
    ("anchor_bwd_kv", "163K", 64): (64, 128, 8, 2), ("anchor_bwd_kv", "163K", 128): (32, 128, 8, 2),
    ("anchor_bwd_q", "227K", 64): (128, 64, 8, 2), ("anchor_bwd_q", "227K", 128): (128, 32, 8, 2),
    ("anchor_bwd_q", "163K", 64): (128, 64, 8, 2), ("anchor_bwd_q", "163K", 128): (128, 32, 8, 2),
    # d = 256 (a head of 150 features pads to 256)
    ("anchor_fwd", "227K", 256): (128, 64, 8, 2), ("anchor_fwd", "163K", 256): (32, 64, 4, 2),
    ("anchor_bwd_kv", "227K", 256): (32, 32, 4, 2), ("anchor_bwd_kv", "163K", 256): (64, 64, 8, 1),
    ("anchor_bwd_q", "227K", 256): (128, 32, 8, 1), ("anchor_bwd_q", "163K", 256): (64, 32, 4, 2),
}


def anchor_tiles(kernel: str, head_dim: int, device) -> runtime.Tiles:
    """The tiles of pass ``kernel`` for heads of ``head_dim`` features on ``device`` (16 × 16 under the
    interpreter, as maskattn's kernels)."""
    target = runtime.target_of(device)
    if target is None or runtime.interpreted():
        return runtime.Tiles(16, 16, 1, 1)
    cls = runtime.tile_class(target) or "99K"
    cls = "163K" if cls == "99K" else cls  # the 99 KB class takes the 163 KB tiles (not in the report)
    return runtime.Tiles(*TILES[(kernel, cls, max(64, runtime.next_power_of_2(head_dim)))])


@triton.jit
def _load(base, start, stride_n, idx, feats, N, D, EVEN: tl.constexpr):
    """Rows ``start + idx`` × ``feats`` of an ``(N, D)`` matrix; zeros outside it (``EVEN``: whole tiles, no mask)."""
    ptrs = base + tl.cast(start, tl.int64) * stride_n + idx[:, None] * stride_n + feats[None, :]
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=((start + idx)[:, None] < N) & (feats[None, :] < D), other=0.0)


@triton.jit
def _store(base, start, stride_n, idx, feats, N, D, value, EVEN: tl.constexpr):
    ptrs = base + tl.cast(start, tl.int64) * stride_n + idx[:, None] * stride_n + feats[None, :]
    if EVEN:
        tl.store(ptrs, value)
    else:
        tl.store(ptrs, value, mask=((start + idx)[:, None] < N) & (feats[None, :] < D))


@triton.jit
def _vector(base, idx, N, other, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(base + idx)
    return tl.load(base + idx, mask=idx < N, other=other)


@triton.jit(do_not_specialize=["N", "num_tiles"])
def anchor_fwd(Q, K, V, O, LSE, N, D, num_tiles, scale2, CAUSAL: tl.constexpr, EVEN: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """``num_tiles · B·H`` programs: one query tile each. Q, K, V, O contiguous ``(B·H, N, D)``; LSE ``(B·H, N)``
    float32, log₂ units. Interior tiles: the scale folded into the exponent's argument (one FMA per score,
    ``s·scale₂ − m``); only tiles crossing the diagonal or the sequence end select."""
    pid = tl.program_id(0)
    tile = pid % num_tiles
    bh = (pid // num_tiles).to(tl.int64)
    i0 = tile * BLOCK_M
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    feats = tl.arange(0, BLOCK_D)
    rows = i0 + idx_m
    base = bh * N * D
    q = _load(Q + base, i0, D, idx_m, feats, N, D, EVEN)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    end = tl.minimum(i0 + BLOCK_M, N) if CAUSAL else N
    for j0 in range(0, end, BLOCK_N):
        k = _load(K + base, j0, D, idx_n, feats, N, D, EVEN)
        s = tl.dot(q, tl.trans(k))
        masked = False if EVEN else j0 + BLOCK_N > N
        if CAUSAL:
            masked = masked | (j0 + BLOCK_N - 1 > i0)
        if masked:  # uniform over the program
            cols = j0 + idx_n
            allowed = cols[None, :] < N
            if CAUSAL:
                allowed = allowed & (cols[None, :] <= rows[:, None])
            s = tl.where(allowed, s * scale2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp2(s - m_new[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * scale2)
            p = tl.exp2(s * scale2 - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        v = _load(V + base, j0, D, idx_n, feats, N, D, EVEN)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    _store(O + base, i0, D, idx_m, feats, N, D, (acc / l_i[:, None]).to(O.dtype.element_ty), EVEN)
    if EVEN:
        tl.store(LSE + bh * N + rows, m_i + tl.log2(l_i))
    else:
        tl.store(LSE + bh * N + rows, m_i + tl.log2(l_i), mask=rows < N)


@triton.jit(do_not_specialize=["N"])
def anchor_bwd_delta(O, DO, DELTA, N, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """``Δ = rowsum(dO ⊙ O)`` per row (float32), ``cdiv(B·H·N, BLOCK_M)`` programs over the flattened rows."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    feats = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < N) & (feats[None, :] < D)
    offsets = rows.to(tl.int64)[:, None] * D + feats[None, :]
    o = tl.load(O + offsets, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, axis=1), mask=rows < N)


@triton.jit(do_not_specialize=["N", "num_tiles"])
def anchor_bwd_kv(Q, K, V, DO, LSE, DELTA, DK, DV, N, D, num_tiles, scale, scale2, CAUSAL: tl.constexpr,
                  EVEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """``num_tiles · B·H`` programs: dK, dV of one key tile over the query tiles that see it; the key tile is
    the products' M dimension (``k·qᵀ``, ``v·dOᵀ``)."""
    pid = tl.program_id(0)
    tile = pid % num_tiles
    bh = (pid // num_tiles).to(tl.int64)
    j0 = tile * BLOCK_N
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    feats = tl.arange(0, BLOCK_D)
    cols = j0 + idx_n
    base = bh * N * D
    k = _load(K + base, j0, D, idx_n, feats, N, D, EVEN)
    v = _load(V + base, j0, D, idx_n, feats, N, D, EVEN)
    grad_k = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    grad_v = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    start = (j0 // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for i0 in range(start, N, BLOCK_M):
        rows = i0 + idx_m
        q = _load(Q + base, i0, D, idx_m, feats, N, D, EVEN)
        lse = _vector(LSE + bh * N, rows, N, float("inf"), EVEN)
        s_t = tl.dot(k, tl.trans(q))  # (BLOCK_N keys, BLOCK_M queries)
        masked = False if EVEN else j0 + BLOCK_N > N
        if CAUSAL:
            masked = masked | (i0 < j0 + BLOCK_N - 1)
        if masked:
            allowed = cols[:, None] < N
            if CAUSAL:
                allowed = allowed & (cols[:, None] <= rows[None, :])
            p_t = tl.exp2(tl.where(allowed, s_t * scale2, float("-inf")) - lse[None, :])
        else:
            p_t = tl.exp2(s_t * scale2 - lse[None, :])
        do = _load(DO + base, i0, D, idx_m, feats, N, D, EVEN)
        grad_v = tl.dot(p_t.to(do.dtype), do, grad_v)
        delta = _vector(DELTA + bh * N, rows, N, 0.0, EVEN)
        ds_t = p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])
        grad_k = tl.dot(ds_t.to(q.dtype), q, grad_k)
    _store(DK + base, j0, D, idx_n, feats, N, D, (grad_k * scale).to(DK.dtype.element_ty), EVEN)
    _store(DV + base, j0, D, idx_n, feats, N, D, grad_v.to(DV.dtype.element_ty), EVEN)


@triton.jit(do_not_specialize=["N", "num_tiles"])
def anchor_bwd_q(Q, K, V, DO, LSE, DELTA, DQ, N, D, num_tiles, scale, scale2, CAUSAL: tl.constexpr,
                 EVEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """``num_tiles · B·H`` programs: dQ of one query tile over the key tiles it sees."""
    pid = tl.program_id(0)
    tile = pid % num_tiles
    bh = (pid // num_tiles).to(tl.int64)
    i0 = tile * BLOCK_M
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    feats = tl.arange(0, BLOCK_D)
    rows = i0 + idx_m
    base = bh * N * D
    q = _load(Q + base, i0, D, idx_m, feats, N, D, EVEN)
    do = _load(DO + base, i0, D, idx_m, feats, N, D, EVEN)
    lse = _vector(LSE + bh * N, rows, N, float("inf"), EVEN)
    delta = _vector(DELTA + bh * N, rows, N, 0.0, EVEN)
    grad_q = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    end = tl.minimum(i0 + BLOCK_M, N) if CAUSAL else N
    for j0 in range(0, end, BLOCK_N):
        k = _load(K + base, j0, D, idx_n, feats, N, D, EVEN)
        s = tl.dot(q, tl.trans(k))
        masked = False if EVEN else j0 + BLOCK_N > N
        if CAUSAL:
            masked = masked | (j0 + BLOCK_N - 1 > i0)
        if masked:
            cols = j0 + idx_n
            allowed = cols[None, :] < N
            if CAUSAL:
                allowed = allowed & (cols[None, :] <= rows[:, None])
            p = tl.exp2(tl.where(allowed, s * scale2, float("-inf")) - lse[:, None])
        else:
            p = tl.exp2(s * scale2 - lse[:, None])
        v = _load(V + base, j0, D, idx_n, feats, N, D, EVEN)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        grad_q = tl.dot(ds.to(k.dtype), k, grad_q)
    _store(DQ + base, i0, D, idx_m, feats, N, D, (grad_q * scale).to(DQ.dtype.element_ty), EVEN)


def _constants(kernel: str, q: torch.Tensor, causal: bool) -> dict:
    tiles = anchor_tiles(kernel, q.shape[-1], q.device)
    block_d = max(16, runtime.next_power_of_2(q.shape[-1]))
    n = q.shape[-2]
    even = n % tiles.block_m == 0 and n % tiles.block_n == 0 and q.shape[-1] == block_d
    return dict(CAUSAL=causal, EVEN=even, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_D=block_d,
                num_warps=tiles.warps, num_stages=tiles.stages)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of softmax attention of contiguous ``(B, H, N, D)`` q, k, v with scale ``1/√D``."""
    B, H, N, D = q.shape
    out = torch.empty_like(q)
    lse = q.new_empty(B, H, N, dtype=torch.float32)
    c = _constants("anchor_fwd", q, causal)
    tiles = runtime.cdiv(N, c["BLOCK_M"])
    runtime.launch(anchor_fwd, tiles * B * H, q, k, v, out, lse, N, D, tiles, LOG2E / math.sqrt(D), **c)
    return out, lse


def backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)``: the pre-pass Δ, the key pass and the query pass."""
    B, H, N, D = q.shape
    grad_out = grad_out.contiguous()
    delta = lse.new_empty(B, H, N)
    block_d = max(16, runtime.next_power_of_2(D))
    runtime.launch(anchor_bwd_delta, runtime.cdiv(B * H * N, 64), out, grad_out, delta, B * H * N, D,
                   BLOCK_M=64, BLOCK_D=block_d)
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scale = 1.0 / math.sqrt(D)
    keys = _constants("anchor_bwd_kv", q, causal)
    key_tiles = runtime.cdiv(N, keys["BLOCK_N"])
    runtime.launch(anchor_bwd_kv, key_tiles * B * H, q, k, v, grad_out, lse, delta, grad_k, grad_v, N, D, key_tiles,
                   scale, scale * LOG2E, **keys)
    queries = _constants("anchor_bwd_q", q, causal)
    query_tiles = runtime.cdiv(N, queries["BLOCK_M"])
    runtime.launch(anchor_bwd_q, query_tiles * B * H, q, k, v, grad_out, lse, delta, grad_q, N, D, query_tiles,
                   scale, scale * LOG2E, **queries)
    return grad_q, grad_k, grad_v


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = forward(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        return (*backward(grad_out, q, k, v, out, lse, ctx.causal), None)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Differentiable softmax attention of ``(B, H, N, D)`` q, k, v (scale ``1/√D``) through the anchor kernels."""
    return _Attention.apply(q, k, v, causal)
