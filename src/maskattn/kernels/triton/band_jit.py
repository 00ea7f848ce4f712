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

**Feature blocks** (issue 52; MTSA's ``tensorized_jit`` first): a head width that is not a power of two runs as
a main and a tail block, both powers of two (``runtime.feature_split``; ``BLOCK_D*`` the width they cover,
``TAIL_D*`` the tail's) — d 150's 160 padded features as 128 + 32, not one block of 256. Every feature-indexed tile
(``q``, ``k``, ``v``, ``dO``, ``O`` and the accumulators ``acc``, ``dQ``, ``dK``, ``dV``) is a tuple of blocks
(``jit_helpers.feature_blocks``): scores are ``q_main·k_mainᵀ + q_tail·k_tailᵀ`` (``dP`` likewise over ``dO``,
``v``), ``Δ`` sums both blocks; the tensors are laid out main + tail wide (``runtime.feature_width``), so the blocks'
loads and stores mask rows only. A power-of-two width is a tuple of one block, and the kernels' defaults
(``TAIL_D* = 0``) trace exactly the operations of one tile: such widths compile to the code of before. With a tail
the loops keep their loop-invariant addresses in the loop (``disable_licm``: registers for the wider tiles), and
the forward's and the query pass's tail products run in regions of their own (``jit_helpers.tail_region``: the
mma.sync classes' layouts; the key pass keeps them linked).

Per score (head dims d, FLOPs of ``tl.dot``): forward 4d, backward 6d (query pass) + 8d (key pass: the scores and
``dP`` again, ``dV``, ``dK``), as FlashAttention-2 with the same split; transcendentals: 1 ``exp2`` per score and
pass (log-sigmoid scores: 3).
"""

import triton
import triton.language as tl

from .jit_helpers import (LOG2E, aligned_run, dot_blocks, dot_blocks_apart, dot_nt_blocks, dot_nt_blocks_apart,
                          dropout_keep, feature_blocks, head_base, load_blocks, log_sigmoid, online_softmax,
                          program_tile, scale_blocks, scale_rows_blocks, store_blocks, zeros_blocks)

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
def _scores(q, k, rows, cols, left, right, kept, scale, masked, LOGSIG: tl.constexpr, PRECISION: tl.constexpr,
            APART: tl.constexpr):
    """``(s, f2)`` of a (rows × cols) tile of the feature blocks ``q``, ``k`` (:func:`.jit_helpers.feature_blocks`):
    the scaled scores (natural units with ``LOGSIG``, else log₂ units) and the modified scores in log₂ units,
    ``−inf`` outside the band (``masked``: the tile crosses its edge) and at keys not ``kept`` (a select: a
    non-finite padded key stays out, as on the reference backend). ``APART``: the tail block's product in a region
    of its own (:func:`.jit_helpers.tail_region`)."""
    if APART:
        qk = dot_nt_blocks_apart(q, k, PRECISION)
    else:
        qk = dot_nt_blocks(q, k, PRECISION)
    if LOGSIG:
        s = qk * scale
        f2 = tl.where(kept[None, :], log_sigmoid(s) * LOG2E, float("-inf"))
    else:
        s = qk * (scale * LOG2E)  # the scores in log₂ units
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
    """One key tile of slot ``a``: the updated ``(acc, row_max, row_sum)`` (``q``, ``acc`` and the loaded tiles are
    tuples of feature blocks; the tail's products in regions of their own: :func:`.jit_helpers.tail_region`)."""
    cols = j0 + idx_n
    k = load_blocks(k_base, j0, skn, skd, idx_n, fk, N, D_K)
    v = load_blocks(v_base, j0, svn, svd, idx_n, fv, N, D_V)
    _, f2 = _scores(q, k, rows, cols, left, right, _kept_keys(KPM, b, cols, N, HAS_KPM), scale, masked, LOGSIG,
                    PRECISION, True)
    p, alpha, row_max = online_softmax(f2, row_max)
    row_sum = row_sum * alpha + tl.sum(p, axis=1)
    if DROPOUT:  # the dropped probabilities reach the output, the undropped ones the normaliser
        p = tl.where(dropout_keep(seed, bh, rows, a * N + j0, N, A * N, drop_p, BLOCK_M, BLOCK_N), p, 0.0)
    acc = dot_blocks_apart(p.to(v[0].dtype), v, scale_rows_blocks(acc, alpha), PRECISION)
    return acc, row_max, row_sum


@triton.jit
def _normalised(acc, row_sum, empty, DROPOUT: tl.constexpr, drop_p):
    """The output rows ``acc / row_sum`` (``/ (1 − p)`` with dropout): 0 on ``empty`` rows, whose ``acc`` is 0."""
    out = acc / tl.where(empty, 1.0, row_sum)[:, None]
    if DROPOUT:
        out = out / (1.0 - drop_p)
    return out


@triton.jit
def _normalised_blocks(acc, row_sum, empty, DROPOUT: tl.constexpr, drop_p):
    """:func:`_normalised` per feature block."""
    if len(acc) == 1:
        return (_normalised(acc[0], row_sum, empty, DROPOUT, drop_p),)
    else:
        return (_normalised(acc[0], row_sum, empty, DROPOUT, drop_p),
                _normalised(acc[1], row_sum, empty, DROPOUT, drop_p))


@triton.jit
def _row_dot_blocks(a, b, ACC: tl.constexpr):
    """``Σ_features a ⊙ b`` per row of two blocked tiles, in ``ACC`` (``Δ = rowsum(dO ⊙ O)``)."""
    total = tl.sum(a[0].to(ACC) * b[0].to(ACC), axis=1)
    if len(a) > 1:
        total += tl.sum(a[1].to(ACC) * b[1].to(ACC), axis=1)
    return total


@triton.jit(do_not_specialize=_SIZES)
def band_fwd(Q, K, V, KPM, AREA, SEED, OUT, LSE,
             sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
             H, N, A, left, right, D_K, D_V, num_tiles, TABLE_ROW, scale, drop_p,
             HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
             ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr,
             BLOCK_DV: tl.constexpr, TAIL_DK: tl.constexpr = 0, TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · H`` programs: one query tile of one (batch, head) pair; online softmax over the band
    keys of every slot of the head's area. LSE is contiguous ``(B, H, N)``, log₂ units (``+inf`` for rows with no
    key)."""
    tile, bh = program_tile(num_tiles)
    i0 = tile * BLOCK_M
    b = bh // H
    h = bh % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = feature_blocks(BLOCK_DK, TAIL_DK)
    fv = feature_blocks(BLOCK_DV, TAIL_DV)
    rows = i0 + idx_m
    q = load_blocks(head_base(Q, b, h, sqb, sqh), i0, sqn, sqd, idx_m, fk, N, D_K)
    seed = tl.load(SEED) if DROPOUT else 0
    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=ACC)
    row_sum = tl.zeros((BLOCK_M,), dtype=ACC)
    acc = zeros_blocks(BLOCK_M, BLOCK_DV, TAIL_DV, ACC)
    start, end = _band_keys(i0, BLOCK_M, left, right, N)
    first, stop = aligned_run(start, end, i0 + BLOCK_M - 1 - left, i0 + right - BLOCK_N + 1, BLOCK_N)
    area = AREA + h * TABLE_ROW
    for e in range(tl.load(area)):
        a, k_base, v_base = _area_entry(area + 2 * e, K, V, b, skb, skh, svb, svh)
        for j0 in tl.range(start, end, BLOCK_N, disable_licm=TAIL_DK + TAIL_DV > 0):
            masked = (j0 < first) | (j0 >= stop)  # wholly inside the band: no mask
            acc, row_max, row_sum = _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, j0, a, rows, idx_n, fk, fv,
                                              left, right, KPM, b, N, A, skn, skd, svn, svd, D_K, D_V, seed, bh,
                                              scale, drop_p, masked, HAS_KPM, LOGSIG, DROPOUT, PRECISION, BLOCK_M,
                                              BLOCK_N)
    empty = row_sum == 0  # no allowed key (a NaN sum is not empty: NaN inputs give NaN, as on the reference)
    out = _normalised_blocks(acc, row_sum, empty, DROPOUT, drop_p)
    store_blocks(head_base(OUT, b, h, sob, soh), i0, son, sod, idx_m, fv, N, D_V, out)
    lse = tl.where(empty, float("inf"), row_max + tl.log2(tl.where(empty, 1.0, row_sum)))
    tl.store(LSE + bh.to(tl.int64) * N + rows, lse, mask=rows < N)


@triton.jit
def _score_grads(q, k, v, do, lse, delta, rows, cols, left, right, kept, scale, keep, inv_keep, masked,
                 LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, APART: tl.constexpr):
    """``(dS, dropped p)`` of a tile (``q``, ``k``, ``v``, ``do`` tuples of feature blocks): the gradient of the
    scaled scores (before the factor ``scale``) and the probabilities that reached the output. ``APART``: the
    scores' tail product in a region of its own (:func:`_scores`; the query pass)."""
    s, f2 = _scores(q, k, rows, cols, left, right, kept, scale, masked, LOGSIG, PRECISION, APART)
    p = tl.exp2(f2 - lse[:, None])  # lse = +inf on rows with no key: p = 0
    dp = dot_nt_blocks(do, v, PRECISION)
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
    """One key tile's contribution to a query tile's ``dQ / scale`` (feature blocks; the tail's products of the
    scores and of ``dQ`` in regions of their own — :func:`.jit_helpers.tail_region`: on the mma.sync classes,
    linked, they put a 64-row tile's 8 warps along its rows and spilled 1.4 KB or ran products twice)."""
    cols = j0 + idx_n
    k = load_blocks(k_base, j0, skn, skd, idx_n, fk, N, D_K)
    v = load_blocks(v_base, j0, svn, svd, idx_n, fv, N, D_V)
    keep = dropout_keep(seed, bh, rows, a * N + j0, N, A * N, drop_p, BLOCK_M, BLOCK_N) if DROPOUT else 0
    ds, _ = _score_grads(q, k, v, do, lse, delta, rows, cols, left, right, _kept_keys(KPM, b, cols, N, HAS_KPM),
                         scale, keep, inv_keep, masked, LOGSIG, DROPOUT, PRECISION, True)
    return dot_blocks_apart(ds, k, grad_q, PRECISION)


@triton.jit(do_not_specialize=_SIZES)
def band_bwd_q(Q, K, V, KPM, AREA, SEED, OUT, DO, LSE, DELTA, DQ,
               sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
               sgb, sgh, sgn, sgd, H, N, A, left, right, D_K, D_V, num_tiles, TABLE_ROW, scale, drop_p,
               HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr,
               PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DK: tl.constexpr = 0,
               TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · H`` programs: ``Δ = rowsum(dO ⊙ O)`` of one query tile (stored for the key pass) and
    its dQ, over the key tiles of its area like forward. DELTA ``(B, H, N)`` and DQ ``(B, H, N, D_K)`` are
    contiguous."""
    tile, bh = program_tile(num_tiles)
    i0 = tile * BLOCK_M
    b = bh // H
    h = bh % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = feature_blocks(BLOCK_DK, TAIL_DK)
    fv = feature_blocks(BLOCK_DV, TAIL_DV)
    rows = i0 + idx_m
    q = load_blocks(head_base(Q, b, h, sqb, sqh), i0, sqn, sqd, idx_m, fk, N, D_K)
    do = load_blocks(head_base(DO, b, h, sgb, sgh), i0, sgn, sgd, idx_m, fv, N, D_V)
    o = load_blocks(head_base(OUT, b, h, sob, soh), i0, son, sod, idx_m, fv, N, D_V)
    delta = _row_dot_blocks(do, o, ACC)
    tl.store(DELTA + bh.to(tl.int64) * N + rows, delta, mask=rows < N)
    lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=rows < N, other=float("inf"))
    seed = tl.load(SEED) if DROPOUT else 0
    inv_keep = 1.0 / (1.0 - drop_p)
    grad_q = zeros_blocks(BLOCK_M, BLOCK_DK, TAIL_DK, ACC)
    start, end = _band_keys(i0, BLOCK_M, left, right, N)
    first, stop = aligned_run(start, end, i0 + BLOCK_M - 1 - left, i0 + right - BLOCK_N + 1, BLOCK_N)
    area = AREA + h * TABLE_ROW
    for e in range(tl.load(area)):
        a, k_base, v_base = _area_entry(area + 2 * e, K, V, b, skb, skh, svb, svh)
        for j0 in tl.range(start, end, BLOCK_N, disable_licm=TAIL_DK + TAIL_DV > 0):
            masked = (j0 < first) | (j0 >= stop)
            grad_q = _bwd_q_tile(grad_q, q, do, lse, delta, k_base, v_base, j0, a, rows, idx_n, fk, fv, left, right,
                                 KPM, b, N, A, skn, skd, svn, svd, D_K, D_V, seed, bh, scale, drop_p, inv_keep,
                                 masked, HAS_KPM, LOGSIG, DROPOUT, PRECISION, BLOCK_M, BLOCK_N)
    store_blocks(DQ + bh.to(tl.int64) * N * D_K, i0, D_K, 1, idx_m, fk, N, D_K, scale_blocks(grad_q, scale))


@triton.jit
def _bwd_kv_tile(grad_k, grad_v, k, v, kept, q_base, do_base, i0, j0, a, bh, cols, idx_m, fk, fv, left, right,
                 N, A, sqn, sqd, sgn, sgd, D_K, D_V, LSE, DELTA, seed, scale, drop_p, inv_keep, masked,
                 LOGSIG: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query tile of (query head, slot) pair ``bh``, ``a``: its contribution to the key tile's ``(dK / scale,
    dV)`` (feature blocks; the tail's products stay linked here: apart, they recomputed the probabilities per
    block on the mma.sync classes)."""
    rows = i0 + idx_m
    q = load_blocks(q_base, i0, sqn, sqd, idx_m, fk, N, D_K)
    do = load_blocks(do_base, i0, sgn, sgd, idx_m, fv, N, D_V)
    lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=rows < N, other=float("inf"))
    delta = tl.load(DELTA + bh.to(tl.int64) * N + rows, mask=rows < N, other=0.0)
    keep = dropout_keep(seed, bh, rows, a * N + j0, N, A * N, drop_p, BLOCK_M, BLOCK_N) if DROPOUT else 0
    ds, dropped = _score_grads(q, k, v, do, lse, delta, rows, cols, left, right, kept, scale, keep, inv_keep,
                               masked, LOGSIG, DROPOUT, PRECISION, False)
    grad_v = dot_blocks(tl.trans(dropped), do, grad_v, PRECISION)
    grad_k = dot_blocks(tl.trans(ds), q, grad_k, PRECISION)
    return grad_k, grad_v


@triton.jit(do_not_specialize=_SIZES)
def band_bwd_kv(Q, K, V, KPM, OWNERS, SEED, DO, LSE, DELTA, DK, DV,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgn, sgd,
                H, N, A, left, right, D_K, D_V, num_tiles, TABLE_ROW, scale, drop_p,
                HAS_KPM: tl.constexpr, LOGSIG: tl.constexpr, DROPOUT: tl.constexpr,
                PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DK: tl.constexpr = 0,
                TAIL_DV: tl.constexpr = 0):
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
    fk = feature_blocks(BLOCK_DK, TAIL_DK)
    fv = feature_blocks(BLOCK_DV, TAIL_DV)
    cols = j0 + idx_n
    k = load_blocks(head_base(K, b, g, skb, skh), j0, skn, skd, idx_n, fk, N, D_K)
    v = load_blocks(head_base(V, b, g, svb, svh), j0, svn, svd, idx_n, fv, N, D_V)
    kept = _kept_keys(KPM, b, cols, N, HAS_KPM)
    seed = tl.load(SEED) if DROPOUT else 0
    inv_keep = 1.0 / (1.0 - drop_p)
    grad_k = zeros_blocks(BLOCK_N, BLOCK_DK, TAIL_DK, ACC)
    grad_v = zeros_blocks(BLOCK_N, BLOCK_DV, TAIL_DV, ACC)
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
        for i0 in tl.range(start, end, BLOCK_M, disable_licm=TAIL_DK + TAIL_DV > 0):
            masked = (i0 < first) | (i0 >= stop)
            grad_k, grad_v = _bwd_kv_tile(grad_k, grad_v, k, v, kept, q_base, do_base, i0, j0, a, bh, cols, idx_m,
                                          fk, fv, left, right, N, A, sqn, sqd, sgn, sgd, D_K, D_V, LSE, DELTA,
                                          seed, scale, drop_p, inv_keep, masked, LOGSIG, DROPOUT, PRECISION, BLOCK_M,
                                          BLOCK_N)
    key_base = bg.to(tl.int64) * N
    store_blocks(DK + key_base * D_K, j0, D_K, 1, idx_n, fk, N, D_K, scale_blocks(grad_k, scale))
    store_blocks(DV + key_base * D_V, j0, D_V, 1, idx_n, fv, N, D_V, grad_v)
