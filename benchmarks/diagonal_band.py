"""Is a narrow band faster off the tensor cores? The experiment behind the narrow-band tiles (docs/gpu/offline-perf.md,
"Narrow bands"; docs/design.md §3).

A band of ``w = left + right + 1`` positions (CSAN's window 11, an MTSA ``window(3)`` head: 7) fills at most
``w / roundup(15 + w, 16)`` of a tensor-core tile's scores (11/32 = 34.4 %, 7/32 = 21.9 %): ``tl.dot`` needs at
least 16 rows and a power-of-two key tile of at least 16. The only way to compute the band's scores and nothing else
is to leave the tensor cores: for each query block, one key *offset* ``t`` per step — key ``j = i − left + t`` of row
``i``, a gathered ``[BLOCK_M, d]`` row block — with the products ``q_i·k_j`` and ``p_ij v_j`` on the FMA units
(CSAN Eq. 9, one softmax over the band)::

    s_it = scale · q_i·k_{i−left+t}        p_it = exp(s_it − max_t s_it) / Σ_t exp(·)        o_i = Σ_t p_it v_{i−left+t}

Two schemes, both forward only (the question is whether the forward pays, before writing a backward):

* ``online`` — one loop over the offsets with FlashAttention's online softmax (a rescale of the accumulator and a
  second ``exp2`` per score);
* ``exact`` — a first loop computes the ``[BLOCK_M, W]`` scores (``W`` the next power of two of ``w``), an exact
  softmax, a second loop the values (no rescale, one ``exp2`` per score, but the scores are re-read per offset).

:func:`measure` compiles them for a GPU architecture without a GPU (Triton's bundled ``ptxas`` / ``nvdisasm``, the
report's own launch recording and SASS reading, :mod:`maskattn.kernels.triton.offline.perf_report`) and counts per *useful*
score (every computed score here is inside the band, except at the sequence ends) what the report counts for the
tile kernels; ``python benchmarks/diagonal_band.py`` prints both side by side. Correctness:
``tests/test_diagonal_band.py`` (interpreter, float64 oracle).
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import triton
import triton.language as tl

from maskattn.kernels.triton import runtime
from maskattn.kernels.triton.offline import perf_report, sass

__all__ = ["SCHEMES", "forward", "measure", "tile_rows"]

LOG2E = 1.4426950408889634
SCHEMES = ("online", "exact")
#: (block_m, warps) per scheme: one query row per thread (Triton lays ``[BLOCK_M, d]`` out so), 4 warps; other
#: shapes give the same counts per score (measured: 32 × 1, 64 × 2, 128 × 4 within 1 %)
TILES = {"online": (128, 4), "exact": (128, 4)}


@triton.jit
def _rows(Q, base, rows, feats, N, BLOCK_D: tl.constexpr):
    """The ``[BLOCK_M, BLOCK_D]`` block of rows ``rows`` (zeros outside ``0 <= row < N``)."""
    inside = (rows >= 0) & (rows < N)
    return tl.load(Q + base + rows[:, None] * BLOCK_D + feats[None, :], mask=inside[:, None], other=0.0), inside


@triton.jit
def _query_block(Q, N, num_tiles, scale2, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """``(bh, base, rows, feats, q)`` of this program: its (batch·head) pair, the offset of that pair's rows, the
    block's query rows, the feature indices and the scaled queries in float32."""
    pid = tl.program_id(0)
    tile = pid % num_tiles
    bh = pid // num_tiles
    base = bh.to(tl.int64) * N * BLOCK_D  # contiguous (B·H, N, BLOCK_D)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    feats = tl.arange(0, BLOCK_D)
    q, _ = _rows(Q, base, rows, feats, N, BLOCK_D)
    return bh, base, rows, feats, q.to(tl.float32) * scale2


@triton.jit(do_not_specialize=["N", "num_tiles", "left"])
def diagonal_online_fwd(Q, K, V, O, LSE, N, num_tiles, left, scale2, W: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """One query block per program; offsets ``t = 0 … W − 1`` one per step, online softmax in log₂ units."""
    bh, base, rows, feats, q = _query_block(Q, N, num_tiles, scale2, BLOCK_M, BLOCK_D)
    row_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    row_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for t in range(W):
        k, inside = _rows(K, base, rows - left + t, feats, N, BLOCK_D)
        s = tl.where(inside, tl.sum(q * k.to(tl.float32), axis=1), float("-inf"))
        new_max = tl.maximum(row_max, s)
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row with no key yet
        alpha = tl.exp2(row_max - shift)
        p = tl.exp2(s - shift)
        row_sum = row_sum * alpha + p
        v, _ = _rows(V, base, rows - left + t, feats, N, BLOCK_D)
        acc = acc * alpha[:, None] + p[:, None] * v.to(tl.float32)
        row_max = new_max
    kept = rows < N
    row_sum = tl.where(kept, row_sum, 1.0)  # rows past the sequence (not stored) divide by 1, not 0
    tl.store(O + base + rows[:, None] * BLOCK_D + feats[None, :], (acc / row_sum[:, None]).to(O.dtype.element_ty),
             mask=kept[:, None])
    tl.store(LSE + bh.to(tl.int64) * N + rows, row_max + tl.log2(row_sum), mask=kept)


@triton.jit(do_not_specialize=["N", "num_tiles", "left"])
def diagonal_exact_fwd(Q, K, V, O, LSE, N, num_tiles, left, scale2, W: tl.constexpr, W_POW2: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """One query block per program: the ``[BLOCK_M, W_POW2]`` scores of every offset, an exact softmax, then the
    values offset by offset."""
    bh, base, rows, feats, q = _query_block(Q, N, num_tiles, scale2, BLOCK_M, BLOCK_D)
    offsets = tl.arange(0, W_POW2)
    scores = tl.full((BLOCK_M, W_POW2), float("-inf"), tl.float32)
    for t in range(W):
        k, inside = _rows(K, base, rows - left + t, feats, N, BLOCK_D)
        s = tl.where(inside, tl.sum(q * k.to(tl.float32), axis=1), float("-inf"))
        scores = tl.where(offsets[None, :] == t, s[:, None], scores)
    kept = rows < N
    row_max = tl.where(kept, tl.max(scores, axis=1), 0.0)  # finite for rows < N: the diagonal is always inside
    probs = tl.exp2(scores - row_max[:, None])
    row_sum = tl.where(kept, tl.sum(probs, axis=1), 1.0)
    probs = probs / row_sum[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for t in range(W):
        p = tl.sum(tl.where(offsets[None, :] == t, probs, 0.0), axis=1)
        v, _ = _rows(V, base, rows - left + t, feats, N, BLOCK_D)
        acc += p[:, None] * v.to(tl.float32)
    tl.store(O + base + rows[:, None] * BLOCK_D + feats[None, :], acc.to(O.dtype.element_ty), mask=kept[:, None])
    tl.store(LSE + bh.to(tl.int64) * N + rows, row_max + tl.log2(row_sum), mask=kept)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, left: int, right: int, scheme: str = "online",
            block_m: int | None = None, warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of band attention (key ``j`` of query ``i`` when ``−left <= j − i <= right``, scale ``1/√d``)
    of contiguous ``(B, H, N, d)`` q, k, v, ``d`` a power of two ≥ 16 (an experiment: no padding of features);
    ``lse`` in log₂ units."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    B, H, N, D = q.shape
    if D < 16 or D & (D - 1) or not all(x.is_contiguous() and x.shape == q.shape for x in (q, k, v)):
        raise ValueError(f"q, k, v must be contiguous (B, H, N, d) of one shape with d a power of two >= 16, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if left < 0 or right < 0:
        raise ValueError(f"left and right must be >= 0, got {left}, {right}")
    default_m, default_warps = TILES[scheme]
    block_m = block_m or (16 if runtime.interpreted() else default_m)
    warps = warps or (1 if runtime.interpreted() else default_warps)
    out = torch.empty_like(q)
    lse = q.new_empty(B, H, N, dtype=torch.float32)
    tiles = triton.cdiv(N, block_m)
    width = left + right + 1
    kernel, extra = ((diagonal_online_fwd, {}) if scheme == "online"
                     else (diagonal_exact_fwd, {"W_POW2": triton.next_power_of_2(width)}))
    runtime.launch(kernel, tiles * B * H, q, k, v, out, lse, N, tiles, left, LOG2E / math.sqrt(D), W=width,
                   BLOCK_M=block_m, BLOCK_D=D, num_warps=warps, num_stages=1, **extra)
    return out, lse


def measure(scheme: str, width: int, head_dim: int, arch: int, n: int = 2048) -> dict:
    """Per useful score of the forward of a centred band of ``width`` positions at length ``n`` on ``arch``
    (bfloat16): warp instructions, ``MUFU``, bytes of global loads (L1 requests here: a key row is read by ``width``
    neighbouring queries), registers and spilled bytes — counted as :func:`perf_report.measure` counts the tile
    kernels (every program's code outside the loops once, each loop body once per offset)."""
    block_m, warps = TILES[scheme]
    left = (width - 1) // 2
    with runtime.recording(runtime.TARGETS[arch]) as launches:
        q, k, v = (torch.zeros(1, 8, n, head_dim, dtype=torch.bfloat16) for _ in range(3))
        forward(q, k, v, left, width - 1 - left, scheme, block_m, warps)
    cubin, _, _, _ = sass.compile_launch(launches[0], arch)
    text, registers = sass.disassemble(cubin)
    instructions = sass.parse_sass(text)
    where = {ins.label: i for i, ins in enumerate(instructions) if ins.label}
    # the offset loops: backward branches over more than one instruction (not the spin after EXIT)
    loops = sorted({(where[ins.target], i) for i, ins in enumerate(instructions)
                    if ins.target in where and where[ins.target] < i})
    inside = {i for a, b in loops for i in range(a, b + 1)}
    programs = -(-n // block_m)
    total = sass.Counts().add(sass.classify([x for i, x in enumerate(instructions) if i not in inside]),
                                     programs)
    for a, b in loops:
        total = total.add(sass.classify(sass.path_counts(instructions[a:b + 1])[1]), programs * width)
    useful = sum(min(n - 1, i + width - 1 - left) - max(0, i - left) + 1 for i in range(n))
    threads = 32 * warps
    return dict(kernel=f"diagonal_{scheme}_fwd", width=width, head_dim=head_dim, arch=arch, tiles=f"{block_m} rows",
                registers=registers, spill_bytes=sass.spilled_bytes(text),
                in_band=useful / (programs * block_m * width), issue=total.instructions * warps / useful,
                mufu=total.mufu_total * threads / useful, ldg_bytes=total.ldg_bytes * threads / useful,
                tensor_flops=total.tensor_flops * warps / useful)


def tile_rows(head_dim: int, arch: int, n: int = 2048) -> list[dict]:
    """The same figures per useful score for the tile kernels' forward of the two narrow bands, from the report:
    CSAN window 11 (``band_fwd``, narrow tiles) and an MTSA ``window(3)`` head (``tensorized_fwd``, its launch)."""
    out = []
    for family, kernel, mask, head, width in (("band-narrow", "band_fwd", "band 11 (CSAN window 11)", 0, 11),
                                              ("mtsa", "tensorized_fwd", "window(3) head", 3, 7)):
        row, = perf_report.measure(perf_report.Pass(family, kernel, mask, head), head_dim, arch, lengths=(n,))
        if row.error:
            raise RuntimeError(f"{kernel} ({mask}): {row.error}")
        scale = row.computed / max(row.useful, 1)
        s = row.per_score
        out.append(dict(kernel=kernel, width=width, head_dim=head_dim, arch=arch,
                        tiles=f"{row.tiles} ({row.warps} warps)", registers=row.registers,
                        spill_bytes=row.spill_bytes, in_band=row.useful_fraction, issue=s["issue"] * scale,
                        mufu=s["mufu"] * scale, ldg_bytes=s["ldg_bytes"] * scale,
                        tensor_flops=s["tensor_flops"] * scale))
    return out


def table(rows: list[dict]) -> str:
    lines = ["| pass | band | d | arch | tiles | regs | spill B | in band | warp instr / useful score "
             "| MUFU / useful score | LDG B / useful score | TC FLOP / useful score |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['width']} | {r['head_dim']} | sm_{r['arch']} | {r['tiles']} "
                     f"| {r['registers']} | {r['spill_bytes']} | {r['in_band']:.1%} | {r['issue']:.1f} "
                     f"| {r['mufu']:.2f} | {r['ldg_bytes']:.0f} | {r['tensor_flops']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--archs", type=int, nargs="+", default=[90, 80])
    parser.add_argument("--length", type=int, default=2048)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = []
    for arch in args.archs:
        for d in args.dims:
            tiles = tile_rows(d, arch, args.length)
            rows += [tiles[0]] + [measure(s, 11, d, arch, args.length) for s in SCHEMES]
            rows += [tiles[1]] + [measure(s, 7, d, arch, args.length) for s in SCHEMES]
    print(table(rows))
    print(f"\n(n = {args.length}, bfloat16; {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
