"""Triton kernels of MTSA's factorised attention (docs/design.md §1, §3): forward, and backward in two passes
(keys: dK, d(v⊙E), dE; queries: dQ), FlashAttention-2's split, with no atomics.

Per head, with weights ``w_ij = σ(R_ij)`` (log-sigmoid scale: the softmax normaliser cancels, so there is no
running maximum) or ``exp(R_ij − max_j R_ij)`` (identity scale: an online maximum), ``R = scale·q·k``, restricted
to the head's band ``lo <= j − i <= hi``::

    N_i = Σ_j w_ij·d_ij·(v⊙E)_j      D_i = Σ_j w_ij·E_j      out_i = N_i / D_i

``d_ij`` is the weights' dropout keep-mask (MTSA Appendix A.3), drawn from Philox by position. ``σ`` is
:func:`.jit_helpers.sigmoid_log2_rcp`: one ``ex2`` and one ``rcp.approx`` of ``1 + 2^(−|x|)`` per score, both on the
special-function unit (the passes are issue-bound: docs/gpu/offline-perf.md, "Predicted time"). Backward takes
``dN = dO / D`` and ``dD = −dN·out`` from a pre-pass (the wrapper: FlashAttention-2's Δ, here per feature) and
computes ``dW_ij = d_ij·(dN_i·(v⊙E)_j) + dD_i·E_j`` and ``dR = dW ⊙ σ(1 − σ)`` (identity: ``dW ⊙ w``).

A launch runs the heads listed in its ``HEADS`` table (``tensorized.head_groups``: the wide-band heads with tiles
aligned to tile multiples; the window heads in a launch of their own with 16-row tiles whose key — in the key pass,
query — tiles start where the band starts, ``BAND_START``, so a narrow band is one tile per row of tiles). Key tiles
outside a query tile's band are never visited; tiles wholly inside it (and inside the sequence) skip the
mask (a branch uniform over the program inside one loop: one loop keeps one wgmma pipeline on sm_90, where three
loops serialised it). Rows past the sequence are never stored; with key padding a select per key column keeps a
non-finite padded key out of the sums (their ``v⊙E`` and ``E`` are 0 anyway — the wrapper zeroes them). Scores are in log₂ units (``scale`` holds ``log₂e``).

**Feature blocks** (issue 52): a head width that is not a power of two runs as a main and a tail block, both powers
of two (``runtime.feature_split``; ``BLOCK_D*`` the width they cover, ``TAIL_D*`` the tail's) — d 150's 160 padded
features as 128 + 32, not one block of 256 (41 % of the tensor work on zeros). Every feature-indexed tile is a tuple of
blocks (``jit_helpers.feature_blocks``): scores are ``q_main·k_mainᵀ + q_tail·k_tailᵀ``, each value-side accumulator
(``N``, ``D``, ``dQ``, ``dK``, ``d(v⊙E)``, ``dE``) a main and a tail block; the tensors are laid out main + tail wide
(``runtime.feature_width``), so the blocks' loads and stores mask rows only. A power-of-two width is a tuple of one
block and the kernels' defaults (``TAIL_D* = 0``, ``QUERY_ROWS = False``) trace exactly the operations of one tile:
such widths compile to the code they compiled to before. With a tail, the loops keep their loop-invariant addresses
in the loop (``disable_licm``: registers for the wider accumulators), the forward's tail products run in a region of
their own (``jit_helpers.tail_region``: mma.sync layouts) and its epilogue stores ``D`` before it divides; the key pass
can take its scores with the queries along the rows (``QUERY_ROWS``: sm_90 at 160 features, where three 160-wide
accumulators on 64 held keys per warpgroup would take 240 registers per thread).

Per score (head dims d_k = d_v = d, FLOPs of ``tl.dot``): forward 2d (scores) + 4d (``N``, ``D``) = 6d; backward
2d + 4d (``dW``) + 6d (``d(v⊙E)``, ``dE``, ``dK``) in the key pass and 2d + 4d + 2d (``dQ``) in the query pass
(FlashAttention-2 with the same two-pass split: 4d forward, 14d backward).
"""

import triton
import triton.language as tl

from .jit_helpers import (aligned_run, dot_blocks, dot_blocks_apart, dot_nt_blocks, dot_nt_blocks_acc,
                          dot_nt_blocks_apart, dropout_key_pass, dropout_keep, feature_blocks, head_base, key_range,
                          load_blocks, online_softmax, program_tile, query_range, scale_blocks, scale_rows_blocks,
                          sigmoid_log2_rcp, store_blocks, zeros_blocks)

#: never specialised on == 1 (a new length must not recompile); the head widths stay specialised: their divisibility
#: by 16 lets the feature masks vectorise the loads (and pipeline them)
_SIZES = ["H", "N", "M", "num_tiles", "num_heads"]


@triton.jit
def _program(num_tiles, num_heads, H, HEADS, BANDS):
    """``(tile, b, h, bh, lo, hi)`` of this program: its tile, batch, head (``HEADS``: the heads of this launch, by
    launch-local index — a launch runs the heads that share its tiles), pair ``b·H + h`` and the head's band."""
    tile, pair = program_tile(num_tiles)
    b = pair // num_heads
    h = tl.load(HEADS + pair % num_heads)
    return tile, b, h, b * H + h, tl.load(BANDS + 2 * h), tl.load(BANDS + 2 * h + 1)


@triton.jit
def _band_mask(rows, cols, lo, hi, M):
    """``lo <= j − i <= hi`` and ``j < M`` over the (rows × cols) tile (a key past the sequence has a zero weight
    anyway, but a non-finite query would make it NaN)."""
    offset = cols[None, :] - rows[:, None]
    return (offset >= lo) & (offset <= hi) & (cols[None, :] < M)


@triton.jit
def _band_mask_t(cols, rows, lo, hi, M):
    """:func:`_band_mask` over the transposed (cols × rows) tile."""
    offset = cols[:, None] - rows[None, :]
    return (offset >= lo) & (offset <= hi) & (cols[:, None] < M)


@triton.jit
def _fwd_tile(num, den, row_max, q, k_base, ve_base, e_base, j0, rows, idx_n, fk, fv, skn, skd, svn, svd, sen, sed,
              M, D_K, D_V, lo, hi, kpm_row, seed, bh, N, scale2, drop_p,
              masked, IDENTITY: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
              PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key tile: ``(num, den, row_max)`` updated with keys ``j0 … j0 + BLOCK_N − 1`` (``q``, ``num``, ``den``
    and the loaded tiles are tuples of feature blocks: :func:`.jit_helpers.feature_blocks`)."""
    cols = j0 + idx_n
    k = load_blocks(k_base, j0, skn, skd, idx_n, fk, M, D_K)
    ve = load_blocks(ve_base, j0, svn, svd, idx_n, fv, M, D_V)
    e = load_blocks(e_base, j0, sen, sed, idx_n, fv, M, D_V)
    s = dot_nt_blocks_apart(q, k, PRECISION) * scale2  # (BLOCK_M, BLOCK_N), log₂ units
    if IDENTITY:  # online maximum over the allowed keys; the accumulators are rescaled
        allowed = _band_mask(rows, cols, lo, hi, M)
        if HAS_KPM:
            allowed = allowed & (tl.load(kpm_row + cols, mask=cols < M, other=1) == 0)[None, :]
        w, alpha, row_max = online_softmax(tl.where(allowed, s, float("-inf")), row_max)
        num = scale_rows_blocks(num, alpha)
        den = scale_rows_blocks(den, alpha)
    else:
        w = sigmoid_log2_rcp(s)
        if masked:  # uniform over the program: tiles wholly inside the band skip the mask
            w = tl.where(_band_mask(rows, cols, lo, hi, M), w, 0.0)
        if HAS_KPM:  # padded keys add 0 anyway (their v⊙E and E are 0): this keeps a non-finite key out
            w = tl.where((tl.load(kpm_row + cols, mask=cols < M, other=1) == 0)[None, :], w, 0.0)
    if DROPOUT:
        dropped = tl.where(dropout_keep(seed, bh, rows, j0, N, M, drop_p, BLOCK_M, BLOCK_N), w / (1.0 - drop_p), 0.0)
    else:
        dropped = w
    num = dot_blocks_apart(dropped, ve, num, PRECISION)
    den = dot_blocks_apart(w, e, den, PRECISION)
    return num, den, row_max


@triton.jit
def _ratio(num, den, threshold):
    """``num / den``, 0 where the denominator underflowed (a NaN denominator is not "underflowed": NaN inputs give
    NaN, as on the reference)."""
    underflow = den <= threshold
    return tl.where(underflow, 0.0, num / tl.where(underflow, 1.0, den))


@triton.jit
def _ratio_blocks(num, den, threshold):
    """:func:`_ratio` per feature block."""
    if len(num) == 1:
        return (_ratio(num[0], den[0], threshold),)
    else:
        return (_ratio(num[0], den[0], threshold), _ratio(num[1], den[1], threshold))


@triton.jit(do_not_specialize=_SIZES)
def tensorized_fwd(Q, K, VE, E, KPM, BANDS, HEADS, SEED, OUT, DEN, ROW_MAX,
                   sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed,
                   sob, soh, son, sod, H, N, M, D_K, D_V, num_tiles, num_heads, scale2, drop_p, threshold,
                   HAS_KPM: tl.constexpr, IDENTITY: tl.constexpr, DROPOUT: tl.constexpr, BAND_START: tl.constexpr,
                   PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DK: tl.constexpr = 0,
                   TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · num_heads`` programs: one query tile of one (batch, head) pair each (the heads listed in
    ``HEADS``; ``BAND_START``: key tiles start where the query tile's band starts, not at a tile multiple). DEN is
    contiguous ``(B·H, N, D_V)`` in ACC; ROW_MAX ``(B·H, N)`` (identity scale: the final row maxima, log₂ units)."""
    tile, b, h, bh, lo, hi = _program(num_tiles, num_heads, H, HEADS, BANDS)
    i0 = tile * BLOCK_M
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = feature_blocks(BLOCK_DK, TAIL_DK)
    fv = feature_blocks(BLOCK_DV, TAIL_DV)
    rows = i0 + idx_m
    q = load_blocks(head_base(Q, b, h, sqb, sqh), i0, sqn, sqd, idx_m, fk, N, D_K)
    k_base = head_base(K, b, h, skb, skh)
    ve_base = head_base(VE, b, h, svb, svh)
    e_base = head_base(E, b, h, seb, seh)
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    num = zeros_blocks(BLOCK_M, BLOCK_DV, TAIL_DV, ACC)
    den = zeros_blocks(BLOCK_M, BLOCK_DV, TAIL_DV, ACC)
    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=ACC)
    start, end = key_range(i0, BLOCK_M, BLOCK_N, lo, hi, N, M, not BAND_START)
    if IDENTITY:
        first, stop = end, end  # every tile masked: the maximum must skip padding and keys past M
    else:
        first, stop = aligned_run(start, end, i0 + BLOCK_M - 1 + lo, i0 + hi - BLOCK_N + 1, BLOCK_N)
    for j0 in tl.range(start, end, BLOCK_N, disable_licm=TAIL_DK + TAIL_DV > 0):
        masked = (j0 < first) | (j0 >= stop) | (j0 + BLOCK_N > M)
        num, den, row_max = _fwd_tile(num, den, row_max, q, k_base, ve_base, e_base, j0, rows, idx_n, fk, fv, skn, skd,
                                      svn, svd, sen, sed, M, D_K, D_V, lo, hi, kpm_row, seed, bh, N, scale2, drop_p,
                                      masked, IDENTITY, HAS_KPM, DROPOUT, PRECISION, BLOCK_M, BLOCK_N)
    if len(fv) == 1:
        out = _ratio_blocks(num, den, threshold)
        store_blocks(head_base(OUT, b, h, sob, soh), i0, son, sod, idx_m, fv, N, D_V, out)
        store_blocks(DEN + bh.to(tl.int64) * N * D_V, i0, D_V, 1, idx_m, fv, N, D_V, den)
    else:  # D first: its pointers are dead before the output's are made (a 160-wide tile's registers)
        store_blocks(DEN + bh.to(tl.int64) * N * D_V, i0, D_V, 1, idx_m, fv, N, D_V, den)
        out = _ratio_blocks(num, den, threshold)
        store_blocks(head_base(OUT, b, h, sob, soh), i0, son, sod, idx_m, fv, N, D_V, out)
    if IDENTITY:
        tl.store(ROW_MAX + bh.to(tl.int64) * N + rows, tl.where(row_max == float("-inf"), 0.0, row_max),
                 mask=rows < N)


@triton.jit
def _weights_t(k, q, rows, cols, lo, hi, M, kpm_row, row_max, scale2, masked, IDENTITY: tl.constexpr,
               HAS_KPM: tl.constexpr, PRECISION: tl.constexpr):
    """The weights of a tile, transposed: ``(BLOCK_N keys, BLOCK_M queries)`` (identity: ``row_max`` the final row
    maxima that forward stored, per query)."""
    s = dot_nt_blocks(k, q, PRECISION) * scale2
    if IDENTITY:  # masked before the exponential: a disallowed score may lie far above the row's maximum
        allowed = _band_mask_t(cols, rows, lo, hi, M)
        if HAS_KPM:
            allowed = allowed & (tl.load(kpm_row + cols, mask=cols < M, other=1) == 0)[:, None]
        return tl.exp2(tl.where(allowed, s - row_max[None, :], float("-inf")))
    else:
        w = sigmoid_log2_rcp(s)
        if masked:
            w = tl.where(_band_mask_t(cols, rows, lo, hi, M), w, 0.0)
        if HAS_KPM:
            w = tl.where((tl.load(kpm_row + cols, mask=cols < M, other=1) == 0)[:, None], w, 0.0)
        return w


@triton.jit
def _weights(q, k, rows, cols, lo, hi, M, kpm_row, row_max, scale2, masked, IDENTITY: tl.constexpr,
             HAS_KPM: tl.constexpr, PRECISION: tl.constexpr):
    """The weights of a tile, ``(BLOCK_M queries, BLOCK_N keys)`` (identity: ``row_max`` the final row maxima that
    forward stored, per query)."""
    s = dot_nt_blocks(q, k, PRECISION) * scale2
    if IDENTITY:
        allowed = _band_mask(rows, cols, lo, hi, M)
        if HAS_KPM:
            allowed = allowed & (tl.load(kpm_row + cols, mask=cols < M, other=1) == 0)[None, :]
        return tl.exp2(tl.where(allowed, s - row_max[:, None], float("-inf")))
    else:
        w = sigmoid_log2_rcp(s)
        if masked:
            w = tl.where(_band_mask(rows, cols, lo, hi, M), w, 0.0)
        if HAS_KPM:
            w = tl.where((tl.load(kpm_row + cols, mask=cols < M, other=1) == 0)[None, :], w, 0.0)
        return w


@triton.jit
def _score_grad(w, grad_w, IDENTITY: tl.constexpr):
    """``dR`` from the weights and their gradient: ``dW ⊙ σ(1 − σ)`` (identity: ``dW ⊙ w``)."""
    if IDENTITY:
        return grad_w * w
    else:
        return grad_w * w * (1.0 - w)


@triton.jit
def _bwd_kv_tile(grad_k, grad_ve, grad_e, k, ve, e, q_base, dn_base, dd_base, i0, j0, cols, idx_m, fk, fv, sqn, sqd,
                 N, M, D_K, D_V, lo, hi, kpm_row, row_max_row, seed, bh, scale2, drop_p,
                 masked, IDENTITY: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query tile's contribution to a key tile's ``(dK / scale, d(v⊙E), dE)``."""
    rows = i0 + idx_m
    q = load_blocks(q_base, i0, sqn, sqd, idx_m, fk, N, D_K)
    d_num = load_blocks(dn_base, i0, D_V, 1, idx_m, fv, N, D_V)
    d_den = load_blocks(dd_base, i0, D_V, 1, idx_m, fv, N, D_V)
    row_max = tl.load(row_max_row + rows, mask=rows < N, other=0.0) if IDENTITY else 0.0
    w = _weights_t(k, q, rows, cols, lo, hi, M, kpm_row, row_max, scale2, masked, IDENTITY, HAS_KPM, PRECISION)
    grad_w = dot_nt_blocks(ve, d_num, PRECISION)  # (BLOCK_N, BLOCK_M)
    if DROPOUT:
        grad_w, dropped = dropout_key_pass(seed, bh, rows, j0, N, M, drop_p, grad_w, w, BLOCK_M, BLOCK_N)
    else:
        dropped = w
    grad_w = dot_nt_blocks_acc(e, d_den, grad_w, PRECISION)
    grad_r = _score_grad(w, grad_w, IDENTITY)
    grad_ve = dot_blocks(dropped, d_num, grad_ve, PRECISION)
    grad_e = dot_blocks(w, d_den, grad_e, PRECISION)
    grad_k = dot_blocks(grad_r, q, grad_k, PRECISION)
    return grad_k, grad_ve, grad_e


@triton.jit
def _dot_blocks_pair(p, v, acc, r, u, acc2, PRECISION: tl.constexpr):
    """``(acc + p·v, acc2 + r·u)`` per block (:func:`.jit_helpers.dot_blocks`), ordered by block: both main
    products, then both tail products."""
    if len(v) == 1:
        return dot_blocks(p, v, acc, PRECISION), dot_blocks(r, u, acc2, PRECISION)
    else:
        a0 = tl.dot(p.to(v[0].dtype), v[0], acc[0], input_precision=PRECISION)
        b0 = tl.dot(r.to(u[0].dtype), u[0], acc2[0], input_precision=PRECISION)
        a1 = tl.dot(p.to(v[1].dtype), v[1], acc[1], input_precision=PRECISION)
        b1 = tl.dot(r.to(u[1].dtype), u[1], acc2[1], input_precision=PRECISION)
        return (a0, a1), (b0, b1)


@triton.jit
def _bwd_kv_tile_query_rows(grad_k, grad_ve, grad_e, k, ve, e, q_base, dn_base, dd_base, i0, j0, cols, idx_m, fk, fv,
                            sqn, sqd, N, M, D_K, D_V, lo, hi, kpm_row, row_max_row, seed, bh, scale2, drop_p,
                            masked, IDENTITY: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                            PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """:func:`_bwd_kv_tile` with the tile's queries along the rows of the scores and ``dW`` (``(BLOCK_M, BLOCK_N)``,
    as the query pass computes them) and the key-side products taking them transposed (``wᵀ·dN``, ``wᵀ·dD``,
    ``dRᵀ·Q``): the held keys are the rows of the accumulators only, so 8 warps split a 64-key tile's accumulators
    by features (a 160-wide head's three accumulators: 120 registers per thread, not 240) while the chained products
    keep 128 streamed queries on their two warpgroups (``runtime.Tiles.query_rows``)."""
    rows = i0 + idx_m
    q = load_blocks(q_base, i0, sqn, sqd, idx_m, fk, N, D_K)
    d_num = load_blocks(dn_base, i0, D_V, 1, idx_m, fv, N, D_V)
    d_den = load_blocks(dd_base, i0, D_V, 1, idx_m, fv, N, D_V)
    row_max = tl.load(row_max_row + rows, mask=rows < N, other=0.0) if IDENTITY else 0.0
    w = _weights(q, k, rows, cols, lo, hi, M, kpm_row, row_max, scale2, masked, IDENTITY, HAS_KPM, PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, bh, rows, j0, N, M, drop_p, BLOCK_M, BLOCK_N)
        dropped = tl.where(keep, w / (1.0 - drop_p), 0.0)
    else:
        dropped = w
    grad_w = dot_nt_blocks(d_num, ve, PRECISION)  # (BLOCK_M, BLOCK_N)
    if DROPOUT:
        grad_w = tl.where(keep, grad_w / (1.0 - drop_p), 0.0)
    grad_w = dot_nt_blocks_acc(d_den, e, grad_w, PRECISION)
    grad_r = _score_grad(w, grad_w, IDENTITY)
    grad_ve, grad_e = _dot_blocks_pair(tl.trans(dropped), d_num, grad_ve, tl.trans(w), d_den, grad_e, PRECISION)
    grad_k = dot_blocks(tl.trans(grad_r), q, grad_k, PRECISION)
    return grad_k, grad_ve, grad_e


@triton.jit(do_not_specialize=_SIZES)
def tensorized_bwd_kv(Q, K, VE, E, KPM, BANDS, HEADS, SEED, ROW_MAX, DN, DD, DK, DVE, DE,
                      sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed,
                      H, N, M, D_K, D_V, num_tiles, num_heads, scale, scale2, drop_p,
                      HAS_KPM: tl.constexpr, IDENTITY: tl.constexpr, DROPOUT: tl.constexpr, BAND_START: tl.constexpr,
                      PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DK: tl.constexpr = 0,
                      TAIL_DV: tl.constexpr = 0, QUERY_ROWS: tl.constexpr = False):
    """``num_tiles · B · num_heads`` programs: the gradients of one key tile (k, v⊙E, E) over the query tiles that
    see it (``HEADS``, ``BAND_START`` as in :func:`tensorized_fwd`: query tiles start where the key tile's band
    starts). DN, DD ``(B·H, N, D_V)`` and DK, DVE, DE ``(B·H, M, ·)`` are contiguous."""
    tile, b, h, bh, lo, hi = _program(num_tiles, num_heads, H, HEADS, BANDS)
    j0 = tile * BLOCK_N
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = feature_blocks(BLOCK_DK, TAIL_DK)
    fv = feature_blocks(BLOCK_DV, TAIL_DV)
    cols = j0 + idx_n
    k = load_blocks(head_base(K, b, h, skb, skh), j0, skn, skd, idx_n, fk, M, D_K)
    ve = load_blocks(head_base(VE, b, h, svb, svh), j0, svn, svd, idx_n, fv, M, D_V)
    e = load_blocks(head_base(E, b, h, seb, seh), j0, sen, sed, idx_n, fv, M, D_V)
    q_base = head_base(Q, b, h, sqb, sqh)
    dn_base = DN + bh.to(tl.int64) * N * D_V
    dd_base = DD + bh.to(tl.int64) * N * D_V
    row_max_row = ROW_MAX + bh.to(tl.int64) * N
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    grad_k = zeros_blocks(BLOCK_N, BLOCK_DK, TAIL_DK, ACC)
    grad_ve = zeros_blocks(BLOCK_N, BLOCK_DV, TAIL_DV, ACC)
    grad_e = zeros_blocks(BLOCK_N, BLOCK_DV, TAIL_DV, ACC)
    start, end = query_range(j0, BLOCK_M, BLOCK_N, lo, hi, N, M, not BAND_START)
    if IDENTITY:
        first, stop = end, end
    else:  # query tiles wholly inside the band of this key tile
        first, stop = aligned_run(start, end, j0 + BLOCK_N - 1 - hi, j0 - BLOCK_M + 1 - lo, BLOCK_M)
    for i0 in tl.range(start, end, BLOCK_M, disable_licm=TAIL_DK + TAIL_DV > 0):
        masked = (i0 < first) | (i0 >= stop) | (j0 + BLOCK_N > M)
        if QUERY_ROWS:
            grad_k, grad_ve, grad_e = _bwd_kv_tile_query_rows(
                grad_k, grad_ve, grad_e, k, ve, e, q_base, dn_base, dd_base, i0, j0, cols, idx_m, fk, fv, sqn, sqd, N,
                M, D_K, D_V, lo, hi, kpm_row, row_max_row, seed, bh, scale2, drop_p, masked, IDENTITY, HAS_KPM, DROPOUT,
                PRECISION, BLOCK_M, BLOCK_N)
        else:
            grad_k, grad_ve, grad_e = _bwd_kv_tile(
                grad_k, grad_ve, grad_e, k, ve, e, q_base, dn_base, dd_base, i0, j0, cols, idx_m, fk, fv, sqn, sqd, N,
                M, D_K, D_V, lo, hi, kpm_row, row_max_row, seed, bh, scale2, drop_p, masked, IDENTITY, HAS_KPM, DROPOUT,
                PRECISION, BLOCK_M, BLOCK_N)
    key_base = bh.to(tl.int64) * M
    store_blocks(DK + key_base * D_K, j0, D_K, 1, idx_n, fk, M, D_K, scale_blocks(grad_k, scale))
    store_blocks(DVE + key_base * D_V, j0, D_V, 1, idx_n, fv, M, D_V, grad_ve)
    store_blocks(DE + key_base * D_V, j0, D_V, 1, idx_n, fv, M, D_V, grad_e)


@triton.jit
def _bwd_q_tile(grad_q, q, d_num, d_den, k_base, ve_base, e_base, j0, rows, idx_n, fk, fv, skn, skd, svn, svd,
                sen, sed, N, M, D_K, D_V, lo, hi, kpm_row, row_max, seed, bh, scale2, drop_p,
                masked, IDENTITY: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key tile's contribution to a query tile's ``dQ / scale``."""
    cols = j0 + idx_n
    k = load_blocks(k_base, j0, skn, skd, idx_n, fk, M, D_K)
    ve = load_blocks(ve_base, j0, svn, svd, idx_n, fv, M, D_V)
    e = load_blocks(e_base, j0, sen, sed, idx_n, fv, M, D_V)
    w = _weights(q, k, rows, cols, lo, hi, M, kpm_row, row_max, scale2, masked, IDENTITY, HAS_KPM, PRECISION)
    grad_w = dot_nt_blocks(d_num, ve, PRECISION)  # (BLOCK_M, BLOCK_N)
    if DROPOUT:
        grad_w = tl.where(dropout_keep(seed, bh, rows, j0, N, M, drop_p, BLOCK_M, BLOCK_N), grad_w / (1.0 - drop_p), 0.0)
    grad_w = dot_nt_blocks_acc(d_den, e, grad_w, PRECISION)
    grad_r = _score_grad(w, grad_w, IDENTITY)
    return dot_blocks(grad_r, k, grad_q, PRECISION)


@triton.jit(do_not_specialize=_SIZES)
def tensorized_bwd_q(Q, K, VE, E, KPM, BANDS, HEADS, SEED, ROW_MAX, DN, DD, DQ,
                     sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, seb, seh, sen, sed,
                     H, N, M, D_K, D_V, num_tiles, num_heads, scale, scale2, drop_p,
                     HAS_KPM: tl.constexpr, IDENTITY: tl.constexpr, DROPOUT: tl.constexpr, BAND_START: tl.constexpr,
                     PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DK: tl.constexpr = 0,
                     TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · num_heads`` programs: the gradient of one query tile over the key tiles it sees
    (``HEADS``, ``BAND_START`` as in :func:`tensorized_fwd`). DN, DD ``(B·H, N, D_V)`` and DQ ``(B·H, N, D_K)`` are
    contiguous."""
    tile, b, h, bh, lo, hi = _program(num_tiles, num_heads, H, HEADS, BANDS)
    i0 = tile * BLOCK_M
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    fk = feature_blocks(BLOCK_DK, TAIL_DK)
    fv = feature_blocks(BLOCK_DV, TAIL_DV)
    rows = i0 + idx_m
    q = load_blocks(head_base(Q, b, h, sqb, sqh), i0, sqn, sqd, idx_m, fk, N, D_K)
    d_num = load_blocks(DN + bh.to(tl.int64) * N * D_V, i0, D_V, 1, idx_m, fv, N, D_V)
    d_den = load_blocks(DD + bh.to(tl.int64) * N * D_V, i0, D_V, 1, idx_m, fv, N, D_V)
    row_max = tl.load(ROW_MAX + bh.to(tl.int64) * N + rows, mask=rows < N, other=0.0) if IDENTITY else 0.0
    k_base = head_base(K, b, h, skb, skh)
    ve_base = head_base(VE, b, h, svb, svh)
    e_base = head_base(E, b, h, seb, seh)
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    grad_q = zeros_blocks(BLOCK_M, BLOCK_DK, TAIL_DK, ACC)
    start, end = key_range(i0, BLOCK_M, BLOCK_N, lo, hi, N, M, not BAND_START)
    if IDENTITY:
        first, stop = end, end
    else:
        first, stop = aligned_run(start, end, i0 + BLOCK_M - 1 + lo, i0 + hi - BLOCK_N + 1, BLOCK_N)
    for j0 in tl.range(start, end, BLOCK_N, disable_licm=TAIL_DK + TAIL_DV > 0):
        masked = (j0 < first) | (j0 >= stop) | (j0 + BLOCK_N > M)
        grad_q = _bwd_q_tile(grad_q, q, d_num, d_den, k_base, ve_base, e_base, j0, rows, idx_n, fk, fv, skn, skd, svn,
                             svd, sen, sed, N, M, D_K, D_V, lo, hi, kpm_row, row_max, seed, bh, scale2, drop_p,
                             masked, IDENTITY, HAS_KPM, DROPOUT, PRECISION, BLOCK_M, BLOCK_N)
    store_blocks(DQ + bh.to(tl.int64) * N * D_K, i0, D_K, 1, idx_m, fk, N, D_K, scale_blocks(grad_q, scale))
