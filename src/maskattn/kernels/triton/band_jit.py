"""Triton kernels of banded softmax attention over a head area (CSAN 1D / 2D, SMAN, MTSA window heads):
forward, and backward in two passes without atomics (queries: dQ and ``Δ``; keys: dK, dV), FlashAttention-2's
split and its dropout scheme.

Query ``i`` of head ``h`` sees key ``j`` of every head ``g`` of its area when ``i − left <= j <= i + right``,
``j`` is not padding, and the area slot exists; one softmax covers the whole area (CSAN Eq. 9)::

    f_ij = score_mod(scale · q_i·k_j)        p_ij = exp(f_ij − lse_i)        o_i = Σ_j d_ij p_ij v_j

``d_ij`` is the dropout keep-mask scaled by ``1 / (1 − p)`` (Philox numbers drawn at ``(b·H + h, i, a·N + j)``,
``a`` the area slot: the key axis is ``A·N`` long, as in the gathered-keys form of docs/design.md §1).
Backward (``Δ_i = dO_i·O_i``)::

    dV_j += Σ_i d_ij p_ij dO_i      dP_ij = d_ij dO_i·v_j      dF_ij = p_ij (dP_ij − Δ_i)
    dS_ij = dF_ij · score_mod'(s_ij)   (log-sigmoid: σ(−s_ij))
    dQ_i = scale Σ_j dS_ij k_j          dK_j = scale Σ_i dS_ij q_i

The area is read from two small int32 tables (built on the host by ``band.py``):

* ``AREA``  ``(H, 1 + 2A)``: row ``h`` = ``[count, a₀, g₀, a₁, g₁, …]``, the existing slots ``a`` of head
  ``h``'s area and the head ``g`` whose keys they hold (forward and dQ loop over them);
* ``OWNERS`` ``(H, 1 + 2P)``: row ``g`` = ``[count, h₀, a₀, h₁, a₁, …]``, every (query head, slot) pair whose
  slot holds head ``g``'s keys (the dK/dV pass of head ``g`` loops over them; a head listed in several slots of the
  same ``h`` is listed once per slot).

Tiles of keys (queries) start where the band of the query (key) tile starts, not at a tile boundary, so no
visited tile is empty: a window-11 band of a 64-query tile is 74 keys, two or three key tiles.
"""

import triton
import triton.language as tl

from .jit_helpers import dropout_keep, log_sigmoid, online_softmax, sigmoid


@triton.jit
def _band_keys(i0, BLOCK_M: tl.constexpr, left, right, N):
    """``(start, end)``: the keys that queries ``i0 … i0 + BLOCK_M − 1`` (below N) reach (not tile-aligned)."""
    last = tl.minimum(i0 + BLOCK_M, N) - 1
    return tl.maximum(i0 - left, 0), tl.minimum(last + right + 1, N)


@triton.jit
def _band_queries(j0, BLOCK_N: tl.constexpr, left, right, N):
    """``(start, end)``: the queries that reach keys ``j0 … j0 + BLOCK_N − 1`` (below N) (not tile-aligned)."""
    last = tl.minimum(j0 + BLOCK_N, N) - 1
    return tl.maximum(j0 - right, 0), tl.minimum(last + left + 1, N)


@triton.jit
def _area_entry(ENTRY, K, V, b, skb, skh, svb, svh):
    """One entry of a head's area (``ENTRY`` points one before its pair ``(a, g)``): the area offset ``a`` and the
    bases of head ``g``'s keys and values in batch row ``b``."""
    a = tl.load(ENTRY + 1)
    g = tl.load(ENTRY + 2)
    return a, K + b.to(tl.int64) * skb + g.to(tl.int64) * skh, V + b.to(tl.int64) * svb + g.to(tl.int64) * svh


@triton.jit
def _tile(base, start, stride_n, stride_d, idx, feats, N, D):
    """The ``(len(idx), len(feats))`` tile of rows ``start + idx`` of a ``(N, D)`` matrix at ``base`` (int64
    row offset of the tile, int32 offsets inside it); 0 outside."""
    ptr = base + tl.cast(start, tl.int64) * stride_n
    mask = ((start + idx)[:, None] < N) & (feats[None, :] < D)
    return tl.load(ptr + idx[:, None] * stride_n + feats[None, :] * stride_d, mask=mask, other=0.0)


@triton.jit
def _scores(q, k, rows, cols, left, right, N, kept, scale, LOGSIG: tl.constexpr, PRECISION: tl.constexpr):
    """``(s, f, allowed)`` of a tile: the scaled scores, the modified scores and the band / padding mask
    (``kept``: the keys' non-padding flags, a ``(BLOCK_N,)`` bool, all True without padding)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    if LOGSIG:
        f = log_sigmoid(s)
    else:
        f = s
    offset = cols[None, :] - rows[:, None]
    allowed = (offset >= -left) & (offset <= right) & (cols[None, :] < N) & (rows[:, None] < N) & kept[None, :]
    return s, f, allowed


@triton.jit
def _kept(KPM, b, cols, N, HAS_KPM: tl.constexpr):
    if HAS_KPM:
        return tl.load(KPM + b.to(tl.int64) * N + cols, mask=cols < N, other=1) == 0
    else:
        return cols < N


@triton.jit
def band_fwd(Q, K, V, KPM, AREA, SEED, OUT, LSE,
             sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
             H, N, A, left, right, D_K, D_V, AREA_ROW, scale, drop_p,
             HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
             ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr,
             BLOCK_DV: tl.constexpr):
    """Grid ``(⌈N / BLOCK_M⌉, B·H)``: one query tile of one (batch, head) pair; online softmax over the band
    keys of every slot of the head's area. LSE is contiguous ``(B, H, N)`` (``+inf`` for rows with no key)."""
    i0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    rows = i0 + idx_m
    q = _tile(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh, i0, sqn, sqd, idx_m, fk, N, D_K)
    seed = tl.load(SEED) if DROPOUT else 0
    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=ACC)
    row_sum = tl.zeros((BLOCK_M,), dtype=ACC)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=ACC)
    start, end = _band_keys(i0, BLOCK_M, left, right, N)
    area = AREA + h * AREA_ROW
    for e in range(tl.load(area)):
        a, k_base, v_base = _area_entry(area + 2 * e, K, V, b, skb, skh, svb, svh)
        for j0 in range(start, end, BLOCK_N):
            cols = j0 + idx_n
            k = _tile(k_base, j0, skn, skd, idx_n, fk, N, D_K)
            v = _tile(v_base, j0, svn, svd, idx_n, fv, N, D_V)
            kept = _kept(KPM, b, cols, N, HAS_KPM)
            _, f, allowed = _scores(q, k, rows, cols, left, right, N, kept, scale, LOGSIG, PRECISION)
            p, alpha, row_max = online_softmax(tl.where(allowed, f, float("-inf")), row_max)
            row_sum = row_sum * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None]
            if DROPOUT:  # the dropped probabilities reach the output, the undropped ones the normaliser
                keep = dropout_keep(seed, bh, rows, a * N + cols, N, A * N, drop_p)
                p = tl.where(keep, p, 0.0)
            acc += tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    found = row_sum > 0
    out = acc / tl.where(found, row_sum, 1.0)[:, None]
    if DROPOUT:
        out = out / (1.0 - drop_p)
    store = (rows[:, None] < N) & (fv[None, :] < D_V)
    o_base = OUT + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i0.to(tl.int64) * son
    tl.store(o_base + idx_m[:, None] * son + fv[None, :] * sod, out.to(OUT.dtype.element_ty), mask=store)
    lse = tl.where(found, row_max + tl.log(tl.where(found, row_sum, 1.0)), float("inf"))
    tl.store(LSE + bh.to(tl.int64) * N + rows, lse, mask=rows < N)


@triton.jit
def _score_grads(q, k, v, do, lse, delta, rows, cols, left, right, N, kept, scale, keep, inv_keep,
                 LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, FAST: tl.constexpr, PRECISION: tl.constexpr):
    """``(dS, dropped p)`` of a tile: the gradient of the scaled scores (before the factor ``scale``) and the
    probabilities that reached the output."""
    s, f, allowed = _scores(q, k, rows, cols, left, right, N, kept, scale, LOGSIG, PRECISION)
    p = tl.where(allowed, tl.exp(f - lse[:, None]), 0.0)  # lse = +inf on rows with no key: p = 0
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    if DROPOUT:
        dp = tl.where(keep, dp * inv_keep, 0.0)
        dropped = tl.where(keep, p * inv_keep, 0.0)
    else:
        dropped = p
    ds = p * (dp - delta[:, None])
    if LOGSIG:
        ds = ds * sigmoid(-s, FAST)  # d log σ(s) / ds = σ(−s)
    return ds, dropped


@triton.jit
def band_bwd_q(Q, K, V, KPM, AREA, SEED, OUT, DO, LSE, DELTA, DQ,
               sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
               sgb, sgh, sgn, sgd, H, N, A, left, right, D_K, D_V, AREA_ROW, scale, drop_p,
               HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, FAST: tl.constexpr,
               PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid ``(⌈N / BLOCK_M⌉, B·H)``: ``Δ = rowsum(dO ⊙ O)`` of one query tile (stored for the key pass) and
    its dQ, over the key tiles of its area like forward. DELTA ``(B, H, N)`` and DQ ``(B, H, N, D_K)`` are
    contiguous."""
    i0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    rows = i0 + idx_m
    q = _tile(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh, i0, sqn, sqd, idx_m, fk, N, D_K)
    do = _tile(DO + b.to(tl.int64) * sgb + h.to(tl.int64) * sgh, i0, sgn, sgd, idx_m, fv, N, D_V)
    o = _tile(OUT + b.to(tl.int64) * sob + h.to(tl.int64) * soh, i0, son, sod, idx_m, fv, N, D_V)
    delta = tl.sum(do.to(ACC) * o.to(ACC), axis=1)
    tl.store(DELTA + bh.to(tl.int64) * N + rows, delta, mask=rows < N)
    lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=rows < N, other=float("inf"))
    seed = tl.load(SEED) if DROPOUT else 0
    inv_keep = 1.0 / (1.0 - drop_p)
    grad_q = tl.zeros((BLOCK_M, BLOCK_DK), dtype=ACC)
    start, end = _band_keys(i0, BLOCK_M, left, right, N)
    area = AREA + h * AREA_ROW
    for e in range(tl.load(area)):
        a, k_base, v_base = _area_entry(area + 2 * e, K, V, b, skb, skh, svb, svh)
        for j0 in range(start, end, BLOCK_N):
            cols = j0 + idx_n
            k = _tile(k_base, j0, skn, skd, idx_n, fk, N, D_K)
            v = _tile(v_base, j0, svn, svd, idx_n, fv, N, D_V)
            kept = _kept(KPM, b, cols, N, HAS_KPM)
            keep = dropout_keep(seed, bh, rows, a * N + cols, N, A * N, drop_p) if DROPOUT else 0
            ds, _ = _score_grads(q, k, v, do, lse, delta, rows, cols, left, right, N, kept, scale, keep, inv_keep,
                                 LOGSIG, DROPOUT, FAST, PRECISION)
            grad_q += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + (bh.to(tl.int64) * N + i0) * D_K + idx_m[:, None] * D_K + fk[None, :],
             (grad_q * scale).to(DQ.dtype.element_ty), mask=(rows[:, None] < N) & (fk[None, :] < D_K))


@triton.jit
def band_bwd_kv(Q, K, V, KPM, OWNERS, SEED, DO, LSE, DELTA, DK, DV,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgn, sgd,
                H, N, A, left, right, D_K, D_V, OWNER_ROW, scale, drop_p,
                HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, FAST: tl.constexpr,
                PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid ``(⌈N / BLOCK_N⌉, B·H)``: dK and dV of one key tile of head ``g`` (the head that owns the keys),
    over every (query head ``h``, slot ``a``) whose slot holds head ``g`` and, in each, the query tiles whose
    band reaches the key tile. Each key gradient is written by exactly one program: no atomics, the same sums
    in the same order on every run. DK ``(B, H, N, D_K)`` and DV ``(B, H, N, D_V)`` are contiguous."""
    j0 = tl.program_id(0) * BLOCK_N
    bg = tl.program_id(1)
    b = bg // H
    g = bg % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    cols = j0 + idx_n
    k = _tile(K + b.to(tl.int64) * skb + g.to(tl.int64) * skh, j0, skn, skd, idx_n, fk, N, D_K)
    v = _tile(V + b.to(tl.int64) * svb + g.to(tl.int64) * svh, j0, svn, svd, idx_n, fv, N, D_V)
    kept = _kept(KPM, b, cols, N, HAS_KPM)
    seed = tl.load(SEED) if DROPOUT else 0
    inv_keep = 1.0 / (1.0 - drop_p)
    grad_k = tl.zeros((BLOCK_N, BLOCK_DK), dtype=ACC)
    grad_v = tl.zeros((BLOCK_N, BLOCK_DV), dtype=ACC)
    start, end = _band_queries(j0, BLOCK_N, left, right, N)
    owners = OWNERS + g * OWNER_ROW
    for e in range(tl.load(owners)):
        h = tl.load(owners + 1 + 2 * e)
        a = tl.load(owners + 2 + 2 * e)
        bh = b * H + h
        q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
        do_base = DO + b.to(tl.int64) * sgb + h.to(tl.int64) * sgh
        for i0 in range(start, end, BLOCK_M):
            rows = i0 + idx_m
            q = _tile(q_base, i0, sqn, sqd, idx_m, fk, N, D_K)
            do = _tile(do_base, i0, sgn, sgd, idx_m, fv, N, D_V)
            lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=rows < N, other=float("inf"))
            delta = tl.load(DELTA + bh.to(tl.int64) * N + rows, mask=rows < N, other=0.0)
            keep = dropout_keep(seed, bh, rows, a * N + cols, N, A * N, drop_p) if DROPOUT else 0
            ds, dropped = _score_grads(q, k, v, do, lse, delta, rows, cols, left, right, N, kept, scale, keep,
                                       inv_keep, LOGSIG, DROPOUT, FAST, PRECISION)
            grad_v += tl.dot(tl.trans(dropped).to(do.dtype), do, input_precision=PRECISION)
            grad_k += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    in_keys = cols[:, None] < N
    base = (bg.to(tl.int64) * N + j0)
    tl.store(DK + base * D_K + idx_n[:, None] * D_K + fk[None, :], (grad_k * scale).to(DK.dtype.element_ty),
             mask=in_keys & (fk[None, :] < D_K))
    tl.store(DV + base * D_V + idx_n[:, None] * D_V + fv[None, :], grad_v.to(DV.dtype.element_ty),
             mask=in_keys & (fv[None, :] < D_V))
