"""Triton kernels of MTSA's factorised attention (docs/design.md §1, §3): forward, and backward in two passes
(keys: dK, d(v⊙E), dE; queries: dQ), FlashAttention-2's split, with no atomics.

Per head, with weights ``w_ij = σ(R_ij)`` (log-sigmoid scale: the softmax normaliser cancels, so there is no
running maximum) or ``exp(R_ij − max_j R_ij)`` (identity scale: an online maximum), restricted to the head's
band ``lo <= j − i <= hi`` and to non-padding keys::

    N_i = Σ_j w_ij·d_ij·(v⊙E)_j      D_i = Σ_j w_ij·E_j      out_i = N_i / D_i

``d_ij`` is the weights' dropout keep-mask (MTSA Appendix A.3), drawn from Philox by position. Backward uses
``dN = dO / D``, ``dD = −dO·out / D``, ``dW_ij = d_ij·(dN_i·(v⊙E)_j) + dD_i·E_j`` and ``dR = dW ⊙ σ(1 − σ)``
(identity: ``dW ⊙ w``). Key tiles outside a query tile's band are never visited.
"""

import triton
import triton.language as tl

from .jit_helpers import dropout_keep, key_range, online_softmax, query_range, sigmoid


@triton.jit
def _key_tiles(K, VE, E, b, h, cols, fk, fv, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed, M, D_K, D_V):
    """``(k, v ⊙ E, E)`` at key positions ``cols`` of pair (b, h), 0 beyond M and the head widths."""
    inside = cols[:, None] < M
    key_mask, value_mask = inside & (fk[None, :] < D_K), inside & (fv[None, :] < D_V)
    k = tl.load(K + b.to(tl.int64) * skb + h * skh + cols[:, None] * skn + fk[None, :] * skd, mask=key_mask, other=0.0)
    ve = tl.load(VE + b.to(tl.int64) * svb + h * svh + cols[:, None] * svn + fv[None, :] * svd, mask=value_mask,
                 other=0.0)
    e = tl.load(E + b.to(tl.int64) * seb + h * seh + cols[:, None] * sen + fv[None, :] * sed, mask=value_mask,
                other=0.0)
    return k, ve, e


@triton.jit
def _scores(q, k, rows, cols, lo, hi, M, kpm_row, scale, HAS_KPM: tl.constexpr, PRECISION: tl.constexpr):
    """``(r, allowed)`` of one tile: ``r = scale·q kᵀ`` and the band / key-padding mask."""
    r = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    offset = cols[None, :] - rows[:, None]
    allowed = (offset >= lo) & (offset <= hi) & (cols[None, :] < M)
    if HAS_KPM:
        padded = tl.load(kpm_row + cols, mask=cols < M, other=1)
        allowed = allowed & (padded == 0)[None, :]
    return r, allowed


@triton.jit
def _weights(q, k, rows, cols, lo, hi, M, kpm_row, row_max, scale,
             HAS_KPM: tl.constexpr, IDENTITY: tl.constexpr, FAST: tl.constexpr, PRECISION: tl.constexpr):
    """``(w, allowed)`` of one tile: the weights, 0 where not allowed (identity scale: ``row_max`` is the final
    row maximum that forward stored)."""
    r, allowed = _scores(q, k, rows, cols, lo, hi, M, kpm_row, scale, HAS_KPM, PRECISION)
    if IDENTITY:  # masked before the exponential: a disallowed score may lie far above the row's maximum
        return tl.exp(tl.where(allowed, r - row_max[:, None], float("-inf"))), allowed
    else:
        return tl.where(allowed, sigmoid(r, FAST), 0.0), allowed


@triton.jit
def tensorized_fwd(Q, K, VE, E, KPM, BANDS, SEED, OUT, DEN, ROW_MAX,
                   sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed,
                   sob, soh, son, sod, H, N, M, D_K, D_V, scale, drop_p, threshold,
                   HAS_KPM: tl.constexpr, IDENTITY: tl.constexpr, DROPOUT: tl.constexpr, FAST: tl.constexpr,
                   PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid ``(⌈N / BLOCK_M⌉, B·H)``: one query tile of one (batch, head) pair per program."""
    i0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    lo = tl.load(BANDS + 2 * h)
    hi = tl.load(BANDS + 2 * h + 1)
    rows = i0 + tl.arange(0, BLOCK_M)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqn + fk[None, :] * sqd,
                mask=(rows[:, None] < N) & (fk[None, :] < D_K), other=0.0)
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    numerator = tl.zeros((BLOCK_M, BLOCK_DV), dtype=ACC)
    denominator = tl.zeros((BLOCK_M, BLOCK_DV), dtype=ACC)
    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=ACC)
    start, end = key_range(i0, BLOCK_M, BLOCK_N, lo, hi, N, M)
    for j0 in range(start, end, BLOCK_N):
        cols = j0 + tl.arange(0, BLOCK_N)
        k, ve, e = _key_tiles(K, VE, E, b, h, cols, fk, fv, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed,
                              M, D_K, D_V)
        if IDENTITY:  # online maximum: rescale what was accumulated so far
            r, allowed = _scores(q, k, rows, cols, lo, hi, M, kpm_row, scale, HAS_KPM, PRECISION)
            w, alpha, row_max = online_softmax(tl.where(allowed, r, float("-inf")), row_max)
            numerator = numerator * alpha[:, None]
            denominator = denominator * alpha[:, None]
        else:
            w, _ = _weights(q, k, rows, cols, lo, hi, M, kpm_row, row_max, scale, HAS_KPM, IDENTITY, FAST, PRECISION)
        if DROPOUT:
            keep = dropout_keep(seed, bh, rows, cols, N, M, drop_p)
            dropped = tl.where(keep, w / (1.0 - drop_p), 0.0)
        else:
            dropped = w
        numerator += tl.dot(dropped.to(ve.dtype), ve, input_precision=PRECISION)
        denominator += tl.dot(w.to(e.dtype), e, input_precision=PRECISION)
    reliable = denominator > threshold
    out = tl.where(reliable, numerator / tl.where(reliable, denominator, 1.0), 0.0)
    store = (rows[:, None] < N) & (fv[None, :] < D_V)
    tl.store(OUT + b.to(tl.int64) * sob + h * soh + rows[:, None] * son + fv[None, :] * sod,
             out.to(OUT.dtype.element_ty), mask=store)
    tl.store(DEN + bh.to(tl.int64) * N * D_V + rows[:, None] * D_V + fv[None, :], denominator, mask=store)
    if IDENTITY:
        tl.store(ROW_MAX + bh.to(tl.int64) * N + rows, tl.where(row_max == float("-inf"), 0.0, row_max),
                 mask=rows < N)


@triton.jit
def _output_grads(DO, OUT, DEN, b, h, bh, rows, fv, sgb, sgh, sgn, sgd, sob, soh, son, sod, N, D_V, threshold):
    """``(dN, dD)`` of a query tile: ``dN = dO / D``, ``dD = −dN·out`` (0 where ``D`` underflowed)."""
    inside = (rows[:, None] < N) & (fv[None, :] < D_V)
    g = tl.load(DO + b.to(tl.int64) * sgb + h * sgh + rows[:, None] * sgn + fv[None, :] * sgd, mask=inside, other=0.0)
    o = tl.load(OUT + b.to(tl.int64) * sob + h * soh + rows[:, None] * son + fv[None, :] * sod, mask=inside, other=0.0)
    den = tl.load(DEN + bh.to(tl.int64) * N * D_V + rows[:, None] * D_V + fv[None, :], mask=inside, other=0.0)
    reliable = den > threshold
    d_num = tl.where(reliable, g.to(den.dtype) / tl.where(reliable, den, 1.0), 0.0)
    return d_num, -d_num * o.to(den.dtype)


@triton.jit
def _score_grads(q, k, ve, e, d_num, d_den, rows, cols, lo, hi, M, kpm_row, row_max, seed, bh, N, scale, drop_p,
                 HAS_KPM: tl.constexpr, IDENTITY: tl.constexpr, DROPOUT: tl.constexpr, FAST: tl.constexpr,
                 PRECISION: tl.constexpr):
    """``(dR, w, dropped w)`` of a tile: the gradient of the scaled scores and the weights used forward."""
    w, allowed = _weights(q, k, rows, cols, lo, hi, M, kpm_row, row_max, scale, HAS_KPM, IDENTITY, FAST, PRECISION)
    grad_w_num = tl.dot(d_num.to(ve.dtype), tl.trans(ve), input_precision=PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, bh, rows, cols, N, M, drop_p)
        grad_w_num = tl.where(keep, grad_w_num / (1.0 - drop_p), 0.0)
        dropped = tl.where(keep, w / (1.0 - drop_p), 0.0)
    else:
        dropped = w
    grad_w = grad_w_num + tl.dot(d_den.to(e.dtype), tl.trans(e), input_precision=PRECISION)
    if IDENTITY:
        grad_r = grad_w * w
    else:
        grad_r = grad_w * w * (1.0 - w)
    return tl.where(allowed, grad_r, 0.0), w, dropped


@triton.jit
def tensorized_bwd_kv(Q, K, VE, E, KPM, BANDS, SEED, OUT, DEN, ROW_MAX, DO, DK, DVE, DE,
                      sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed,
                      sob, soh, son, sod, sgb, sgh, sgn, sgd, H, N, M, D_K, D_V, scale, drop_p, threshold,
                      HAS_KPM: tl.constexpr, IDENTITY: tl.constexpr, DROPOUT: tl.constexpr, FAST: tl.constexpr,
                      PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid ``(⌈M / BLOCK_N⌉, B·H)``: the gradients of one key tile (k, v⊙E, E), over the query tiles that see
    it. DK, DVE, DE are contiguous ``(B, H, M, ·)``."""
    j0 = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    lo = tl.load(BANDS + 2 * h)
    hi = tl.load(BANDS + 2 * h + 1)
    cols = j0 + tl.arange(0, BLOCK_N)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    in_keys = cols[:, None] < M
    k, ve, e = _key_tiles(K, VE, E, b, h, cols, fk, fv, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed,
                          M, D_K, D_V)
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    q_base = Q + b.to(tl.int64) * sqb + h * sqh
    grad_k = tl.zeros((BLOCK_N, BLOCK_DK), dtype=ACC)
    grad_ve = tl.zeros((BLOCK_N, BLOCK_DV), dtype=ACC)
    grad_e = tl.zeros((BLOCK_N, BLOCK_DV), dtype=ACC)
    start, end = query_range(j0, BLOCK_M, BLOCK_N, lo, hi, N, M)
    for i0 in range(start, end, BLOCK_M):
        rows = i0 + tl.arange(0, BLOCK_M)
        q = tl.load(q_base + rows[:, None] * sqn + fk[None, :] * sqd,
                    mask=(rows[:, None] < N) & (fk[None, :] < D_K), other=0.0)
        row_max = tl.load(ROW_MAX + bh.to(tl.int64) * N + rows, mask=rows < N, other=0.0) if IDENTITY else 0.0
        d_num, d_den = _output_grads(DO, OUT, DEN, b, h, bh, rows, fv, sgb, sgh, sgn, sgd, sob, soh, son, sod,
                                     N, D_V, threshold)
        grad_r, w, dropped = _score_grads(q, k, ve, e, d_num, d_den, rows, cols, lo, hi, M, kpm_row, row_max, seed,
                                          bh, N, scale, drop_p, HAS_KPM, IDENTITY, DROPOUT, FAST, PRECISION)
        grad_ve += tl.dot(tl.trans(dropped).to(ve.dtype), d_num.to(ve.dtype), input_precision=PRECISION)
        grad_e += tl.dot(tl.trans(w).to(e.dtype), d_den.to(e.dtype), input_precision=PRECISION)
        grad_k += tl.dot(tl.trans(grad_r).to(q.dtype), q, input_precision=PRECISION)
    base = bh.to(tl.int64) * M
    tl.store(DK + (base + cols[:, None]) * D_K + fk[None, :], (grad_k * scale).to(DK.dtype.element_ty),
             mask=in_keys & (fk[None, :] < D_K))
    tl.store(DVE + (base + cols[:, None]) * D_V + fv[None, :], grad_ve.to(DVE.dtype.element_ty),
             mask=in_keys & (fv[None, :] < D_V))
    tl.store(DE + (base + cols[:, None]) * D_V + fv[None, :], grad_e.to(DE.dtype.element_ty),
             mask=in_keys & (fv[None, :] < D_V))


@triton.jit
def tensorized_bwd_q(Q, K, VE, E, KPM, BANDS, SEED, OUT, DEN, ROW_MAX, DO, DQ,
                     sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed,
                     sob, soh, son, sod, sgb, sgh, sgn, sgd, H, N, M, D_K, D_V, scale, drop_p, threshold,
                     HAS_KPM: tl.constexpr, IDENTITY: tl.constexpr, DROPOUT: tl.constexpr, FAST: tl.constexpr,
                     PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid ``(⌈N / BLOCK_M⌉, B·H)``: the gradient of one query tile, over the key tiles it sees. DQ is
    contiguous ``(B, H, N, D_K)``."""
    i0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    lo = tl.load(BANDS + 2 * h)
    hi = tl.load(BANDS + 2 * h + 1)
    rows = i0 + tl.arange(0, BLOCK_M)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    in_rows = rows[:, None] < N
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqn + fk[None, :] * sqd,
                mask=in_rows & (fk[None, :] < D_K), other=0.0)
    row_max = tl.load(ROW_MAX + bh.to(tl.int64) * N + rows, mask=rows < N, other=0.0) if IDENTITY else 0.0
    d_num, d_den = _output_grads(DO, OUT, DEN, b, h, bh, rows, fv, sgb, sgh, sgn, sgd, sob, soh, son, sod,
                                 N, D_V, threshold)
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    grad_q = tl.zeros((BLOCK_M, BLOCK_DK), dtype=ACC)
    start, end = key_range(i0, BLOCK_M, BLOCK_N, lo, hi, N, M)
    for j0 in range(start, end, BLOCK_N):
        cols = j0 + tl.arange(0, BLOCK_N)
        k, ve, e = _key_tiles(K, VE, E, b, h, cols, fk, fv, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed,
                              M, D_K, D_V)
        grad_r, _, _ = _score_grads(q, k, ve, e, d_num, d_den, rows, cols, lo, hi, M, kpm_row, row_max, seed, bh,
                                    N, scale, drop_p, HAS_KPM, IDENTITY, DROPOUT, FAST, PRECISION)
        grad_q += tl.dot(grad_r.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + (bh.to(tl.int64) * N + rows[:, None]) * D_K + fk[None, :], (grad_q * scale).to(DQ.dtype.element_ty),
             mask=in_rows & (fk[None, :] < D_K))
