"""Triton kernels of banded softmax attention over a head area (CSAN 1D / 2D, SMAN, MTSA window heads):
forward, and backward in two passes without atomics (queries: dQ and ``Δ``; keys: dK, dV), FlashAttention-2's
split and its dropout scheme.

Query ``i`` of head ``h`` sees key ``j`` of every head ``g`` of its area when ``i − left <= j <= i + right``,
``j`` is not padding, and the area slot exists; one softmax covers the whole area (CSAN Eq. 9)::

    f_ij = score_mod(scale · q_i·k_j)        p_ij = exp(f_ij − lse_i)        o_i = Σ_j d_ij p_ij v_j

``d_ij`` is the dropout keep-mask scaled by ``1 / (1 − p)`` (Philox numbers drawn at ``(b·H + h, i, a·N + j)``,
``a`` the area slot: the key axis is ``A·N`` long, as in the gathered-keys form of docs/design.md §1). Scores are
kept in log₂ units (``exp2``). Backward
(``Δ_i = dO_i·O_i``)::

    dV_j += Σ_i d_ij p_ij dO_i      dP_ij = d_ij dO_i·v_j      dF_ij = p_ij (dP_ij − Δ_i)
    dS_ij = dF_ij · score_mod'(s_ij)   (log-sigmoid: σ(−s_ij) = exp(f_ij − s_ij))
    dQ_i = scale Σ_j dS_ij k_j          dK_j = scale Σ_i dS_ij q_i

Keys past the sequence and padded keys are set to ``−inf`` per column; the band's two-dimensional mask is
computed only on tiles that cross its edges (a branch uniform over the program inside one loop per slot).

The area is read from two small int32 tables (built on the host by ``band.py``):

* ``AREA``  ``(H, 1 + 2A)``: row ``h`` = ``[count, a₀, g₀, a₁, g₁, …]``, the existing slots ``a`` of head
  ``h``'s area and the head ``g`` whose keys they hold (forward and dQ loop over them);
* ``OWNERS`` ``(H, 1 + 2P)``: row ``g`` = ``[count, h₀, a₀, h₁, a₁, …]``, every (query head, slot) pair whose
  slot holds head ``g``'s keys (the dK/dV pass of head ``g`` loops over them; a head listed in several slots of the
  same ``h`` is listed once per slot).

Tiles of keys start where the band of the query tile starts, not at a tile boundary, so no visited tile is empty: a
window-11 band of a 64-query tile is 74 keys, two or three key tiles; tiles of queries in the key pass start where
the key tile's band starts.

Per score (head dims d, FLOPs of ``tl.dot``): forward 4d, backward 6d (query pass) + 6d (key pass), as
FlashAttention-2 with the same split; transcendentals: 1 ``exp2`` per score and pass (log-sigmoid scores: 3).
"""

import triton
import triton.language as tl

from .jit_helpers import (LOG2E, aligned_run, dropout_keep, head_base, load_tile, log_sigmoid, online_softmax,
                          program_tile, store_tile)

#: never specialised on == 1 (a new length, band or area must not recompile)
_SIZES = ["H", "N", "A", "left", "right", "num_tiles", "TABLE_ROW"]


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
    return a, head_base(K, b, g, skb, skh), head_base(V, b, g, svb, svh)


@triton.jit
def _kept_keys(KPM, b, cols, N, HAS_KPM: tl.constexpr):
    """Per key: inside the sequence and not padded."""
    kept = cols < N
    if HAS_KPM:
        kept = kept & (tl.load(KPM + b.to(tl.int64) * N + cols, mask=cols < N, other=1) == 0)
    return kept


@triton.jit
def _scores(q, k, rows, cols, left, right, kept, scale, masked, LOGSIG: tl.constexpr, PRECISION: tl.constexpr):
    """``(s, f2)`` of a (rows × cols) tile: the scaled scores (natural units with ``LOGSIG``, else log₂ units) and the
    modified scores in log₂ units, ``−inf`` outside the band (``masked``: the tile crosses its edge) and at keys not
    ``kept`` (a select: a non-finite padded key stays out, as on the reference backend)."""
    if LOGSIG:
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        f2 = tl.where(kept[None, :], log_sigmoid(s) * LOG2E, float("-inf"))
    else:
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * (scale * LOG2E)  # the scores in log₂ units
        f2 = tl.where(kept[None, :], s, float("-inf"))
    if masked:  # uniform over the program
        offset = cols[None, :] - rows[:, None]
        f2 = tl.where((offset >= -left) & (offset <= right), f2, float("-inf"))
    return s, f2


@triton.jit
def _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, j0, a, rows, idx_n, fk, fv, left, right, KPM, b, N, A,
              skn, skd, svn, svd, D_K, D_V, seed, bh, scale, drop_p, masked, HAS_KPM: tl.constexpr,
              LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """One key tile of slot ``a``: the updated ``(acc, row_max, row_sum)``."""
    cols = j0 + idx_n
    k = load_tile(k_base, j0, skn, skd, idx_n, fk, N, D_K)
    v = load_tile(v_base, j0, svn, svd, idx_n, fv, N, D_V)
    _, f2 = _scores(q, k, rows, cols, left, right, _kept_keys(KPM, b, cols, N, HAS_KPM), scale, masked, LOGSIG,
                    PRECISION)
    p, alpha, row_max = online_softmax(f2, row_max)
    row_sum = row_sum * alpha + tl.sum(p, axis=1)
    if DROPOUT:  # the dropped probabilities reach the output, the undropped ones the normaliser
        p = tl.where(dropout_keep(seed, bh, rows, a * N + j0, N, A * N, drop_p, BLOCK_M, BLOCK_N), p, 0.0)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, row_max, row_sum


@triton.jit(do_not_specialize=_SIZES)
def band_fwd(Q, K, V, KPM, AREA, SEED, OUT, LSE,
             sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
             H, N, A, left, right, D_K, D_V, num_tiles, TABLE_ROW, scale, drop_p,
             HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
             ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr,
             BLOCK_DV: tl.constexpr):
    """``num_tiles · B · H`` programs: one query tile of one (batch, head) pair; online softmax over the band
    keys of every slot of the head's area. LSE is contiguous ``(B, H, N)``, log₂ units (``+inf`` for rows with no
    key)."""
    tile, bh = program_tile(num_tiles)
    i0 = tile * BLOCK_M
    b = bh // H
    h = bh % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    rows = i0 + idx_m
    q = load_tile(head_base(Q, b, h, sqb, sqh), i0, sqn, sqd, idx_m, fk, N, D_K)
    seed = tl.load(SEED) if DROPOUT else 0
    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=ACC)
    row_sum = tl.zeros((BLOCK_M,), dtype=ACC)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=ACC)
    start, end = _band_keys(i0, BLOCK_M, left, right, N)
    first, stop = aligned_run(start, end, i0 + BLOCK_M - 1 - left, i0 + right - BLOCK_N + 1, BLOCK_N)
    area = AREA + h * TABLE_ROW
    for e in range(tl.load(area)):
        a, k_base, v_base = _area_entry(area + 2 * e, K, V, b, skb, skh, svb, svh)
        for j0 in range(start, end, BLOCK_N):
            masked = (j0 < first) | (j0 >= stop)  # wholly inside the band: no mask
            acc, row_max, row_sum = _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, j0, a, rows, idx_n, fk, fv,
                                              left, right, KPM, b, N, A, skn, skd, svn, svd, D_K, D_V, seed, bh,
                                              scale, drop_p, masked, HAS_KPM, LOGSIG, DROPOUT, PRECISION, BLOCK_M,
                                              BLOCK_N)
    empty = row_sum == 0  # no allowed key (a NaN sum is not empty: NaN inputs give NaN, as on the reference)
    out = acc / tl.where(empty, 1.0, row_sum)[:, None]
    if DROPOUT:
        out = out / (1.0 - drop_p)
    store_tile(head_base(OUT, b, h, sob, soh), i0, son, sod, idx_m, fv, N, D_V, out.to(OUT.dtype.element_ty))
    lse = tl.where(empty, float("inf"), row_max + tl.log2(tl.where(empty, 1.0, row_sum)))
    tl.store(LSE + bh.to(tl.int64) * N + rows, lse, mask=rows < N)


@triton.jit
def _score_grads(q, k, v, do, lse, delta, rows, cols, left, right, kept, scale, keep, inv_keep, masked,
                 LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """``(dS, dropped p)`` of a tile: the gradient of the scaled scores (before the factor ``scale``) and the
    probabilities that reached the output."""
    s, f2 = _scores(q, k, rows, cols, left, right, kept, scale, masked, LOGSIG, PRECISION)
    p = tl.exp2(f2 - lse[:, None])  # lse = +inf on rows with no key: p = 0
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    if DROPOUT:
        dp = tl.where(keep, dp * inv_keep, 0.0)
        dropped = tl.where(keep, p * inv_keep, 0.0)
    else:
        dropped = p
    ds = p * (dp - delta[:, None])
    if LOGSIG:
        # d log σ(s) / ds = σ(−s) = exp(log σ(s) − s); 0 where masked (also for a non-finite masked score)
        ds = tl.where(p > 0, ds * tl.exp2(f2 - s * LOG2E), 0.0)
    return ds, dropped


@triton.jit
def _bwd_q_tile(grad_q, q, do, lse, delta, k_base, v_base, j0, a, rows, idx_n, fk, fv, left, right, KPM, b, N, A,
                skn, skd, svn, svd, D_K, D_V, seed, bh, scale, drop_p, inv_keep, masked, HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key tile's contribution to a query tile's ``dQ / scale``."""
    cols = j0 + idx_n
    k = load_tile(k_base, j0, skn, skd, idx_n, fk, N, D_K)
    v = load_tile(v_base, j0, svn, svd, idx_n, fv, N, D_V)
    keep = dropout_keep(seed, bh, rows, a * N + j0, N, A * N, drop_p, BLOCK_M, BLOCK_N) if DROPOUT else 0
    ds, _ = _score_grads(q, k, v, do, lse, delta, rows, cols, left, right, _kept_keys(KPM, b, cols, N, HAS_KPM),
                         scale, keep, inv_keep, masked, LOGSIG, DROPOUT, PRECISION)
    return tl.dot(ds.to(k.dtype), k, grad_q, input_precision=PRECISION)


@triton.jit(do_not_specialize=_SIZES)
def band_bwd_q(Q, K, V, KPM, AREA, SEED, OUT, DO, LSE, DELTA, DQ,
               sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
               sgb, sgh, sgn, sgd, H, N, A, left, right, D_K, D_V, num_tiles, TABLE_ROW, scale, drop_p,
               HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr,
               PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``num_tiles · B · H`` programs: ``Δ = rowsum(dO ⊙ O)`` of one query tile (stored for the key pass) and
    its dQ, over the key tiles of its area like forward. DELTA ``(B, H, N)`` and DQ ``(B, H, N, D_K)`` are
    contiguous."""
    tile, bh = program_tile(num_tiles)
    i0 = tile * BLOCK_M
    b = bh // H
    h = bh % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    rows = i0 + idx_m
    q = load_tile(head_base(Q, b, h, sqb, sqh), i0, sqn, sqd, idx_m, fk, N, D_K)
    do = load_tile(head_base(DO, b, h, sgb, sgh), i0, sgn, sgd, idx_m, fv, N, D_V)
    o = load_tile(head_base(OUT, b, h, sob, soh), i0, son, sod, idx_m, fv, N, D_V)
    delta = tl.sum(do.to(ACC) * o.to(ACC), axis=1)
    tl.store(DELTA + bh.to(tl.int64) * N + rows, delta, mask=rows < N)
    lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=rows < N, other=float("inf"))
    seed = tl.load(SEED) if DROPOUT else 0
    inv_keep = 1.0 / (1.0 - drop_p)
    grad_q = tl.zeros((BLOCK_M, BLOCK_DK), dtype=ACC)
    start, end = _band_keys(i0, BLOCK_M, left, right, N)
    first, stop = aligned_run(start, end, i0 + BLOCK_M - 1 - left, i0 + right - BLOCK_N + 1, BLOCK_N)
    area = AREA + h * TABLE_ROW
    for e in range(tl.load(area)):
        a, k_base, v_base = _area_entry(area + 2 * e, K, V, b, skb, skh, svb, svh)
        for j0 in range(start, end, BLOCK_N):
            masked = (j0 < first) | (j0 >= stop)
            grad_q = _bwd_q_tile(grad_q, q, do, lse, delta, k_base, v_base, j0, a, rows, idx_n, fk, fv, left, right,
                                 KPM, b, N, A, skn, skd, svn, svd, D_K, D_V, seed, bh, scale, drop_p, inv_keep,
                                 masked, HAS_KPM, LOGSIG, DROPOUT, PRECISION, BLOCK_M, BLOCK_N)
    store_tile(DQ + bh.to(tl.int64) * N * D_K, i0, D_K, 1, idx_m, fk, N, D_K, (grad_q * scale).to(DQ.dtype.element_ty))


@triton.jit
def _bwd_kv_tile(grad_k, grad_v, k, v, kept, q_base, do_base, i0, j0, a, bh, cols, idx_m, fk, fv, left, right,
                 N, A, sqn, sqd, sgn, sgd, D_K, D_V, LSE, DELTA, seed, scale, drop_p, inv_keep, masked,
                 LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query tile of (query head, slot) pair ``bh``, ``a``: its contribution to the key tile's ``(dK / scale,
    dV)``."""
    rows = i0 + idx_m
    q = load_tile(q_base, i0, sqn, sqd, idx_m, fk, N, D_K)
    do = load_tile(do_base, i0, sgn, sgd, idx_m, fv, N, D_V)
    lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=rows < N, other=float("inf"))
    delta = tl.load(DELTA + bh.to(tl.int64) * N + rows, mask=rows < N, other=0.0)
    keep = dropout_keep(seed, bh, rows, a * N + j0, N, A * N, drop_p, BLOCK_M, BLOCK_N) if DROPOUT else 0
    ds, dropped = _score_grads(q, k, v, do, lse, delta, rows, cols, left, right, kept, scale, keep, inv_keep,
                               masked, LOGSIG, DROPOUT, PRECISION)
    grad_v = tl.dot(tl.trans(dropped).to(do.dtype), do, grad_v, input_precision=PRECISION)
    grad_k = tl.dot(tl.trans(ds).to(q.dtype), q, grad_k, input_precision=PRECISION)
    return grad_k, grad_v


@triton.jit(do_not_specialize=_SIZES)
def band_bwd_kv(Q, K, V, KPM, OWNERS, SEED, DO, LSE, DELTA, DK, DV,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgn, sgd,
                H, N, A, left, right, D_K, D_V, num_tiles, TABLE_ROW, scale, drop_p,
                HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr,
                PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``num_tiles · B · H`` programs: dK and dV of one key tile of head ``g`` (the head that owns the keys),
    over every (query head ``h``, slot ``a``) whose slot holds head ``g`` and, in each, the query tiles whose
    band reaches the key tile. Each key gradient is written by exactly one program: no atomics, the same sums
    in the same order on every run. DK ``(B, H, N, D_K)`` and DV ``(B, H, N, D_V)`` are contiguous."""
    tile, bg = program_tile(num_tiles)
    j0 = tile * BLOCK_N
    b = bg // H
    g = bg % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    cols = j0 + idx_n
    k = load_tile(head_base(K, b, g, skb, skh), j0, skn, skd, idx_n, fk, N, D_K)
    v = load_tile(head_base(V, b, g, svb, svh), j0, svn, svd, idx_n, fv, N, D_V)
    kept = _kept_keys(KPM, b, cols, N, HAS_KPM)
    seed = tl.load(SEED) if DROPOUT else 0
    inv_keep = 1.0 / (1.0 - drop_p)
    grad_k = tl.zeros((BLOCK_N, BLOCK_DK), dtype=ACC)
    grad_v = tl.zeros((BLOCK_N, BLOCK_DV), dtype=ACC)
    start, end = _band_queries(j0, BLOCK_N, left, right, N)
    # query tiles i0 wholly inside the band of this key tile: i0 >= j0 + BLOCK_N − 1 − right, i0 + BLOCK_M − 1 <= j0 + left
    first, stop = aligned_run(start, end, j0 + BLOCK_N - 1 - right, j0 + left - BLOCK_M + 1, BLOCK_M)
    owners = OWNERS + g * TABLE_ROW
    for e in range(tl.load(owners)):
        h = tl.load(owners + 1 + 2 * e)
        a = tl.load(owners + 2 + 2 * e)
        bh = b * H + h
        q_base = head_base(Q, b, h, sqb, sqh)
        do_base = head_base(DO, b, h, sgb, sgh)
        for i0 in range(start, end, BLOCK_M):
            masked = (i0 < first) | (i0 >= stop)
            grad_k, grad_v = _bwd_kv_tile(grad_k, grad_v, k, v, kept, q_base, do_base, i0, j0, a, bh, cols, idx_m,
                                          fk, fv, left, right, N, A, sqn, sqd, sgn, sgd, D_K, D_V, LSE, DELTA,
                                          seed, scale, drop_p, inv_keep, masked, LOGSIG, DROPOUT, PRECISION, BLOCK_M,
                                          BLOCK_N)
    key_base = bg.to(tl.int64) * N
    store_tile(DK + key_base * D_K, j0, D_K, 1, idx_n, fk, N, D_K, (grad_k * scale).to(DK.dtype.element_ty))
    store_tile(DV + key_base * D_V, j0, D_V, 1, idx_n, fv, N, D_V, grad_v.to(DV.dtype.element_ty))
