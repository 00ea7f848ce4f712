"""Triton kernels of DMAN attention (MAN Eq. 4 with the dynamic mask of Eq. 12; docs/design.md §1, §3): forward,
and backward in two passes without atomics (keys: dK, dV; queries: dQ and the gradient of the mask's logits),
FlashAttention-2's split.

Per (batch, head) pair, with ``z_ij = a_i + U_h + P[clip(t − s, −D, D) + D]`` (``t = q_offset + i``, ``s = j``)::

    log M_ij = max(logσ(z_ij), log ε)        score_ij = scale·q_i·k_j + log M_ij
    p_ij = exp(score_ij − lse_i)             out_i = Σ_j p_ij·d_ij·v_j

over the allowed keys (causal ``s <= t``, not padded), ``d_ij`` the inverted-dropout keep-mask drawn from Philox
by position (forward accumulates the dropped ``p`` into the output, the undropped one into the normaliser).
The mask enters in log form, so the softmax stays exact when ``σ(z)`` underflows. Scores are kept in log₂ units
(``scale`` and ``log M`` times ``log₂e``; exponentials are ``exp2``). Backward uses FlashAttention-2's
``dS = p ⊙ (d ⊙ dO·vᵀ − Δ)`` with ``Δ_i = dO_i·out_i`` (computed before the kernels) and
``dz = dS ⊙ (1 − σ(z))`` (0 where the floor ``ε`` holds), with ``1 − σ(z) = exp(logσ(z) − z)``.

Keys past the sequence and padded keys are set to ``−inf`` per key (one select per score); only the *near*
tiles, which hold the causal diagonal, compute a two-dimensional mask.

Tiles are ``BLOCK_M`` queries × ``BLOCK_N`` keys (the held tile of a backward pass the larger: the key pass holds
keys, the query pass queries — sm_90's wgmma needs 64 rows per warpgroup in the held tile, and a narrower streamed
tile keeps the per-tile working set small; docs/gpu/offline-perf.md). A tile of queries ``i0 …`` and keys ``j0 …``
covers the distances ``t − s`` from ``q_offset + i0 − j0 − (BLOCK_N − 1)`` to ``q_offset + i0 − j0 +
(BLOCK_M − 1)``; it is *near* when some of them lie inside ``(−D, D)`` (:func:`_near_keys`, :func:`_near_queries`).
Beyond the near tiles a tile is *far*: every distance is ``>= D`` (far left) or ``<= −D`` (far right), ``z`` is
constant along each query and the tile uses one gate value per query (no transcendental per score besides the
softmax's ``exp2``). A near tile reads ``P`` once, as the strip of its ``BLOCK_M + BLOCK_N − 1`` distances (one
load spread over the program's threads), and builds its bias from the strip with one ``tl.gather``
(``bias[i, j] = strip[i − j + BLOCK_N − 1]``, a Toeplitz tile; Triton stages the strip in shared memory: one shared
load per score, no global load per score).

Each pass runs two loops over its tiles, each free of branches on the tile's kind: the near tiles (a contiguous run),
then the far tiles of both sides as one index range (the side a per-tile scalar). One loop with a branch on the
kind made ptxas serialise sm_90's wgmma (C7515: "non wgmma instructions defining accumulator registers"); the two
loops compile without the advisory (offline compile check, docs/gpu.md). Key tiles enter the online softmax near
ones first, which the result does not depend on beyond rounding; dropout draws by position, so the order changes no
keep-mask.

**Feature blocks** (issue 52), as MTSA's kernels (``tensorized_jit``): a padded head width that is not a power of
two runs as a main and a tail block, both powers of two (``runtime.feature_split``; ``BLOCK_D*`` the width they
cover, ``TAIL_D*`` the tail's) — d 150's 160 features as 128 + 32, not one block of 256. ``q``, ``k``, ``v``, ``dO``
and the accumulators (``out``, ``dK``, ``dV``, ``dQ``) are tuples of blocks (``jit_helpers.feature_blocks``): scores
and ``dP`` sum the blocks' products, each accumulator keeps one product per block; the wrapper lays the tensors out
main + tail wide (``runtime.feature_width``), so the blocks' loads and stores mask rows only. A power-of-two width is
a tuple of one block and the kernels' default ``TAIL_D* = 0`` traces the operations of one tile: such widths compile
as before. With a tail, the loops keep their loop-invariant addresses in the loop (``disable_licm``: registers for
the wider accumulators — without it sm_90's tiles spilled 12–76 bytes in each pass) and the backward's tail
products run in a region of their own (``jit_helpers.tail_region``: on the ``mma.sync`` architectures main and tail
products linked in one region took one warp layout and ran every product twice).

Per score (head dims d, FLOPs of ``tl.dot``): forward 4d, backward 6d (key pass) + 6d (query pass), as
FlashAttention-2 with the same two-pass split; transcendentals per score: far tiles 1 forward, 1 backward per pass;
near tiles 3 forward (``logσ``: ``exp2`` and ``log2``; the softmax's ``exp2``) and 3–4 per backward pass (with
``1 − σ(z)``), FlashAttention-2 1.

The query pass writes ``Σ_j dz`` per row, per near tile the diagonal sums of ``dz`` — per *square* of ``BLOCK_N``
queries × ``BLOCK_N`` keys (``BLOCK_M`` is a multiple of ``BLOCK_N``: the tile is ``BLOCK_M / BLOCK_N`` squares
stacked), ``2·BLOCK_N`` sums in the slot of the square's offset ``r = query square − key tile`` (column ``c = (i − j)
+ BLOCK_N − 1`` within the square, the last column 0; one ``tl.gather``) — and zeros in the slots of squares it
does not visit, so its buffer needs no fill, and one sum per far side; the wrapper reduces them to the gradients of
``a``, ``P`` and ``U`` with deterministic PyTorch sums.
"""

import triton
import triton.language as tl

from .jit_helpers import (LOG2E, divide_rows_blocks, dot_blocks, dot_blocks_apart, dot_nt_blocks, dot_nt_blocks_apart,
                          dropout_keep, dropout_key_pass, feature_blocks, head_base, keep_rows_blocks, load_blocks,
                          log_sigmoid, online_softmax, online_softmax_scaled, program_tile, scale_blocks,
                          scale_rows_blocks, store_blocks, zeros_blocks)

#: never specialised on == 1 (a new length, offset or distance must not recompile)
_SIZES = ["H", "N", "M", "num_tiles", "D", "q_offset"]


@triton.jit
def _gate(z, log_floor, HAS_FLOOR: tl.constexpr):
    """``(log M, d log M / dz)`` of logits ``z``: ``logσ(z)`` (floored at ``log ε``) and ``1 − σ(z) =
    exp(logσ(z) − z)`` (0 where floored: a floored ``log M`` is constant)."""
    log_m = log_sigmoid(z)
    grad = tl.exp2((log_m - z) * LOG2E)
    if HAS_FLOOR:
        floored = log_m < log_floor
        log_m = tl.where(floored, log_floor, log_m)
        grad = tl.where(floored, 0.0, grad)
    return log_m, grad


@triton.jit
def _near_keys(i0, q_offset, D, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(near_start, far_right_start)`` of the query tile ``i0``: its key tiles ``near_start <= j0 <
    far_right_start`` (multiples of ``BLOCK_N``) are near — some distance inside ``(−D, D)``; before them every
    distance is ``>= D`` (far left), from ``far_right_start`` on every one is ``<= −D`` (far right)."""
    near_start = tl.cdiv(tl.maximum(q_offset + i0 + 2 - BLOCK_N - D, 0), BLOCK_N) * BLOCK_N
    return near_start, tl.cdiv(q_offset + i0 + BLOCK_M - 1 + D, BLOCK_N) * BLOCK_N


@triton.jit
def _near_queries(j0, q_offset, D, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(near_start, far_left_start)`` of the key tile ``j0``: its query tiles ``near_start <= i0 <
    far_left_start`` (multiples of ``BLOCK_M``) are near; before them the key tile is far right of the queries
    (every distance ``<= −D``), from ``far_left_start`` on far left (every distance ``>= D``) — the inverse of
    :func:`_near_keys`."""
    near_start = tl.cdiv(tl.maximum(j0 + 2 - BLOCK_M - D - q_offset, 0), BLOCK_M) * BLOCK_M
    return near_start, tl.cdiv(tl.maximum(j0 + BLOCK_N - 1 + D - q_offset, 0), BLOCK_M) * BLOCK_M


@triton.jit
def _near_gate(query_bias, i0, j0, P, sp, D, q_offset, log_floor, HAS_FLOOR: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """``(log M, d log M / dz)`` of the near tile of queries ``i0 …`` and keys ``j0 …``, ``(BLOCK_M, BLOCK_N)`` —
    or transposed, ``(BLOCK_N, BLOCK_M)`` with ``KEYS_FIRST`` (the key pass) — from ``z = query_bias +
    P[clip(t − s) + D]`` (``query_bias`` per query, in its type). ``P`` is read once, as the strip of the tile's
    distances ``base + c`` (``base = q_offset + i0 − j0 − (BLOCK_N − 1)``, ``c < BLOCK_M + BLOCK_N − 1``; the strip
    is ``2·max(BLOCK_M, BLOCK_N)`` long, a power of two, its tail unused), and the tile's bias ``strip[i − j +
    BLOCK_N − 1]`` (a Toeplitz tile) is gathered from it (docs/design.md §3: one global load per tile, not one per
    score)."""
    STRIP: tl.constexpr = 2 * max(BLOCK_M, BLOCK_N)
    base = q_offset + i0 - j0 - (BLOCK_N - 1)
    strip = tl.load(P + (tl.minimum(tl.maximum(base + tl.arange(0, STRIP), -D), D) + D) * sp).to(query_bias.dtype)
    queries = tl.arange(0, BLOCK_M)
    keys = tl.arange(0, BLOCK_N)
    if KEYS_FIRST:
        diagonal = tl.reshape(queries[None, :] - keys[:, None] + (BLOCK_N - 1), (BLOCK_N * BLOCK_M,))
        bias = tl.reshape(tl.gather(strip, diagonal, axis=0), (BLOCK_N, BLOCK_M))
        return _gate(query_bias[None, :] + bias, log_floor, HAS_FLOOR)
    else:
        diagonal = tl.reshape(queries[:, None] - keys[None, :] + (BLOCK_N - 1), (BLOCK_M * BLOCK_N,))
        bias = tl.reshape(tl.gather(strip, diagonal, axis=0), (BLOCK_M, BLOCK_N))
        return _gate(query_bias[:, None] + bias, log_floor, HAS_FLOOR)


@triton.jit
def _keep_keys(s2, cols, M, kpm_row, HAS_KPM: tl.constexpr):
    """The scores ``s2`` (queries × keys) with ``−inf`` at keys past the sequence and at padded keys (a select, not
    an added bias: a non-finite padded key stays out, as on the reference backend)."""
    keep = cols < M
    if HAS_KPM:
        keep = keep & (tl.load(kpm_row + cols, mask=cols < M, other=1) == 0)
    return tl.where(keep[None, :], s2, float("-inf"))


@triton.jit
def _near_scores(s2, query_bias, rows, cols, i0, j0, P, sp, D, q_offset, log_floor, CAUSAL: tl.constexpr,
                 HAS_FLOOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(score, d log M / dz)`` of a near tile (queries × keys) in log₂ units: the scaled scores plus ``log M``,
    ``−inf`` past the causal diagonal."""
    log_m, grad_gate = _near_gate(query_bias, i0, j0, P, sp, D, q_offset, log_floor, HAS_FLOOR, BLOCK_M, BLOCK_N,
                                  False)
    score = s2 + log_m * LOG2E
    if CAUSAL:
        score = tl.where(cols[None, :] <= q_offset + rows[:, None], score, float("-inf"))
    return score, grad_gate


@triton.jit
def _far_tile(t, n_first, first_start, second_start, BLOCK: tl.constexpr):
    """``(start, first)`` of the ``t``-th far tile of a pass's far loop, which walks the ``n_first`` far tiles of
    one side from ``first_start`` and then those of the other side from ``second_start`` as one index range
    (``first``: the tile is on the first side)."""
    first = t < n_first
    return tl.where(first, first_start + t * BLOCK, second_start + (t - n_first) * BLOCK), first


@triton.jit
def _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, i0, j0, rows, idx_n, fk, fv, query_bias, far_log_m2, P, sp,
              D, q_offset, log_floor, skn, skd, svn, svd, N, M, D_K, D_V, kpm_row, seed, bh, scale2, drop_p,
              NEAR: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr,
              DROPOUT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key tile of the online softmax: returns the updated ``(acc, row_max, row_sum)``. ``NEAR``: the tile
    holds distances inside ``(−D, D)`` — a gate per score, and the causal diagonal; else one gate per row,
    ``far_log_m2``. ``q``, ``acc`` and the loaded tiles are tuples of feature blocks
    (:func:`.jit_helpers.feature_blocks`)."""
    cols = j0 + idx_n
    k = load_blocks(k_base, j0, skn, skd, idx_n, fk, M, D_K)
    v = load_blocks(v_base, j0, svn, svd, idx_n, fv, M, D_V)
    s = dot_nt_blocks(q, k, PRECISION).to(row_max.dtype)  # (BLOCK_M, BLOCK_N)
    if NEAR:
        score = _near_scores(_keep_keys(s * scale2, cols, M, kpm_row, HAS_KPM), query_bias, rows, cols, i0, j0, P,
                             sp, D, q_offset, log_floor, CAUSAL, HAS_FLOOR, BLOCK_M, BLOCK_N)[0]
        p, alpha, new_max = online_softmax(score, row_max)
    else:  # one gate per row: scale, gate and maximum in one FMA per score; keys masked at the end or with padding
        if HAS_KPM or j0 + BLOCK_N > M:
            s = _keep_keys(s, cols, M, kpm_row, HAS_KPM)
        p, alpha, new_max = online_softmax_scaled(s, scale2, far_log_m2, row_max)
    row_sum = row_sum * alpha + tl.sum(p, axis=1)
    if DROPOUT:
        p = tl.where(dropout_keep(seed, bh, rows, j0, N, M, drop_p, BLOCK_M, BLOCK_N), p / (1.0 - drop_p), 0.0)
    acc = dot_blocks(p.to(v[0].dtype), v, scale_rows_blocks(acc, alpha), PRECISION)  # cast, then rescale: as before
    return acc, new_max, row_sum


@triton.jit(do_not_specialize=_SIZES)
def dman_fwd(Q, K, V, A, P, U, KPM, SEED, OUT, LSE,
             sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod, sab, san, sp, su,
             H, N, M, D_K, D_V, num_tiles, D, q_offset, scale2, drop_p, log_floor,
             CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr, DROPOUT: tl.constexpr,
             PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DK: tl.constexpr = 0, TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · H`` programs: one query tile of one (batch, head) pair each. LSE is contiguous
    ``(B·H, N)`` in ACC, log₂ units (0 for rows with no allowed key, whose output is 0)."""
    qt, bh = program_tile(num_tiles)
    i0 = qt * BLOCK_M
    b = bh // H
    h = bh % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    rows = i0 + idx_m
    fk = feature_blocks(BLOCK_DK, TAIL_DK)
    fv = feature_blocks(BLOCK_DV, TAIL_DV)
    q = load_blocks(head_base(Q, b, h, sqb, sqh), i0, sqn, sqd, idx_m, fk, N, D_K)
    query_bias = (tl.load(A + b.to(tl.int64) * sab + rows * san, mask=rows < N, other=0.0).to(ACC)
                  + tl.load(U + h * su).to(ACC))
    left_log_m, _ = _gate(query_bias + tl.load(P + 2 * D * sp).to(ACC), log_floor, HAS_FLOOR)  # t − s >= D
    right_log_m, _ = _gate(query_bias + tl.load(P).to(ACC), log_floor, HAS_FLOOR)  # t − s <= −D
    k_base = head_base(K, b, h, skb, skh)
    v_base = head_base(V, b, h, svb, svh)
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    acc = zeros_blocks(BLOCK_M, BLOCK_DV, TAIL_DV, ACC)
    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=ACC)
    row_sum = tl.zeros((BLOCK_M,), dtype=ACC)
    key_end = M
    if CAUSAL:  # key tiles wholly in the future are skipped
        key_end = tl.minimum(M, q_offset + tl.minimum(i0 + BLOCK_M, N))
    near_start, far_right_start = _near_keys(i0, q_offset, D, BLOCK_M, BLOCK_N)
    left_log_m2 = left_log_m * LOG2E
    right_log_m2 = right_log_m * LOG2E
    for j0 in tl.range(near_start, tl.minimum(far_right_start, key_end), BLOCK_N,
                       disable_licm=TAIL_DK + TAIL_DV > 0):  # near tiles
        acc, row_max, row_sum = _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, i0, j0, rows, idx_n, fk, fv,
                                          query_bias, left_log_m2, P, sp, D, q_offset, log_floor, skn, skd, svn, svd,
                                          N, M, D_K, D_V, kpm_row, seed, bh, scale2, drop_p, True, CAUSAL, HAS_KPM,
                                          HAS_FLOOR, DROPOUT, PRECISION, BLOCK_M, BLOCK_N)
    n_left = tl.cdiv(tl.minimum(near_start, key_end), BLOCK_N)  # far tiles: left [0, near_start), right from
    n_far = n_left + tl.cdiv(tl.maximum(key_end - far_right_start, 0), BLOCK_N)  # far_right_start, one range
    for t in tl.range(0, n_far, disable_licm=TAIL_DK + TAIL_DV > 0):
        j0, left = _far_tile(t, n_left, 0, far_right_start, BLOCK_N)
        acc, row_max, row_sum = _fwd_tile(acc, row_max, row_sum, q, k_base, v_base, i0, j0, rows, idx_n, fk, fv,
                                          query_bias, tl.where(left, left_log_m2, right_log_m2), P, sp, D, q_offset,
                                          log_floor, skn, skd, svn, svd, N, M, D_K, D_V, kpm_row, seed, bh, scale2,
                                          drop_p, False, CAUSAL, HAS_KPM, HAS_FLOOR, DROPOUT, PRECISION, BLOCK_M,
                                          BLOCK_N)
    empty = row_sum == 0  # no allowed key (a NaN sum is not empty: NaN inputs give NaN, as on the reference)
    out = divide_rows_blocks(acc, row_sum, empty)
    store_blocks(head_base(OUT, b, h, sob, soh), i0, son, sod, idx_m, fv, N, D_V, out)
    lse = tl.where(empty, 0.0, row_max + tl.log2(tl.where(empty, 1.0, row_sum)))
    tl.store(LSE + bh.to(tl.int64) * N + rows, lse, mask=rows < N)


@triton.jit
def _bwd_kv_tile(grad_k, grad_v, k, v, kept, q_base, do_base, i0, j0, idx_m, cols, fk, fv, a_row, u_h, far_row, P,
                 sp, D, q_offset, log_floor, LSE, DELTA, san, sqn, sqd, sgn, sgd, N, M, D_K, D_V, seed, bh, scale2,
                 drop_p, NEAR: tl.constexpr, CAUSAL: tl.constexpr, HAS_FLOOR: tl.constexpr, DROPOUT: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query tile's contribution to a key tile's ``(dK / scale, dV)`` (``NEAR`` as in :func:`_fwd_tile`; a far
    tile reads its queries' ``log₂ M − lse`` from ``far_row``, the far side's row of the wrapper's table),
    computed transposed — keys along the rows, ``(BLOCK_N, BLOCK_M)``, FlashAttention-2's key pass: every product
    has the held key tile as its M dimension (``k·qᵀ``, ``v·dOᵀ``, ``pᵀ·dO``, ``dSᵀ·q``), which wgmma on sm_90
    needs 64 rows of, and the transposed probabilities and ``dS`` are the A operands of the gradient products as
    they are (no transpose through shared memory)."""
    rows = i0 + idx_m
    in_rows = rows < N
    q = load_blocks(q_base, i0, sqn, sqd, idx_m, fk, N, D_K)
    do = load_blocks(do_base, i0, sgn, sgd, idx_m, fv, N, D_V)
    delta = tl.load(DELTA + bh.to(tl.int64) * N + rows, mask=in_rows, other=0.0)
    s = dot_nt_blocks_apart(k, q, PRECISION).to(delta.dtype)  # (BLOCK_N keys, BLOCK_M queries)
    if NEAR:
        lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=in_rows, other=0.0)
        query_bias = tl.load(a_row + rows * san, mask=in_rows, other=0.0).to(lse.dtype) + u_h
        log_m = _near_gate(query_bias, i0, j0, P, sp, D, q_offset, log_floor, HAS_FLOOR, BLOCK_M, BLOCK_N, True)[0]
        score = tl.where(kept[:, None], s * scale2, float("-inf")) + log_m * LOG2E
        if CAUSAL:
            score = tl.where(cols[:, None] <= q_offset + rows[None, :], score, float("-inf"))
        p = tl.exp2(score - lse[None, :])
    else:  # scale, the row's gate and its log-sum-exp in one FMA per score — the gate minus the log-sum-exp read
        # (a gate per query computed here cost two MUFU and ~15 ALU instructions per query and thread, in every
        # tile); the masked keys' rows are zeroed at the end (a key's mask decides only its own dK and dV rows here)
        far = tl.load(far_row + rows, mask=in_rows, other=0.0)
        p = tl.exp2(s * scale2 + far[None, :])
    dp = dot_nt_blocks_apart(v, do, PRECISION).to(delta.dtype)
    if DROPOUT:
        dp, dropped = dropout_key_pass(seed, bh, rows, j0, N, M, drop_p, dp, p, BLOCK_M, BLOCK_N)
    else:
        dropped = p
    ds = p * (dp - delta[None, :])
    grad_v = dot_blocks_apart(dropped, do, grad_v, PRECISION)
    grad_k = dot_blocks_apart(ds, q, grad_k, PRECISION)
    return grad_k, grad_v


@triton.jit(do_not_specialize=_SIZES)
def dman_bwd_kv(Q, K, V, A, P, U, KPM, SEED, LSE, DELTA, DO, FAR, DK, DV,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgn, sgd, sab, san, sp, su,
                H, N, M, D_K, D_V, num_tiles, D, q_offset, scale, scale2, drop_p, log_floor,
                CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr, DROPOUT: tl.constexpr,
                PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DK: tl.constexpr = 0,
                TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · H`` programs: the gradients of one key tile (``BLOCK_N`` keys: k, v) over the query tiles
    (``BLOCK_M`` queries) that see it (far right of it, near, far left). DK, DV are contiguous ``(B·H, M, ·)``;
    FAR contiguous ``(B·H, 2, N)``: each query's ``log₂ M − lse`` far left (``t − s >= D``) and far right."""
    kt, bh = program_tile(num_tiles)
    j0 = kt * BLOCK_N
    b = bh // H
    h = bh % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    cols = j0 + idx_n
    fk = feature_blocks(BLOCK_DK, TAIL_DK)
    fv = feature_blocks(BLOCK_DV, TAIL_DV)
    k = load_blocks(head_base(K, b, h, skb, skh), j0, skn, skd, idx_n, fk, M, D_K)
    v = load_blocks(head_base(V, b, h, svb, svh), j0, svn, svd, idx_n, fv, M, D_V)
    kept = cols < M  # the key tile's keys inside the sequence and not padded
    if HAS_KPM:
        kept = kept & (tl.load(KPM + b.to(tl.int64) * M + cols, mask=cols < M, other=1) == 0)
    q_base = head_base(Q, b, h, sqb, sqh)
    do_base = head_base(DO, b, h, sgb, sgh)
    a_row = A + b.to(tl.int64) * sab
    u_h = tl.load(U + h * su).to(ACC)
    far_left = FAR + bh.to(tl.int64) * 2 * N
    far_right = far_left + N
    seed = tl.load(SEED) if DROPOUT else 0
    grad_k = zeros_blocks(BLOCK_N, BLOCK_DK, TAIL_DK, ACC)
    grad_v = zeros_blocks(BLOCK_N, BLOCK_DV, TAIL_DV, ACC)
    query_start = 0
    if CAUSAL:  # query tiles wholly before the key tile are skipped
        query_start = (tl.maximum(j0 - q_offset, 0) // BLOCK_M) * BLOCK_M
    near_start, far_left_start = _near_queries(j0, q_offset, D, BLOCK_M, BLOCK_N)
    for i0 in tl.range(tl.maximum(near_start, query_start), tl.minimum(far_left_start, N), BLOCK_M,
                       disable_licm=TAIL_DK + TAIL_DV > 0):  # near tiles
        grad_k, grad_v = _bwd_kv_tile(grad_k, grad_v, k, v, kept, q_base, do_base, i0, j0, idx_m, cols, fk, fv,
                                      a_row, u_h, far_left, P, sp, D, q_offset, log_floor, LSE, DELTA, san, sqn, sqd,
                                      sgn, sgd, N, M, D_K, D_V, seed, bh, scale2, drop_p, True, CAUSAL, HAS_FLOOR,
                                      DROPOUT, PRECISION, BLOCK_M, BLOCK_N)
    # far tiles: those before near_start (the key tile is far right of them), then those from far_left_start
    n_right = tl.cdiv(tl.maximum(tl.minimum(near_start, N) - query_start, 0), BLOCK_M)
    left_start = tl.maximum(far_left_start, query_start)
    n_far = n_right + tl.cdiv(tl.maximum(N - left_start, 0), BLOCK_M)
    for t in tl.range(0, n_far, disable_licm=TAIL_DK + TAIL_DV > 0):
        i0, right = _far_tile(t, n_right, query_start, left_start, BLOCK_M)
        grad_k, grad_v = _bwd_kv_tile(grad_k, grad_v, k, v, kept, q_base, do_base, i0, j0, idx_m, cols, fk, fv,
                                      a_row, u_h, tl.where(right, far_right, far_left), P, sp, D, q_offset,
                                      log_floor, LSE, DELTA, san, sqn, sqd, sgn, sgd, N, M, D_K, D_V, seed, bh, scale2,
                                      drop_p, False, CAUSAL, HAS_FLOOR, DROPOUT, PRECISION, BLOCK_M, BLOCK_N)
    key_base = bh.to(tl.int64) * M
    grad_k = keep_rows_blocks(grad_k, kept)  # far tiles did not mask: a padded key's rows (even NaN) are 0
    grad_v = keep_rows_blocks(grad_v, kept)
    store_blocks(DK + key_base * D_K, j0, D_K, 1, idx_n, fk, M, D_K, scale_blocks(grad_k, scale))
    store_blocks(DV + key_base * D_V, j0, D_V, 1, idx_n, fv, M, D_V, grad_v)


@triton.jit
def _diagonal_sums(dz, out, square_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Write the diagonal sums of a near tile's ``dz`` (``BLOCK_M`` queries × ``BLOCK_N`` keys), per square of
    ``BLOCK_N`` queries (``G = BLOCK_M / BLOCK_N`` of them, stacked): square ``g``'s ``2·BLOCK_N`` sums go to
    ``out + g·square_stride`` — column ``c < BLOCK_N`` holds ``i − j = c − (BLOCK_N − 1)`` within the square,
    column ``BLOCK_N + c`` holds ``i − j = c + 1`` (the last one 0)."""
    # column c < BLOCK_N holds j = i + BLOCK_N − 1 − c (if < BLOCK_N), column BLOCK_N + c holds j = i − 1 − c (if
    # >= 0), i the row within its square — the same j modulo BLOCK_N, and exactly one of the two exists, so one gather
    # S[i, c] = dz[i, (i + BLOCK_N − 1 − c) mod BLOCK_N] serves both halves (gathered from the flattened tile: Triton
    # stages it in shared memory, where a gather along the rows took ~2.5 warp shuffles per score and more registers)
    G: tl.constexpr = BLOCK_M // BLOCK_N
    i = tl.arange(0, BLOCK_M)[:, None]
    c = tl.arange(0, BLOCK_N)[None, :]
    source = i * BLOCK_N + (i % BLOCK_N + (BLOCK_N - 1) - c) % BLOCK_N
    skewed = tl.reshape(tl.gather(tl.reshape(dz, (BLOCK_M * BLOCK_N,)), tl.reshape(source, (BLOCK_M * BLOCK_N,)),
                                  axis=0), (G, BLOCK_N, BLOCK_N))  # (square, row in it, c)
    i_local = tl.arange(0, BLOCK_N)[None, :, None]
    c_local = tl.arange(0, BLOCK_N)[None, None, :]
    lower = tl.sum(tl.where(i_local <= c_local, skewed, 0.0), axis=1)  # (G, BLOCK_N): i − j = c − (BLOCK_N − 1) <= 0
    upper = tl.sum(tl.where(i_local > c_local, skewed, 0.0), axis=1)  # i − j = c + 1 >= 1
    where = out + tl.arange(0, G)[:, None] * square_stride + tl.arange(0, BLOCK_N)[None, :]
    tl.store(where, lower)
    tl.store(where + BLOCK_N, upper)


@triton.jit
def _bwd_q_tile(grad_q, left_ds, near_dz, right_ds, q, do, lse, delta, k_base, v_base, i0, j0, rows, idx_n, fk, fv,
                query_bias, left_log_m2, right_log_m2, P, sp, D, q_offset, log_floor, skn, skd, svn, svd, N, M, D_K,
                D_V, kpm_row, seed, bh, scale2, drop_p, near_out, N_SLOTS, left, NEAR: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr, DROPOUT: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key tile's contribution to a query tile's ``dQ / scale`` and to its row sums: a near tile (``NEAR``) adds
    ``Σ_j dz`` per row to ``near_dz`` and writes the diagonal sums of ``dz`` of its squares (``near_out``: the slot
    of the first square, offset by ``−j0 / BLOCK_N`` slots here); a far tile adds ``Σ_j dS`` per row to
    ``left_ds`` or ``right_ds`` (``left``: a scalar; times the row's ``1 − σ(z)`` later)."""
    cols = j0 + idx_n
    k = load_blocks(k_base, j0, skn, skd, idx_n, fk, M, D_K)
    v = load_blocks(v_base, j0, svn, svd, idx_n, fv, M, D_V)
    s = dot_nt_blocks_apart(q, k, PRECISION).to(lse.dtype)  # (BLOCK_M, BLOCK_N)
    if NEAR:
        score, grad_gate = _near_scores(_keep_keys(s * scale2, cols, M, kpm_row, HAS_KPM), query_bias, rows, cols,
                                        i0, j0, P, sp, D, q_offset, log_floor, CAUSAL, HAS_FLOOR, BLOCK_M, BLOCK_N)
        p = tl.exp2(score - lse[:, None])
    else:  # scale, the row's gate and its log-sum-exp in one FMA per score; keys masked at the end or with padding
        if HAS_KPM or j0 + BLOCK_N > M:
            s = _keep_keys(s, cols, M, kpm_row, HAS_KPM)
        p = tl.exp2(s * scale2 + (tl.where(left, left_log_m2, right_log_m2) - lse)[:, None])
        grad_gate = p  # unused on far tiles
    dp = dot_nt_blocks_apart(do, v, PRECISION).to(lse.dtype)
    if DROPOUT:
        dp = tl.where(dropout_keep(seed, bh, rows, j0, N, M, drop_p, BLOCK_M, BLOCK_N), dp / (1.0 - drop_p), 0.0)
    ds = p * (dp - delta[:, None])
    grad_q = dot_blocks_apart(ds, k, grad_q, PRECISION)
    if NEAR:
        dz = ds * grad_gate
        near_dz += tl.sum(dz, axis=1)
        _diagonal_sums(dz, near_out - (j0 // BLOCK_N) * (2 * BLOCK_N), (N_SLOTS + 1) * (2 * BLOCK_N), BLOCK_M,
                       BLOCK_N)
    else:
        ds_sum = tl.sum(ds, axis=1)
        left_ds += tl.where(left, ds_sum, 0.0)
        right_ds += tl.where(left, 0.0, ds_sum)
    return grad_q, left_ds, near_dz, right_ds


@triton.jit(do_not_specialize=_SIZES + ["R_MIN", "N_SLOTS"])
def dman_bwd_q(Q, K, V, A, P, U, KPM, SEED, LSE, DELTA, DO, DQ, ROW_GRAD, NEAR_GRAD, FAR_GRAD,
               sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgn, sgd, sab, san, sp, su,
               H, N, M, D_K, D_V, num_tiles, D, q_offset, R_MIN, N_SLOTS, scale, scale2, drop_p,
               log_floor, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_FLOOR: tl.constexpr,
               DROPOUT: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DK: tl.constexpr = 0,
               TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · H`` programs: the gradient of one query tile over the key tiles it sees, and of its mask
    logits. ``BLOCK_M`` is a multiple of ``BLOCK_N``: the tile is ``G = BLOCK_M / BLOCK_N`` squares of ``BLOCK_N``
    queries. DQ is contiguous ``(B·H, N, D_K)``; ROW_GRAD ``(B·H, N)`` gets ``Σ_j dz`` per row; NEAR_GRAD
    ``(B·H, num_tiles·G, N_SLOTS, 2·BLOCK_N)`` per square of queries the diagonal sums of its near key tiles at slot
    ``r − R_MIN``, ``r`` = square − key tile (zeros in the slots this program does not visit); FAR_GRAD
    ``(B·H, num_tiles, 2)`` the sums of ``dz`` over the far-left and far-right tiles."""
    G: tl.constexpr = BLOCK_M // BLOCK_N
    qt, bh = program_tile(num_tiles)
    i0 = qt * BLOCK_M
    b = bh // H
    h = bh % H
    idx_m = tl.arange(0, BLOCK_M)
    idx_n = tl.arange(0, BLOCK_N)
    rows = i0 + idx_m
    in_rows = rows < N
    fk = feature_blocks(BLOCK_DK, TAIL_DK)
    fv = feature_blocks(BLOCK_DV, TAIL_DV)
    q = load_blocks(head_base(Q, b, h, sqb, sqh), i0, sqn, sqd, idx_m, fk, N, D_K)
    do = load_blocks(head_base(DO, b, h, sgb, sgh), i0, sgn, sgd, idx_m, fv, N, D_V)
    lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=in_rows, other=0.0)
    delta = tl.load(DELTA + bh.to(tl.int64) * N + rows, mask=in_rows, other=0.0)
    query_bias = (tl.load(A + b.to(tl.int64) * sab + rows * san, mask=in_rows, other=0.0).to(ACC)
                  + tl.load(U + h * su).to(ACC))
    left_log_m, left_gate = _gate(query_bias + tl.load(P + 2 * D * sp).to(ACC), log_floor, HAS_FLOOR)
    right_log_m, right_gate = _gate(query_bias + tl.load(P).to(ACC), log_floor, HAS_FLOOR)
    k_base = head_base(K, b, h, skb, skh)
    v_base = head_base(V, b, h, svb, svh)
    kpm_row = KPM + b.to(tl.int64) * M
    seed = tl.load(SEED) if DROPOUT else 0
    # this program's squares of queries qt·G … qt·G + G − 1 (consecutive rows of NEAR_GRAD); key tile kt of
    # square qt·G + g sits at slot qt·G + g − kt − R_MIN
    squares = NEAR_GRAD + (bh.to(tl.int64) * num_tiles * G + qt * G) * N_SLOTS * (2 * BLOCK_N)
    grad_q = zeros_blocks(BLOCK_M, BLOCK_DK, TAIL_DK, ACC)
    left_ds = tl.zeros((BLOCK_M,), dtype=ACC)
    near_dz = tl.zeros((BLOCK_M,), dtype=ACC)
    right_ds = tl.zeros((BLOCK_M,), dtype=ACC)
    key_end = M
    if CAUSAL:
        key_end = tl.minimum(M, q_offset + tl.minimum(i0 + BLOCK_M, N))
    near_start, far_right_start = _near_keys(i0, q_offset, D, BLOCK_M, BLOCK_N)
    near_end = tl.minimum(far_right_start, key_end)
    zeros = tl.zeros((2 * BLOCK_N,), dtype=ACC)
    for g in tl.static_range(G):  # the slots of key tiles this program does not visit hold 0
        for slot in range(N_SLOTS):
            j0 = (qt * G + g - R_MIN - slot) * BLOCK_N
            if (j0 < near_start) | (j0 >= near_end):
                tl.store(squares + (g * N_SLOTS + slot) * (2 * BLOCK_N) + tl.arange(0, 2 * BLOCK_N), zeros)
    near_out = squares + (qt * G - R_MIN) * (2 * BLOCK_N)  # + g·(N_SLOTS + 1) − kt slots: square g, key tile kt
    left_log_m2 = left_log_m * LOG2E
    right_log_m2 = right_log_m * LOG2E
    for j0 in tl.range(near_start, near_end, BLOCK_N, disable_licm=TAIL_DK + TAIL_DV > 0):  # near tiles
        grad_q, left_ds, near_dz, right_ds = _bwd_q_tile(
            grad_q, left_ds, near_dz, right_ds, q, do, lse, delta, k_base, v_base, i0, j0, rows, idx_n, fk, fv,
            query_bias, left_log_m2, right_log_m2, P, sp, D, q_offset, log_floor, skn, skd, svn, svd, N, M, D_K, D_V,
            kpm_row, seed, bh, scale2, drop_p, near_out, N_SLOTS, False, True, CAUSAL, HAS_KPM, HAS_FLOOR, DROPOUT,
            PRECISION, BLOCK_M, BLOCK_N)
    n_left = tl.cdiv(tl.minimum(near_start, key_end), BLOCK_N)  # far tiles: left [0, near_start), right from
    n_far = n_left + tl.cdiv(tl.maximum(key_end - far_right_start, 0), BLOCK_N)  # far_right_start, one range
    for t in tl.range(0, n_far, disable_licm=TAIL_DK + TAIL_DV > 0):
        j0, left = _far_tile(t, n_left, 0, far_right_start, BLOCK_N)
        grad_q, left_ds, near_dz, right_ds = _bwd_q_tile(
            grad_q, left_ds, near_dz, right_ds, q, do, lse, delta, k_base, v_base, i0, j0, rows, idx_n, fk, fv,
            query_bias, left_log_m2, right_log_m2, P, sp, D, q_offset, log_floor, skn, skd, svn, svd, N, M, D_K, D_V,
            kpm_row, seed, bh, scale2, drop_p, near_out, N_SLOTS, left, False, CAUSAL, HAS_KPM, HAS_FLOOR, DROPOUT,
            PRECISION, BLOCK_M, BLOCK_N)
    left_dz = left_ds * left_gate
    right_dz = right_ds * right_gate
    tl.store(ROW_GRAD + bh.to(tl.int64) * N + rows, left_dz + near_dz + right_dz, mask=in_rows)
    far_out = FAR_GRAD + (bh.to(tl.int64) * num_tiles + qt) * 2
    tl.store(far_out, tl.sum(left_dz, axis=0))
    tl.store(far_out + 1, tl.sum(right_dz, axis=0))
    store_blocks(DQ + bh.to(tl.int64) * N * D_K, i0, D_K, 1, idx_m, fk, N, D_K, scale_blocks(grad_q, scale))
