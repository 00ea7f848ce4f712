"""``@triton.jit`` helpers shared by the kernels (imported only through :func:`.runtime.load`)."""

import triton
import triton.language as tl


@triton.jit
def sigmoid(x, FAST: tl.constexpr):
    """``σ(x)`` in float32. ``FAST`` (CUDA, half-precision inputs): ``0.5·tanh(x/2) + 0.5`` with the
    hardware's ``tanh.approx`` (one instruction instead of an exponential and a division; relative error
    ~2⁻¹¹, below bfloat16's resolution). The interpreter has no inline assembly, so tests run ``FAST=False``."""
    if FAST:
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x * 0.5], dtype=tl.float32,
                                      is_pure=True, pack=1)
        return 0.5 * t + 0.5
    else:
        return tl.sigmoid(x)


@triton.jit
def log_sigmoid(x):
    """``log σ(x) = min(x, 0) − log1p(exp(−|x|))``: finite for every finite ``x``."""
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def online_softmax(score, row_max):
    """One key tile of FlashAttention-2's online softmax: ``(p, alpha, new_max)`` from the tile's scores (``−inf``
    where not allowed) and the running row maximum — ``p = exp(score − new_max)``, and ``alpha`` rescales what
    was accumulated so far. A row with no allowed key yet keeps the maximum ``−inf`` and gets ``p = 0``."""
    new_max = tl.maximum(row_max, tl.max(score, axis=1))
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    return tl.exp(score - safe_max[:, None]), tl.exp(row_max - safe_max), new_max


@triton.jit
def dropout_keep(seed, bh, rows, cols, N, M, drop_p):
    """The keep-mask of attention dropout for the (rows × cols) tile of pair ``bh``: Philox numbers drawn at
    the absolute position ``(bh·N + row)·M + col`` (int64), so forward and backward, whatever their tiles,
    draw the same number for the same score."""
    offsets = (bh.to(tl.int64) * N + rows[:, None].to(tl.int64)) * M + cols[None, :].to(tl.int64)
    return tl.rand(seed, offsets) >= drop_p


@triton.jit
def key_range(i0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, lo, hi, N, M):
    """``(start, end)``: the key tiles that queries ``i0 … i0 + BLOCK_M − 1`` (below N) reach through the band
    ``lo <= j − i <= hi``; ``start`` is aligned to a tile. Tiles outside are skipped."""
    last = tl.minimum(i0 + BLOCK_M, N) - 1
    start = tl.maximum(i0 + lo, 0)
    start = (start // BLOCK_N) * BLOCK_N
    end = tl.minimum(last + hi + 1, M)
    return start, end


@triton.jit
def query_range(j0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, lo, hi, N, M):
    """``(start, end)``: the query tiles that reach keys ``j0 … j0 + BLOCK_N − 1`` (below M) through the band
    ``lo <= j − i <= hi``; ``start`` is aligned to a tile."""
    last = tl.minimum(j0 + BLOCK_N, M) - 1
    start = tl.maximum(j0 - hi, 0)
    start = (start // BLOCK_M) * BLOCK_M
    end = tl.minimum(last - lo + 1, N)
    return start, end


def accumulator_type(dtype_name: str):
    """The Triton type of the kernels' accumulators: float64 for float64 inputs, float32 otherwise."""
    return tl.float64 if dtype_name == "float64" else tl.float32
