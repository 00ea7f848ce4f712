"""Triton kernels of DMAN attention (MAN Eq. 4 with the dynamic mask of Eq. 12; docs/design.md §1, §3): forward,
and backward in two passes without atomics (keys: dK, dV; queries: dQ and the gradient of the mask's logits),
FlashAttention-2's split.

Per (batch, head) pair, with ``z_ij = a_i + U_h + P[clip(t − s, −D, D) + D]`` (``t = q_offset + i``, ``s = j``)::

    log M_ij = max(logσ(z_ij), log ε)        score_ij = scale·q_i·k_j + log M_ij
    p_ij = exp(score_ij − lse_i)             out_i = Σ_j p_ij·d_ij·v_j

over the allowed keys (causal ``s <= t``, not padded), ``d_ij`` the inverted-dropout keep-mask drawn from Philox
by position (forward accumulates the dropped ``p`` into the output, the undropped one into the normaliser).
The mask enters in log form, so the softmax stays exact when ``σ(z)`` underflows. Backward uses FlashAttention-2's
``dS = p ⊙ (d ⊙ dO·vᵀ − Δ)`` with ``Δ_i = dO_i·out_i`` (computed before the kernels) and
``dz = dS ⊙ (1 − σ(z))`` (0 where the floor ``ε`` holds), with ``1 − σ(z) = exp(logσ(z) − z)``.

Tiles are square (``BLOCK`` queries × ``BLOCK`` keys). A key tile at relative block offset ``r = query tile −
key tile`` covers the distances ``r·BLOCK + q_offset − (BLOCK − 1) … r·BLOCK + q_offset + (BLOCK − 1)``,
whatever the query tile; ``R_LO <= r <= R_HI`` are the *near* offsets, where some distance lies inside
``(−D, D)``. Beyond them a tile is *far*: every distance is ``>= D`` (far left, ``r > R_HI``) or ``<= −D``
(far right, ``r < R_LO``), ``z`` is constant along each row and the tile uses one gate value per row (no
transcendental per score). The key loop (and the query loop of the key pass) runs far-left, near and far-right
ranges separately, each an inlined, constexpr-specialised tile function.

The query pass writes ``Σ_j dz_ij`` per row, per near tile the ``2·BLOCK`` diagonal sums of ``dz`` (slot ``r −
R_MIN``, column ``c = (i − j) + BLOCK − 1`` within the tile, the last column 0; one ``tl.gather``) and one sum
per far side; the wrapper reduces them to the gradients of ``a``, ``P`` and ``U`` with deterministic PyTorch sums.
"""

import triton
import triton.language as tl

from .jit_helpers import dropout_keep, log_sigmoid, online_softmax


@triton.jit
def _near_gate(row_bias, rows, cols, P, sp, D, q_offset, log_floor, HAS_FLOOR: tl.constexpr):
    """``(log M, d log M / dz)`` of a near tile, from ``z = row_bias + P[clip(t − s) + D]`` (in row_bias's
    type): ``logσ(z)`` (floored) and ``1 − σ(z) = exp(logσ(z) − z)`` (0 where floored)."""
    delta = q_offset + rows[:, None] - cols[None, :]
    index = tl.minimum(tl.maximum(delta, -D), D) + D
    return _gate(row_bias[:, None] + tl.load(P + index * sp).to(row_bias.dtype), log_floor, HAS_FLOOR)


@triton.jit
def _far_gate(row_bias, edge, log_floor, HAS_FLOOR: tl.constexpr):
    """``(log M, d log M / dz)`` per row for the far tiles of one side (``edge`` = ``P[2D]`` or ``P[0]``)."""
    return _gate(row_bias + edge.to(row_bias.dtype), log_floor, HAS_FLOOR)


@triton.jit
def _gate(z, log_floor, HAS_FLOOR: tl.constexpr):
    """``(log M, d log M / dz)`` of logits ``z``: ``logσ(z)`` (floored at ``log ε``) and ``1 − σ(z) =
    exp(logσ(z) − z)`` (0 where floored: a floored ``log M`` is constant)."""
    log_m = log_sigmoid(z)
    grad = tl.exp(log_m - z)
    if HAS_FLOOR:
        floored = log_m < log_floor
        log_m = tl.where(floored, log_floor, log_m)
        grad = tl.where(floored, 0.0, grad)
    return log_m, grad


@triton.jit
def _allowed(rows, cols, N, M, q_offset, kpm_row, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr):
    """The tile's (rows × cols) mask: inside the sequences, causal (``s <= t``), not a padded key."""
    allowed = (rows[:, None] < N) & (cols[None, :] < M)
    if CAUSAL:
        allowed = allowed & (cols[None, :] <= q_offset + rows[:, None])
    if HAS_KPM:
        padded = tl.load(kpm_row + cols, mask=cols < M, other=1)
        allowed = allowed & (padded == 0)[None, :]
    return allowed


@triton.jit
def _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, j0, rows, fk, fv, row_bias, far_log_m, P, sp, D, q_offset,
              log_floor, skn, skd, svn, svd, N, M, D_K, D_V, kpm_row, seed, bh, scale, drop_p,
              NEAR: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr,
              DROPOUT: tl.constexpr, PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    """One key tile of the online softmax: returns the updated ``(acc, row_max, row_sum)``."""
    cols = j0 + tl.arange(0, BLOCK)
    in_keys = cols[:, None] < M
    k = tl.load(k_base + cols[:, None] * skn + fk[None, :] * skd, mask=in_keys & (fk[None, :] < D_K), other=0.0)
    v = tl.load(v_base + cols[:, None] * svn + fv[None, :] * svd, mask=in_keys & (fv[None, :] < D_V), other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(acc.dtype) * scale
    if NEAR:
        log_m, _ = _near_gate(row_bias, rows, cols, P, sp, D, q_offset, log_floor, HAS_FLOOR)
        score = s + log_m
    else:
        score = s + far_log_m[:, None]
    allowed = _allowed(rows, cols, N, M, q_offset, kpm_row, CAUSAL, HAS_KPM)
    p, alpha, new_max = online_softmax(tl.where(allowed, score, float("-inf")), row_max)
    row_sum = row_sum * alpha + tl.sum(p, axis=1)
    if DROPOUT:
        keep = dropout_keep(seed, bh, rows, cols, N, M, drop_p)
        p = tl.where(keep, p / (1.0 - drop_p), 0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION).to(acc.dtype)
    return acc, new_max, row_sum


@triton.jit
def dman_fwd(Q, K, V, A, P, U, KPM, SEED, OUT, LSE,
             sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod, sab, san, sp, su,
             H, N, M, D_K, D_V, D, q_offset, R_LO, R_HI, scale, drop_p, log_floor,
             CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr, DROPOUT: tl.constexpr,
             PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_DK: tl.constexpr,
             BLOCK_DV: tl.constexpr):
    """Grid ``(⌈N / BLOCK⌉, B·H)``: one query tile of one (batch, head) pair per program. LSE is contiguous
    ``(B·H, N)`` in ACC (0 for rows with no allowed key, whose output is 0)."""
    qt = tl.program_id(0)
    i0 = qt * BLOCK
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = i0 + tl.arange(0, BLOCK)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqn + fk[None, :] * sqd,
                mask=(rows[:, None] < N) & (fk[None, :] < D_K), other=0.0)
    row_bias = (tl.load(A + b.to(tl.int64) * sab + rows * san, mask=rows < N, other=0.0).to(ACC)
                + tl.load(U + h * su).to(ACC))
    left_log_m, _ = _far_gate(row_bias, tl.load(P + 2 * D * sp), log_floor, HAS_FLOOR)  # t − s >= D
    right_log_m, _ = _far_gate(row_bias, tl.load(P), log_floor, HAS_FLOOR)  # t − s <= −D
    k_base = K + b.to(tl.int64) * skb + h * skh
    v_base = V + b.to(tl.int64) * svb + h * svh
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    acc = tl.zeros((BLOCK, BLOCK_DV), dtype=ACC)
    row_max = tl.full((BLOCK,), float("-inf"), dtype=ACC)
    row_sum = tl.zeros((BLOCK,), dtype=ACC)
    key_end = M
    if CAUSAL:  # key tiles wholly in the future are skipped
        key_end = tl.minimum(M, q_offset + tl.minimum(i0 + BLOCK, N))
    near_start = tl.maximum((qt - R_HI) * BLOCK, 0)
    near_end = tl.minimum(tl.maximum((qt - R_LO + 1) * BLOCK, 0), key_end)
    far_right_start = tl.maximum((qt - R_LO + 1) * BLOCK, 0)
    for j0 in range(0, tl.minimum(near_start, key_end), BLOCK):  # far left: one gate value per row
        acc, row_max, row_sum = _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, j0, rows, fk, fv, row_bias,
                                          left_log_m, P, sp, D, q_offset, log_floor, skn, skd, svn, svd, N, M,
                                          D_K, D_V, kpm_row, seed, bh, scale, drop_p, False, CAUSAL, HAS_KPM,
                                          HAS_FLOOR, DROPOUT, PRECISION, BLOCK)
    for j0 in range(near_start, near_end, BLOCK):
        acc, row_max, row_sum = _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, j0, rows, fk, fv, row_bias,
                                          left_log_m, P, sp, D, q_offset, log_floor, skn, skd, svn, svd, N, M,
                                          D_K, D_V, kpm_row, seed, bh, scale, drop_p, True, CAUSAL, HAS_KPM,
                                          HAS_FLOOR, DROPOUT, PRECISION, BLOCK)
    for j0 in range(far_right_start, key_end, BLOCK):  # far right
        acc, row_max, row_sum = _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, j0, rows, fk, fv, row_bias,
                                          right_log_m, P, sp, D, q_offset, log_floor, skn, skd, svn, svd, N, M,
                                          D_K, D_V, kpm_row, seed, bh, scale, drop_p, False, CAUSAL, HAS_KPM,
                                          HAS_FLOOR, DROPOUT, PRECISION, BLOCK)
    nonempty = row_sum > 0
    out = tl.where(nonempty[:, None], acc / tl.where(nonempty, row_sum, 1.0)[:, None], 0.0)
    tl.store(OUT + b.to(tl.int64) * sob + h * soh + rows[:, None] * son + fv[None, :] * sod,
             out.to(OUT.dtype.element_ty), mask=(rows[:, None] < N) & (fv[None, :] < D_V))
    lse = tl.where(nonempty, row_max + tl.log(tl.where(nonempty, row_sum, 1.0)), 0.0)
    tl.store(LSE + bh.to(tl.int64) * N + rows, lse, mask=rows < N)


@triton.jit
def _bwd_tile(q, k, v, do, lse, delta, rows, cols, log_m, N, M, q_offset, kpm_row, seed, bh, scale, drop_p,
              CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """``(dS, dropped p)`` of a tile: the gradient of the scores and the probabilities that weighted ``v``."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(lse.dtype) * scale
    allowed = _allowed(rows, cols, N, M, q_offset, kpm_row, CAUSAL, HAS_KPM)
    p = tl.where(allowed, tl.exp(tl.where(allowed, s + log_m - lse[:, None], 0.0)), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION).to(lse.dtype)
    if DROPOUT:
        keep = dropout_keep(seed, bh, rows, cols, N, M, drop_p)
        dp = tl.where(keep, dp / (1.0 - drop_p), 0.0)
        dropped = tl.where(keep, p / (1.0 - drop_p), 0.0)
    else:
        dropped = p
    return p * (dp - delta[:, None]), dropped


@triton.jit
def _bwd_kv_tile(grad_k, grad_v, k, v, q_base, do_base, i0, cols, fk, fv, a_row, u_h, edge, P, sp, D, q_offset,
                 log_floor, LSE, DELTA, san, sqn, sqd, sgn, sgd, N, M, D_K, D_V, kpm_row, seed, bh, scale, drop_p,
                 NEAR: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr,
                 DROPOUT: tl.constexpr, PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    """One query tile's contribution to a key tile's ``(dK / scale, dV)``."""
    rows = i0 + tl.arange(0, BLOCK)
    in_rows = rows < N
    q = tl.load(q_base + rows[:, None] * sqn + fk[None, :] * sqd, mask=in_rows[:, None] & (fk[None, :] < D_K),
                other=0.0)
    do = tl.load(do_base + rows[:, None] * sgn + fv[None, :] * sgd, mask=in_rows[:, None] & (fv[None, :] < D_V),
                 other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=in_rows, other=0.0)
    delta = tl.load(DELTA + bh.to(tl.int64) * N + rows, mask=in_rows, other=0.0)
    row_bias = tl.load(a_row + rows * san, mask=in_rows, other=0.0).to(lse.dtype) + u_h
    if NEAR:
        log_m, _ = _near_gate(row_bias, rows, cols, P, sp, D, q_offset, log_floor, HAS_FLOOR)
    else:
        far_log_m, _ = _far_gate(row_bias, edge, log_floor, HAS_FLOOR)
        log_m = far_log_m[:, None]
    ds, dropped = _bwd_tile(q, k, v, do, lse, delta, rows, cols, log_m, N, M, q_offset, kpm_row, seed, bh, scale,
                            drop_p, CAUSAL, HAS_KPM, DROPOUT, PRECISION)
    grad_v += tl.dot(tl.trans(dropped).to(do.dtype), do, input_precision=PRECISION).to(grad_v.dtype)
    grad_k += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION).to(grad_k.dtype)
    return grad_k, grad_v


@triton.jit
def dman_bwd_kv(Q, K, V, A, P, U, KPM, SEED, LSE, DELTA, DO, DK, DV,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgn, sgd, sab, san, sp, su,
                H, N, M, D_K, D_V, D, q_offset, R_LO, R_HI, scale, drop_p, log_floor,
                CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr, DROPOUT: tl.constexpr,
                PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_DK: tl.constexpr,
                BLOCK_DV: tl.constexpr):
    """Grid ``(⌈M / BLOCK⌉, B·H)``: the gradients of one key tile (k, v), over the query tiles that see it
    (far right of it, near, far left). DK, DV are contiguous ``(B, H, M, ·)``."""
    kt = tl.program_id(0)
    j0 = kt * BLOCK
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    cols = j0 + tl.arange(0, BLOCK)
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    in_keys = cols[:, None] < M
    k = tl.load(K + b.to(tl.int64) * skb + h * skh + cols[:, None] * skn + fk[None, :] * skd,
                mask=in_keys & (fk[None, :] < D_K), other=0.0)
    v = tl.load(V + b.to(tl.int64) * svb + h * svh + cols[:, None] * svn + fv[None, :] * svd,
                mask=in_keys & (fv[None, :] < D_V), other=0.0)
    q_base = Q + b.to(tl.int64) * sqb + h * sqh
    do_base = DO + b.to(tl.int64) * sgb + h * sgh
    a_row = A + b.to(tl.int64) * sab
    u_h = tl.load(U + h * su).to(ACC)
    left_edge = tl.load(P + 2 * D * sp)
    right_edge = tl.load(P)
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    grad_k = tl.zeros((BLOCK, BLOCK_DK), dtype=ACC)
    grad_v = tl.zeros((BLOCK, BLOCK_DV), dtype=ACC)
    query_start = 0
    if CAUSAL:  # query tiles wholly before the key tile are skipped
        query_start = (tl.maximum(j0 - q_offset, 0) // BLOCK) * BLOCK
    near_start = tl.maximum(query_start, tl.maximum((kt + R_LO) * BLOCK, 0))
    far_left_start = tl.maximum(query_start, tl.maximum((kt + R_HI + 1) * BLOCK, 0))
    for i0 in range(query_start, tl.minimum(tl.maximum((kt + R_LO) * BLOCK, 0), N), BLOCK):  # key tile far right
        grad_k, grad_v = _bwd_kv_tile(grad_k, grad_v, k, v, q_base, do_base, i0, cols, fk, fv, a_row, u_h,
                                      right_edge, P, sp, D, q_offset, log_floor, LSE, DELTA, san, sqn, sqd, sgn, sgd,
                                      N, M, D_K, D_V, kpm_row, seed, bh, scale, drop_p, False, CAUSAL, HAS_KPM,
                                      HAS_FLOOR, DROPOUT, PRECISION, BLOCK)
    for i0 in range(near_start, tl.minimum(tl.maximum((kt + R_HI + 1) * BLOCK, 0), N), BLOCK):
        grad_k, grad_v = _bwd_kv_tile(grad_k, grad_v, k, v, q_base, do_base, i0, cols, fk, fv, a_row, u_h,
                                      right_edge, P, sp, D, q_offset, log_floor, LSE, DELTA, san, sqn, sqd, sgn, sgd,
                                      N, M, D_K, D_V, kpm_row, seed, bh, scale, drop_p, True, CAUSAL, HAS_KPM,
                                      HAS_FLOOR, DROPOUT, PRECISION, BLOCK)
    for i0 in range(far_left_start, N, BLOCK):  # key tile far left
        grad_k, grad_v = _bwd_kv_tile(grad_k, grad_v, k, v, q_base, do_base, i0, cols, fk, fv, a_row, u_h,
                                      left_edge, P, sp, D, q_offset, log_floor, LSE, DELTA, san, sqn, sqd, sgn, sgd,
                                      N, M, D_K, D_V, kpm_row, seed, bh, scale, drop_p, False, CAUSAL, HAS_KPM,
                                      HAS_FLOOR, DROPOUT, PRECISION, BLOCK)
    base = bh.to(tl.int64) * M
    tl.store(DK + (base + cols[:, None]) * D_K + fk[None, :], (grad_k * scale).to(DK.dtype.element_ty),
             mask=in_keys & (fk[None, :] < D_K))
    tl.store(DV + (base + cols[:, None]) * D_V + fv[None, :], grad_v.to(DV.dtype.element_ty),
             mask=in_keys & (fv[None, :] < D_V))


@triton.jit
def _bwd_q_tile(grad_q, row_acc, q, do, lse, delta, k_base, v_base, j0, qt, rows, fk, fv, row_bias, far_log_m, P, sp,
                D, q_offset, log_floor, skn, skd, svn, svd, N, M, D_K, D_V, kpm_row, seed, bh, scale, drop_p,
                near_out, R_MIN, NEAR: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,
                HAS_FLOOR: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    """One key tile's contribution to a query tile's ``dQ / scale`` and to ``row_acc``: near tiles add
    ``Σ_j dz`` per row and write the tile's ``2·BLOCK`` diagonal sums of ``dz`` to their slot of ``near_out``;
    far tiles add ``Σ_j dS`` per row (times the row's ``1 − σ(z)`` later)."""
    cols = j0 + tl.arange(0, BLOCK)
    in_keys = cols[:, None] < M
    k = tl.load(k_base + cols[:, None] * skn + fk[None, :] * skd, mask=in_keys & (fk[None, :] < D_K), other=0.0)
    v = tl.load(v_base + cols[:, None] * svn + fv[None, :] * svd, mask=in_keys & (fv[None, :] < D_V), other=0.0)
    if NEAR:
        log_m, grad_gate = _near_gate(row_bias, rows, cols, P, sp, D, q_offset, log_floor, HAS_FLOOR)
    else:
        log_m = far_log_m[:, None]
    ds, _ = _bwd_tile(q, k, v, do, lse, delta, rows, cols, log_m, N, M, q_offset, kpm_row, seed, bh, scale, drop_p,
                      CAUSAL, HAS_KPM, DROPOUT, PRECISION)
    grad_q += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION).to(grad_q.dtype)
    if NEAR:
        dz = ds * grad_gate
        row_acc += tl.sum(dz, axis=1)
        # diagonal sums over c = (i − j) + BLOCK − 1: column c < BLOCK holds j = i + BLOCK − 1 − c (if < BLOCK),
        # column BLOCK + c holds j = i − 1 − c (if >= 0) — the same j modulo BLOCK, and exactly one of the two
        # exists, so one gather G[i, c] = dz[i, (i + BLOCK − 1 − c) mod BLOCK] serves both halves
        i_local = tl.arange(0, BLOCK)[:, None]
        c_local = tl.arange(0, BLOCK)[None, :]
        skewed = tl.gather(dz, (i_local + (BLOCK - 1) - c_local) % BLOCK, axis=1)
        lower = tl.sum(tl.where(i_local <= c_local, skewed, 0.0), axis=0)  # i − j = c − (BLOCK − 1) <= 0
        upper = tl.sum(tl.where(i_local > c_local, skewed, 0.0), axis=0)  # i − j = c + 1 >= 1
        out = near_out + (qt - j0 // BLOCK - R_MIN).to(tl.int64) * (2 * BLOCK) + tl.arange(0, BLOCK)
        tl.store(out, lower)
        tl.store(out + BLOCK, upper)
    else:
        row_acc += tl.sum(ds, axis=1)
    return grad_q, row_acc


@triton.jit
def dman_bwd_q(Q, K, V, A, P, U, KPM, SEED, LSE, DELTA, DO, DQ, ROW_GRAD, NEAR_GRAD, FAR_GRAD,
               sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgn, sgd, sab, san, sp, su,
               H, N, M, D_K, D_V, D, q_offset, R_LO, R_HI, R_MIN, N_SLOTS, scale, drop_p, log_floor,
               CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr, DROPOUT: tl.constexpr,
               PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_DK: tl.constexpr,
               BLOCK_DV: tl.constexpr):
    """Grid ``(⌈N / BLOCK⌉, B·H)``: the gradient of one query tile, over the key tiles it sees, and of its
    mask logits. DQ is contiguous ``(B, H, N, D_K)``; ROW_GRAD ``(B·H, N)`` gets ``Σ_j dz`` per row; NEAR_GRAD
    ``(B·H, ⌈N / BLOCK⌉, N_SLOTS, 2·BLOCK)`` (zero-filled) the diagonal sums of the near tiles at slot ``r −
    R_MIN``; FAR_GRAD ``(B·H, ⌈N / BLOCK⌉, 2)`` the sums of ``dz`` over the far-left and far-right tiles."""
    qt = tl.program_id(0)
    i0 = qt * BLOCK
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = i0 + tl.arange(0, BLOCK)
    in_rows = rows < N
    fk = tl.arange(0, BLOCK_DK)
    fv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqn + fk[None, :] * sqd,
                mask=in_rows[:, None] & (fk[None, :] < D_K), other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sgb + h * sgh + rows[:, None] * sgn + fv[None, :] * sgd,
                 mask=in_rows[:, None] & (fv[None, :] < D_V), other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=in_rows, other=0.0)
    delta = tl.load(DELTA + bh.to(tl.int64) * N + rows, mask=in_rows, other=0.0)
    row_bias = (tl.load(A + b.to(tl.int64) * sab + rows * san, mask=in_rows, other=0.0).to(ACC)
                + tl.load(U + h * su).to(ACC))
    left_log_m, left_gate = _far_gate(row_bias, tl.load(P + 2 * D * sp), log_floor, HAS_FLOOR)
    right_log_m, right_gate = _far_gate(row_bias, tl.load(P), log_floor, HAS_FLOOR)
    k_base = K + b.to(tl.int64) * skb + h * skh
    v_base = V + b.to(tl.int64) * svb + h * svh
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    n_tiles = tl.num_programs(0)
    near_out = NEAR_GRAD + (bh.to(tl.int64) * n_tiles + qt) * N_SLOTS * (2 * BLOCK)
    grad_q = tl.zeros((BLOCK, BLOCK_DK), dtype=ACC)
    left_ds = tl.zeros((BLOCK,), dtype=ACC)
    near_dz = tl.zeros((BLOCK,), dtype=ACC)
    right_ds = tl.zeros((BLOCK,), dtype=ACC)
    key_end = M
    if CAUSAL:
        key_end = tl.minimum(M, q_offset + tl.minimum(i0 + BLOCK, N))
    near_start = tl.maximum((qt - R_HI) * BLOCK, 0)
    near_end = tl.minimum(tl.maximum((qt - R_LO + 1) * BLOCK, 0), key_end)
    far_right_start = tl.maximum((qt - R_LO + 1) * BLOCK, 0)
    for j0 in range(0, tl.minimum(near_start, key_end), BLOCK):  # far left
        grad_q, left_ds = _bwd_q_tile(grad_q, left_ds, q, do, lse, delta, k_base, v_base, j0, qt, rows, fk, fv,
                                      row_bias, left_log_m, P, sp, D, q_offset, log_floor, skn, skd, svn, svd, N, M,
                                      D_K, D_V, kpm_row, seed, bh, scale, drop_p, near_out, R_MIN, False, CAUSAL,
                                      HAS_KPM, HAS_FLOOR, DROPOUT, PRECISION, BLOCK)
    for j0 in range(near_start, near_end, BLOCK):
        grad_q, near_dz = _bwd_q_tile(grad_q, near_dz, q, do, lse, delta, k_base, v_base, j0, qt, rows, fk, fv,
                                      row_bias, left_log_m, P, sp, D, q_offset, log_floor, skn, skd, svn, svd, N, M,
                                      D_K, D_V, kpm_row, seed, bh, scale, drop_p, near_out, R_MIN, True, CAUSAL,
                                      HAS_KPM, HAS_FLOOR, DROPOUT, PRECISION, BLOCK)
    for j0 in range(far_right_start, key_end, BLOCK):  # far right
        grad_q, right_ds = _bwd_q_tile(grad_q, right_ds, q, do, lse, delta, k_base, v_base, j0, qt, rows, fk, fv,
                                       row_bias, right_log_m, P, sp, D, q_offset, log_floor, skn, skd, svn, svd, N,
                                       M, D_K, D_V, kpm_row, seed, bh, scale, drop_p, near_out, R_MIN, False, CAUSAL,
                                       HAS_KPM, HAS_FLOOR, DROPOUT, PRECISION, BLOCK)
    left_dz = left_ds * left_gate
    right_dz = right_ds * right_gate
    tl.store(ROW_GRAD + bh.to(tl.int64) * N + rows, left_dz + near_dz + right_dz, mask=in_rows)
    far_out = FAR_GRAD + (bh.to(tl.int64) * n_tiles + qt) * 2
    tl.store(far_out, tl.sum(left_dz, axis=0))
    tl.store(far_out + 1, tl.sum(right_dz, axis=0))
    tl.store(DQ + (bh.to(tl.int64) * N + rows[:, None]) * D_K + fk[None, :], (grad_q * scale).to(DQ.dtype.element_ty),
             mask=in_rows[:, None] & (fk[None, :] < D_K))
