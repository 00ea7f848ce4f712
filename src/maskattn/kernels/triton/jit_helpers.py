"""``@triton.jit`` helpers shared by the kernels (imported only through :func:`.runtime.load`).

Exponentials are base 2 (``exp2``, ``log2``: the hardware's ``ex2`` / ``lg2``); callers fold ``log₂e`` into the
factor they already multiply by (the score scale), FlashAttention-2's way."""

import os

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # log₂ e (a constexpr: @jit functions read only those as globals)
LN2 = tl.constexpr(0.6931471805599453)  # ln 2
#: Triton's interpreter runs these kernels (it has no inline PTX: the special-function helpers take its exact
#: operations; this module is imported once the runtime has decided, :func:`.runtime.load`)
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def log2_mufu(x):
    """``log₂ x`` on the special-function unit: ``lg2.approx.f32``, one ``MUFU.LG2`` (PTX ISA: maximum absolute error
    2⁻²²·⁶ for x in [0.5, 2], relative 2⁻²² elsewhere) where ``tl.log2`` is libdevice's accurate ``log2f``, ~20
    FMA-pipe instructions. Float64 and the interpreter take ``tl.log2``."""
    if x.dtype == tl.float64 or INTERPRETED:
        return tl.log2(x)
    else:
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)


@triton.jit
def reciprocal_mufu(x):
    """``1 / x`` on the special-function unit: ``rcp.approx.ftz.f32``, one ``MUFU.RCP`` (PTX ISA: maximum relative
    error 2⁻²³; denormal results flush to zero — the callers' ``x`` lie in [1, 2]). Float64 and the interpreter
    divide."""
    if x.dtype == tl.float64 or INTERPRETED:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)


@triton.jit
def sigmoid_log2(x2):
    """``σ(x)`` of ``x2 = x·log₂e`` (a score whose scale already holds ``log₂e``): ``1 / (1 + 2^(−x2))``."""
    return 1.0 / (1.0 + tl.exp2(-x2))


@triton.jit
def sigmoid_log2_rcp(x2):
    """``σ(x)`` of ``x2 = x·log₂e``, like :func:`sigmoid_log2`, in two special-function instructions and three others
    (docs/design.md §3; docs/gpu/offline-perf.md): ``t = 2^(−|x2|)`` in (0, 1] (``ex2``), then ``σ = r`` for ``x2 >= 0``
    and ``t·r`` below with ``r = 1 / (1 + t)`` (:func:`reciprocal_mufu`: ``1 + t`` in [1, 2], relative error 2⁻²³).
    Relative accuracy as :func:`sigmoid_log2`'s over the whole range (no cancellation; a tiny σ is ``t`` itself to
    within a few ulp); ±inf give 1 and 0, NaN stays NaN. (The last round computed ``r`` by three Newton steps on the
    FMA units, seven FMAs per score, to spare a ``MUFU``; the passes are bound by instruction issue, not by the
    special-function unit: docs/gpu/offline-perf.md, "Predicted time".)"""
    t = tl.exp2(-tl.abs(x2))
    r = reciprocal_mufu(1.0 + t)
    return tl.where(x2 >= 0, r, t * r)


@triton.jit
def sigmoid(x):
    """``σ(x) = 1 / (1 + 2^(−x·log₂e))`` in ``x``'s type: one ``exp2`` and one division, with a relative error of a
    few ulp over the whole range — no cancellation, unlike ``½·tanh(x/2) + ½``, whose hardware ``tanh.approx`` has an
    *absolute* error near 2⁻¹¹ (docs/design.md §3). Below float32's normal range (``x < −87``) it is 0 or a
    denormal, as ``torch.sigmoid``; the same formula runs under the interpreter and on CUDA."""
    return 1.0 / (1.0 + tl.exp2(-x * LOG2E))


@triton.jit
def log_sigmoid(x):
    """``log σ(x) = min(x, 0) − log(1 + exp(−|x|))``: finite for every finite ``x``; the logarithm of a value in
    (1, 2] on the special-function unit (:func:`log2_mufu`: absolute error below 2⁻²² there, so below 1.2·10⁻⁷ in
    ``log σ``)."""
    return tl.minimum(x, 0.0) - LN2 * log2_mufu(1.0 + tl.exp2(-tl.abs(x) * LOG2E))


@triton.jit
def online_softmax(score, row_max):
    """One key tile of FlashAttention-2's online softmax in base 2: ``(p, alpha, new_max)`` from the tile's scores
    in log₂ units (``−inf`` where not allowed) and the running row maximum — ``p = 2^(score − new_max)``, and
    ``alpha`` rescales what was accumulated so far. A row with no allowed key yet keeps the maximum ``−inf`` and
    gets ``p = 0``."""
    new_max = tl.maximum(row_max, tl.max(score, axis=1))
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    return tl.exp2(score - safe_max[:, None]), tl.exp2(row_max - safe_max), new_max


@triton.jit
def online_softmax_scaled(score, scale2, row_bias, row_max):
    """:func:`online_softmax` of the scores ``score·scale2 + row_bias`` (``scale2 > 0``; ``row_bias`` one value per
    row) without forming them: the row maximum is taken of the unscaled scores, and the scale, the row's bias and
    its maximum are folded into the exponent's argument — one FMA per score, FlashAttention-2's way (the Triton
    tutorial's ``qk·scale − m``). ``score`` ``−inf`` where not allowed."""
    new_max = tl.maximum(row_max, tl.max(score, axis=1) * scale2 + row_bias)
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    return tl.exp2(score * scale2 + (row_bias - safe_max)[:, None]), tl.exp2(row_max - safe_max), new_max


#: Philox-4×32 rounds of the dropout masks: 7, the fewest that pass TestU01's BigCrush (Salmon et al., SC 2011,
#: "Parallel random numbers: as easy as 1, 2, 3", Table 2); Triton's default is 10
DROPOUT_ROUNDS = tl.constexpr(7)


@triton.jit
def dropout_keep(seed, bh, rows, j0, N, M, drop_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keep-mask of attention dropout for the tile of pair ``bh``, query ``rows`` (``BLOCK_M``) × keys
    ``j0 … j0 + BLOCK_N − 1``: one 32-bit Philox number per score, drawn at its absolute position
    ``(bh·N + row)·M + col`` (int64), so forward and backward, whatever their tiles, draw the same number for the
    same score; kept when it is at least ``p·2³²`` (an integer comparison, no conversion to float).

    One Philox call per four scores (``tl.rand4x``) would do a quarter of the arithmetic, but spreading its four
    numbers over a tile (``tl.join`` and a reshape into the accumulator's layout) spilled ~1 KB of registers per
    thread on sm_80 in the offline compile check (docs/gpu.md), where one call per score with 7 rounds spills
    none."""
    cols = j0 + tl.arange(0, BLOCK_N)
    offsets = (bh.to(tl.int64) * N + rows[:, None].to(tl.int64)) * M + cols[None, :].to(tl.int64)
    numbers = tl.randint(seed, offsets, DROPOUT_ROUNDS).to(tl.uint32, bitcast=True)
    return numbers >= tl.cast(drop_p * 4294967296.0, tl.uint32)


@triton.jit
def dropout_key_pass(seed, bh, rows, j0, N, M, drop_p, grad, probs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Attention dropout in a key pass (keys along the tile's rows: the forward's tile transposed): ``(grad,
    probs)`` with the dropped scores zeroed and the kept ones scaled by ``1 / (1 − p)``, drawn by
    :func:`dropout_keep` at the same positions as the forward."""
    keep = tl.trans(dropout_keep(seed, bh, rows, j0, N, M, drop_p, BLOCK_M, BLOCK_N))
    return tl.where(keep, grad / (1.0 - drop_p), 0.0), tl.where(keep, probs / (1.0 - drop_p), 0.0)


@triton.jit
def key_range(i0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, lo, hi, N, M, ALIGNED: tl.constexpr):
    """``(start, end)``: the key tiles that queries ``i0 … i0 + BLOCK_M − 1`` (below N) reach through the band
    ``lo <= j − i <= hi``; ``start`` is aligned to a tile (``ALIGNED``) or the band's first key (no visited tile
    starts before the band: a narrow band fills one tile). Tiles outside are skipped."""
    last = tl.minimum(i0 + BLOCK_M, N) - 1
    start = tl.maximum(i0 + lo, 0)
    if ALIGNED:
        start = (start // BLOCK_N) * BLOCK_N
    end = tl.minimum(last + hi + 1, M)
    return start, end


@triton.jit
def query_range(j0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, lo, hi, N, M, ALIGNED: tl.constexpr):
    """``(start, end)``: the query tiles that reach keys ``j0 … j0 + BLOCK_N − 1`` (below M) through the band
    ``lo <= j − i <= hi``; ``start`` is aligned to a tile (``ALIGNED``) or the band's first query."""
    last = tl.minimum(j0 + BLOCK_N, M) - 1
    start = tl.maximum(j0 - hi, 0)
    if ALIGNED:
        start = (start // BLOCK_M) * BLOCK_M
    end = tl.minimum(last - lo + 1, N)
    return start, end


@triton.jit
def aligned_run(start, end, lowest, highest, BLOCK: tl.constexpr):
    """``(first, stop)``: among the tile starts ``start, start + BLOCK, … < end``, the run ``first <= t < stop``
    of those with ``lowest <= t <= highest`` (empty when ``first >= stop``). With ``lowest``/``highest`` the bounds
    that put a whole tile inside a band, it splits a loop into masked edges and an unmasked interior."""
    first = start + tl.maximum(lowest - start + BLOCK - 1, 0) // BLOCK * BLOCK
    first = tl.minimum(first, end)
    stop = tl.where(highest >= first, start + (highest - start) // BLOCK * BLOCK + BLOCK, first)
    return first, tl.minimum(tl.maximum(stop, first), end)


@triton.jit
def program_tile(num_tiles):
    """``(tile, pair)`` of this program on the launches' one grid axis (``runtime.launch``): consecutive programs
    are consecutive tiles of one (batch, head) pair, whose keys stay in L2 between them."""
    pid = tl.program_id(0)
    return pid % num_tiles, pid // num_tiles


@triton.jit
def tile_pointers(base, start, stride_n, stride_d, idx, feats):
    """Pointers to the ``(len(idx), len(feats))`` tile of rows ``start + idx`` of a matrix at ``base`` (the
    tile's row offset in int64, so offsets past 2³¹ elements stay exact; int32 offsets inside the tile)."""
    return base + tl.cast(start, tl.int64) * stride_n + idx[:, None] * stride_n + feats[None, :] * stride_d


@triton.jit
def head_base(PTR, b, h, stride_b, stride_h):
    """``PTR`` advanced to (batch ``b``, head ``h``) with int64 offsets."""
    return PTR + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def load_tile(base, start, stride_n, stride_d, idx, feats, N, D):
    """The ``(len(idx), len(feats))`` tile of rows ``start + idx`` of an ``(N, D)`` matrix at ``base``; 0 outside."""
    mask = ((start + idx)[:, None] < N) & (feats[None, :] < D)
    return tl.load(tile_pointers(base, start, stride_n, stride_d, idx, feats), mask=mask, other=0.0)


@triton.jit
def store_tile(base, start, stride_n, stride_d, idx, feats, N, D, value):
    """Store ``value`` into rows ``start + idx`` (below N) and features ``feats`` (below D) of the matrix at ``base``."""
    mask = ((start + idx)[:, None] < N) & (feats[None, :] < D)
    tl.store(tile_pointers(base, start, stride_n, stride_d, idx, feats), value, mask=mask)


def accumulator_type(dtype_name: str):
    """The Triton type of the kernels' accumulators: float64 for float64 inputs, float32 otherwise."""
    return tl.float64 if dtype_name == "float64" else tl.float32


# --------------------------------------------------------------------------------------------------
# feature blocks: a head width that is not a power of two as a main block and a tail block
# --------------------------------------------------------------------------------------------------
# A padded head width such as 160 (d = 150) is tiled as a main block of 128 features and a tail block of 32, both
# powers of two (:func:`.runtime.feature_split`), so no ``tl.dot`` runs on a power-of-two padding to 256. A kernel
# holds each feature-indexed tile as a tuple of blocks: ``(main,)`` for a power-of-two width — the same operations
# as one tile, so such widths compile exactly as before — or ``(main, tail)``. Scores sum the blocks' products
# (``q_main·k_mainᵀ + q_tail·k_tailᵀ``); value-side accumulators keep one block each. ``BLOCK_D`` is the width
# covered (main + tail), ``TAIL_D`` the tail block's (0: none).

@triton.jit
def tail_region():
    """Always true, but not to the compiler: a tail block's products run under ``if tail_region():``, a region of
    their own. Triton's MMA v2 layout pass (sm_80 – sm_89, sm_120) lays out every ``tl.dot`` it finds linked to
    another through operands or accumulators in the same region with all warps along one axis; in MTSA's forward a
    main and a tail product linked so put a 64-row tile's 8 warps along its rows and computed each product twice
    (or, 16 rows per warp, spilled: 160 accumulator registers per thread). Apart, each takes its own layout (the
    value products' warps along the features, as a one-block tile's). wgmma's layouts (sm_90) do not depend on
    it. Under the interpreter it is just true."""
    return tl.program_id(0) >= 0


@triton.jit
def feature_blocks(BLOCK_D: tl.constexpr, TAIL_D: tl.constexpr):
    """The feature indices of each block: ``(0 … BLOCK_D − 1,)``, or with a tail the main block
    ``0 … BLOCK_D − TAIL_D − 1`` and the tail ``BLOCK_D − TAIL_D … BLOCK_D − 1``."""
    if TAIL_D > 0:
        return (tl.arange(0, BLOCK_D - TAIL_D), (BLOCK_D - TAIL_D) + tl.arange(0, TAIL_D))
    else:
        return (tl.arange(0, BLOCK_D),)


@triton.jit
def zeros_blocks(ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TAIL_D: tl.constexpr, dtype: tl.constexpr):
    """Accumulators of ``ROWS`` rows, one per feature block of :func:`feature_blocks`, filled with 0."""
    if TAIL_D > 0:
        return (tl.zeros((ROWS, BLOCK_D - TAIL_D), dtype=dtype), tl.zeros((ROWS, TAIL_D), dtype=dtype))
    else:
        return (tl.zeros((ROWS, BLOCK_D), dtype=dtype),)


@triton.jit
def load_rows(base, start, stride_n, stride_d, idx, feats, N):
    """:func:`load_tile` with a mask on the rows only: a main block, whose features all lie below the width."""
    mask = (start + idx)[:, None] < N
    return tl.load(tile_pointers(base, start, stride_n, stride_d, idx, feats), mask=mask, other=0.0)


@triton.jit
def store_rows(base, start, stride_n, stride_d, idx, feats, N, value):
    """:func:`store_tile` with a mask on the rows only (a main block)."""
    mask = (start + idx)[:, None] < N
    tl.store(tile_pointers(base, start, stride_n, stride_d, idx, feats), value, mask=mask)


@triton.jit
def load_blocks(base, start, stride_n, stride_d, idx, feats, N, D):
    """The blocks of rows ``start + idx`` of an ``(N, D)`` matrix at ``base``, one per block of ``feats``
    (:func:`feature_blocks`); 0 outside. A lone block is :func:`load_tile` (features masked at ``D``); a split width
    masks rows only: its matrices are laid out exactly main + tail wide (:func:`.runtime.feature_width`; the
    wrappers zero the features past the head's own), so no block has a feature past ``D``."""
    if len(feats) == 1:
        return (load_tile(base, start, stride_n, stride_d, idx, feats[0], N, D),)
    else:
        return (load_rows(base, start, stride_n, stride_d, idx, feats[0], N),
                load_rows(base, start, stride_n, stride_d, idx, feats[1], N))


@triton.jit
def store_blocks(base, start, stride_n, stride_d, idx, feats, N, D, value):
    """Store the blocks ``value`` (:func:`load_blocks`' layout and masks, cast to the pointer's type) into rows
    ``start + idx`` (below N) of the matrix at ``base``."""
    if len(feats) == 1:
        store_tile(base, start, stride_n, stride_d, idx, feats[0], N, D, value[0].to(base.dtype.element_ty))
    else:
        store_rows(base, start, stride_n, stride_d, idx, feats[0], N, value[0].to(base.dtype.element_ty))
        store_rows(base, start, stride_n, stride_d, idx, feats[1], N, value[1].to(base.dtype.element_ty))


@triton.jit
def dot_nt_blocks(a, b, PRECISION: tl.constexpr):
    """``Σ_blocks a·bᵀ``: the (rows of a × rows of b) products of two blocked tiles over their features."""
    acc = tl.dot(a[0], tl.trans(b[0]), input_precision=PRECISION)
    if len(a) > 1:
        acc = tl.dot(a[1], tl.trans(b[1]), acc, input_precision=PRECISION)
    return acc


@triton.jit
def dot_nt_blocks_acc(a, b, acc, PRECISION: tl.constexpr):
    """``acc + Σ_blocks a·bᵀ`` (:func:`dot_nt_blocks` accumulated into ``acc``)."""
    acc = tl.dot(a[0], tl.trans(b[0]), acc, input_precision=PRECISION)
    if len(a) > 1:
        acc = tl.dot(a[1], tl.trans(b[1]), acc, input_precision=PRECISION)
    return acc


@triton.jit
def dot_blocks(p, v, acc, PRECISION: tl.constexpr):
    """``acc + p·v`` per block: ``p`` ``(rows, K)`` (cast to the blocks' type) times each block of ``v``
    ``(K, ·)``, into the matching block of ``acc``."""
    if len(v) == 1:
        return (tl.dot(p.to(v[0].dtype), v[0], acc[0], input_precision=PRECISION),)
    else:
        return (tl.dot(p.to(v[0].dtype), v[0], acc[0], input_precision=PRECISION),
                tl.dot(p.to(v[1].dtype), v[1], acc[1], input_precision=PRECISION))


@triton.jit
def dot_nt_blocks_apart(a, b, PRECISION: tl.constexpr):
    """:func:`dot_nt_blocks` with the tail's product in a region of its own (:func:`tail_region`)."""
    acc = tl.dot(a[0], tl.trans(b[0]), input_precision=PRECISION)
    if len(a) > 1:
        if tail_region():
            acc = tl.dot(a[1], tl.trans(b[1]), acc, input_precision=PRECISION)
    return acc


@triton.jit
def dot_blocks_apart(p, v, acc, PRECISION: tl.constexpr):
    """:func:`dot_blocks` with the tail's product in a region of its own (:func:`tail_region`)."""
    if len(v) == 1:
        return (tl.dot(p.to(v[0].dtype), v[0], acc[0], input_precision=PRECISION),)
    else:
        main = tl.dot(p.to(v[0].dtype), v[0], acc[0], input_precision=PRECISION)
        tail = acc[1]
        if tail_region():
            tail = tl.dot(p.to(v[1].dtype), v[1], tail, input_precision=PRECISION)
        return (main, tail)


@triton.jit
def scale_rows_blocks(acc, factor):
    """Each block of ``acc`` with its rows multiplied by ``factor`` (one value per row)."""
    if len(acc) == 1:
        return (acc[0] * factor[:, None],)
    else:
        return (acc[0] * factor[:, None], acc[1] * factor[:, None])


@triton.jit
def scale_blocks(acc, factor):
    """Each block of ``acc`` times the scalar ``factor``."""
    if len(acc) == 1:
        return (acc[0] * factor,)
    else:
        return (acc[0] * factor, acc[1] * factor)


@triton.jit
def divide_rows_blocks(acc, total, empty):
    """Each block of ``acc`` with its rows divided by ``total`` (one value per row), and 0 in the rows where
    ``empty`` holds (their ``total`` is not divided by: a row with no allowed key)."""
    if len(acc) == 1:
        return (tl.where(empty[:, None], 0.0, acc[0] / tl.where(empty, 1.0, total)[:, None]),)
    else:
        safe = tl.where(empty, 1.0, total)
        return (tl.where(empty[:, None], 0.0, acc[0] / safe[:, None]),
                tl.where(empty[:, None], 0.0, acc[1] / safe[:, None]))


@triton.jit
def keep_rows_blocks(acc, keep):
    """Each block of ``acc`` with 0 in the rows where ``keep`` (one value per row) does not hold."""
    if len(acc) == 1:
        return (tl.where(keep[:, None], acc[0], 0.0),)
    else:
        return (tl.where(keep[:, None], acc[0], 0.0), tl.where(keep[:, None], acc[1], 0.0))
