"""The offline performance report of maskattn's Triton kernels (docs/gpu/offline-perf.md; docs/design.md §3, §8):
what each kernel pass spends per score, read from the machine code a GPU would run, beside an FlashAttention-2-class
anchor compiled in the same run at the same shapes (``benchmarks/anchor_attention.py``).

For each pass it records the launches the real launchers make (:func:`.compile_check.record`, inside
:func:`.runtime.recording`: no GPU), binds and compiles them as ``JITFunction.run`` would
(:func:`.compile_check.bind`, ``triton.compile`` for ``GPUTarget("cuda", arch, 32)``), disassembles the cubin with
the ``nvdisasm`` that the ``triton`` wheel bundles, and reads from the SASS:

* the **hot loop** — the innermost loop with the most tensor-core instructions, one iteration per tile of
  ``BLOCK_M × BLOCK_N`` scores — along its lightest path (an interior tile: the mask branch skipped) and its
  heaviest (an edge tile: masked, or DMAN's near tile);
* per tile and per score: tensor-core instructions (``HMMA`` = ``mma.sync``, ``HGMMA`` = wgmma) and their FLOPs,
  special-function instructions (``MUFU``: ``ex2``, ``rcp``, ``lg2`` …), global loads (``LDG`` / ``LDGSTS``: count
  and bytes), shared-memory traffic (``LDS``, ``LDSM``, ``STS``, ``STSM`` and the shared-memory operands that wgmma
  reads) and all warp instructions (issue slots);
* registers, spilled bytes (local-memory stores), shared memory per block and the occupancy they allow.

The per-score figures are *dynamic estimates* for a shape (B·H pairs, n): every program's instructions outside the
hot loop once, plus the loop body once per tile it visits — interior tiles on the light path, edge tiles on the
heavy one — with the tiles each program visits mirrored from the kernel's loop bounds (:func:`visited_tiles`).
*Computed* scores are the tiles' areas; *useful* scores those inside the mask and the sequence.

``python -m maskattn.kernels.triton.offline.perf_report --doc docs/gpu/offline-perf.md --predictions
docs/gpu/offline-perf.json`` (``--jobs 2``; ``--archs``, ``--dims``, ``--lengths``, ``--families`` and ``--kernels``
narrow it). Run it in its own process: Triton reads ``TRITON_INTERPRET`` when the kernels are first decorated. It
cannot pass vacuously: a bad argument (a head width, length or ``--jobs`` below 1, a family or pass it does not
have, filters that leave only the anchor, an unreadable ``--before``, an output it could not write) stops it in one
line before anything is compiled, a failed pass is an error row (exit status 1) and meets no target.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import anchor
from .sass import (Counts, classify, compile_launch, disassemble, hot_loops, occupancy, parse_sass, path_counts,
                   spilled_bytes)

__all__ = ["visited_tiles", "Pass", "Row", "measure", "report", "main", "SHAPES", "ARCHS", "DIMS"]

#: the report's shapes: B·H = 8 (batch 2 × 4 heads, compile_check's calls), n = 2,048 and 16,384; d = 64, 128 and
#: 150 (the sentence presets' heads: d_model 300 over 2 heads), bfloat16 (the per-score figures are per (batch, head)
#: pair: they do not depend on B·H)
SHAPES = (2048, 16384)
BATCH, HEADS = 2, 4
DIMS = (64, 128, 150)
ARCHS = (90, 80)


def _aligned_run(start: int, end: int, lowest: int, highest: int, block: int) -> tuple[int, int]:
    """:func:`.jit_helpers.aligned_run` in Python."""
    first = min(start + max(lowest - start + block - 1, 0) // block * block, end)
    stop = start + (highest - start) // block * block + block if highest >= first else first
    return first, min(max(stop, first), end)


def _band_mask(lo: int, hi: int, n: int):
    return lambda i, j: (j - i >= lo) & (j - i <= hi) & (i < n) & (j < n)


def visited_tiles(kernel: str, n: int, block_m: int, block_n: int, band: tuple[int, int] = (-(1 << 30), 1 << 30),
                  causal: bool = False, distance: tuple[int, int] = (1, 0), aligned: bool = True):
    """``(tiles, allowed)`` for one (batch, head) pair at length ``n``: every tile ``(i0, j0, heavy)`` the kernel
    ``kernel`` visits (``i0`` the first query, ``j0`` the first key of a ``block_m × block_n`` tile, ``heavy``:
    it runs the masked / near path), mirrored from the kernel's loop bounds; ``allowed(i, j)`` the mask (band
    ``lo <= j − i <= hi`` for MTSA and the local band; ``causal`` for DMAN and the anchor; DMAN's clip distance and
    query offset ``distance = (D, q_offset)``, which decide its near tiles as ``dman_jit._near_keys`` /
    ``_near_queries`` do). MTSA's tiles start at a tile multiple (``aligned``) or where the band starts (its narrow
    launch, ``BAND_START``)."""
    lo, hi = band
    tiles: list[tuple[int, int, bool]] = []
    family, _, kind = kernel.partition("_")
    if family == "tensorized":
        allowed = _band_mask(lo, hi, n)
        if kind == "bwd_kv":
            for j0 in range(0, n, block_n):
                last = min(j0 + block_n, n) - 1
                start = max(j0 - hi, 0) // block_m * block_m if aligned else max(j0 - hi, 0)
                end = min(last - lo + 1, n)
                first, stop = _aligned_run(start, end, j0 + block_n - 1 - hi, j0 - block_m + 1 - lo, block_m)
                tiles += [(i0, j0, i0 < first or i0 >= stop or j0 + block_n > n) for i0 in range(start, end, block_m)]
        else:
            for i0 in range(0, n, block_m):
                last = min(i0 + block_m, n) - 1
                start = max(i0 + lo, 0) // block_n * block_n if aligned else max(i0 + lo, 0)
                end = min(last + hi + 1, n)
                first, stop = _aligned_run(start, end, i0 + block_m - 1 + lo, i0 + hi - block_n + 1, block_n)
                tiles += [(i0, j0, j0 < first or j0 >= stop or j0 + block_n > n) for j0 in range(start, end, block_n)]
    elif family == "band":
        left, right = -lo, hi
        allowed = _band_mask(lo, hi, n)
        if kind.startswith("bwd_kv"):
            for j0 in range(0, n, block_n):
                last = min(j0 + block_n, n) - 1
                start, end = max(j0 - right, 0), min(last + left + 1, n)
                first, stop = _aligned_run(start, end, j0 + block_n - 1 - right, j0 + left - block_m + 1, block_m)
                tiles += [(i0, j0, i0 < first or i0 >= stop) for i0 in range(start, end, block_m)]
        else:
            for i0 in range(0, n, block_m):
                last = min(i0 + block_m, n) - 1
                start, end = max(i0 - left, 0), min(last + right + 1, n)
                first, stop = _aligned_run(start, end, i0 + block_m - 1 - left, i0 + right - block_n + 1, block_n)
                tiles += [(i0, j0, j0 < first or j0 >= stop) for j0 in range(start, end, block_n)]
    elif family == "dman":
        D, q_offset = distance
        allowed = ((lambda i, j: (j <= q_offset + i) & (i < n) & (j < n)) if causal
                   else (lambda i, j: (i < n) & (j < n)))
        if kind == "bwd_kv":
            for j0 in range(0, n, block_n):
                start = max(j0 - q_offset, 0) // block_m * block_m if causal else 0
                near_start = -(-max(j0 + 2 - block_m - D - q_offset, 0) // block_m) * block_m
                far_left = -(-max(j0 + block_n - 1 + D - q_offset, 0) // block_m) * block_m
                tiles += [(i0, j0, near_start <= i0 < far_left) for i0 in range(start, n, block_m)]
        else:
            for i0 in range(0, n, block_m):
                end = min(n, q_offset + min(i0 + block_m, n)) if causal else n
                near_start = -(-max(q_offset + i0 + 2 - block_n - D, 0) // block_n) * block_n
                far_right = -(-(q_offset + i0 + block_m - 1 + D) // block_n) * block_n
                tiles += [(i0, j0, near_start <= j0 < far_right) for j0 in range(0, end, block_n)]
    elif family == "anchor":
        allowed = (lambda i, j: (j <= i) & (i < n) & (j < n)) if causal else (lambda i, j: (i < n) & (j < n))
        if kind == "bwd_kv":
            for j0 in range(0, n, block_n):
                start = j0 // block_m * block_m if causal else 0
                tiles += [(i0, j0, j0 + block_n > n or (causal and i0 < j0 + block_n - 1))
                          for i0 in range(start, n, block_m)]
        else:
            for i0 in range(0, n, block_m):
                end = min(i0 + block_m, n) if causal else n
                tiles += [(i0, j0, j0 + block_n > n or (causal and j0 + block_n - 1 > i0))
                          for j0 in range(0, end, block_n)]
    else:
        raise ValueError(f"no loop mirror for kernel {kernel!r}")
    return tiles, allowed


def _useful(tiles, allowed, block_m: int, block_n: int) -> int:
    import numpy as np
    i = np.arange(block_m)[:, None]
    j = np.arange(block_n)[None, :]
    return int(sum(int(np.count_nonzero(allowed(i0 + i, j0 + j))) for i0, j0, _ in tiles))


# --------------------------------------------------------------------------------------------------
# the passes: launches, compilation, measurement
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pass:
    """One row of the report: a kernel pass of a family at a head width and architecture, under a mask: ``head``
    picks the (batch, head) pair whose loop bounds are mirrored (MTSA's heads differ in their bands)."""

    family: str  # mtsa | dman | band | band-narrow | anchor | anchor-causal
    kernel: str
    mask: str
    head: int = 0


#: the rows of the report: (family, mask label, head of the recorded call); MTSA's recorded heads are the bands
#: forward (past keys only), backward, forward with the diagonal and window(3) (compile_check._call)
FAMILIES = (("anchor", "full", 0), ("anchor-causal", "causal", 0), ("mtsa", "forward head", 0),
            ("mtsa", "window(3) head", 3), ("dman", "full, D = 128", 0), ("band", "band 129", 0),
            ("band-narrow", "band 11 (CSAN window 11)", 0))


@dataclass
class Row:
    """What the report says of one pass at one (d, arch, n)."""

    family: str
    kernel: str
    mask: str
    head_dim: int
    arch: int
    n: int
    tiles: str = ""
    warps: int = 0
    stages: int = 0
    registers: int = 0
    spill_bytes: int = 0
    smem: int = 0
    blocks_per_sm: int = 0
    occupancy: float = 0.0
    wgmma: bool = False
    light: dict = field(default_factory=dict)  # per tile, light path (Counts as a dict)
    heavy: dict = field(default_factory=dict)
    computed: int = 0
    useful: int = 0
    heavy_tiles: int = 0
    tiles_visited: int = 0
    per_score: dict = field(default_factory=dict)  # dynamic estimate per computed score
    error: str = ""

    @property
    def useful_fraction(self) -> float:
        return self.useful / self.computed if self.computed else 0.0


def _recorded(family: str, head_dim: int, arch: int, n: int):
    """The launches of ``family``'s plain call (compile_check's shapes, length ``n``) on ``arch``."""
    from . import compile_check as cc
    from .. import runtime
    if family.startswith("anchor"):
        import torch
        anchor_module = anchor.load()
        with runtime.recording(runtime.TARGETS[arch]) as launches:
            q, k, v = (torch.randn(BATCH, HEADS, n, head_dim).to(torch.bfloat16) for _ in range(3))
            out, lse = anchor_module.forward(q, k, v, family == "anchor-causal")
            anchor_module.backward(torch.randn_like(out), q, k, v, out, lse, family == "anchor-causal")
        return [la for la in launches if la.kernel.fn.__name__ in anchor_module.KERNELS]
    base = family.split("-")[0]
    options = dict(cc.PLAIN[base])
    if family == "band-narrow":
        options["narrow"] = True
    case = cc.Case(base, head_dim, "bf16", tuple(sorted(options.items())))
    launches, reason = cc.record(case, arch, n)
    if reason:
        raise RuntimeError(reason)
    return launches


def _args(launch) -> dict[str, Any]:
    names = launch.kernel.arg_names
    return dict(zip(names, launch.args)) | dict(launch.kwargs)


def _blocks(named: dict) -> tuple[int, int]:
    if "BLOCK" in named:
        return named["BLOCK"], named["BLOCK"]
    return named["BLOCK_M"], named["BLOCK_N"]


def _geometry(family: str, kernel: str, args: dict, head: int, block_m: int, block_n: int):
    n = int(args["N"])
    if family == "mtsa":
        bands = [int(x) for x in args["BANDS"].tolist()]
        return visited_tiles(kernel, n, block_m, block_n, band=(bands[2 * head], bands[2 * head + 1]),
                             aligned=not args["BAND_START"])
    if family.startswith("band"):
        return visited_tiles(kernel, n, block_m, block_n, band=(-int(args["left"]), int(args["right"])))
    if family == "dman":
        return visited_tiles(kernel, n, block_m, block_n, causal=bool(args["CAUSAL"]),
                             distance=(int(args["D"]), int(args["q_offset"])))
    return visited_tiles(kernel, n, block_m, block_n, causal=bool(args["CAUSAL"]))


def _counts_dict(c: Counts) -> dict:
    out = asdict(c)
    out["mufu"] = dict(c.mufu)
    return out


def measure(p: Pass, head_dim: int, arch: int, lengths=SHAPES, _cache: dict | None = None) -> list[Row]:
    """The rows of pass ``p`` at ``head_dim`` on ``arch``, one per length in ``lengths``."""
    cache = {} if _cache is None else _cache
    rows = []
    for n in lengths:
        row = Row(p.family, p.kernel, p.mask, head_dim, arch, n)
        rows.append(row)
        try:
            launches = [la for la in _recorded(p.family, head_dim, arch, n) if la.kernel.fn.__name__ == p.kernel
                        and ("HEADS" not in _args(la) or p.head in _args(la)["HEADS"].tolist())]
            if not launches:
                raise RuntimeError(f"{p.kernel} was not launched")
            launch = launches[0]  # MTSA: the launch that runs the row's head (its heads share its tiles)
            key = (p.family, p.kernel, head_dim, arch, bool(_args(launch).get("BAND_START")))
            if key not in cache:
                cubin, smem, named, options = compile_launch(launch, arch)
                sass, registers = disassemble(cubin)
                cache[key] = (sass, registers, smem, named, options)
            sass, registers, smem, named, options = cache[key]
            instructions = parse_sass(sass)
            loops = hot_loops(instructions)
            if not loops:
                raise RuntimeError("no loop in the SASS")
            # light tiles take the lightest path through the hot loops, heavy tiles the heaviest (DMAN: the far loop
            # and the near loop); everything outside them runs once per program
            paths = [[classify(x) for x in path_counts(instructions[a:b + 1])] for a, b in loops]
            light = min((p[0] for p in paths), key=lambda c: c.instructions)
            heavy = max((p[1] for p in paths), key=lambda c: c.instructions)
            inside = {i for a, b in loops for i in range(a, b + 1)}
            outside = classify([ins for i, ins in enumerate(instructions) if i not in inside])
            every = classify(instructions)
            block_m, block_n = _blocks(named)
            row.tiles = f"{block_m}x{block_n}"
            row.warps, row.stages = options["num_warps"], options["num_stages"]
            row.registers, row.smem = registers, smem
            row.spill_bytes = spilled_bytes(sass)
            row.blocks_per_sm, row.occupancy = occupancy(arch, registers, row.warps, smem)
            row.wgmma = every.hgmma > 0
            row.light, row.heavy = _counts_dict(light), _counts_dict(heavy)
            tiles, allowed = _geometry(p.family, p.kernel, _args(launch), p.head, block_m, block_n)
            programs = -(-int(_args(launch)["N"]) // (block_n if _stage(p.kernel) == "bwd_kv" else block_m))
            row.tiles_visited = len(tiles)
            row.heavy_tiles = sum(h for _, _, h in tiles)
            row.computed = len(tiles) * block_m * block_n
            row.useful = _useful(tiles, allowed, block_m, block_n)
            total = Counts().add(outside, programs).add(light, row.tiles_visited - row.heavy_tiles).add(
                heavy, row.heavy_tiles)
            threads = 32 * row.warps
            scores = max(row.computed, 1)
            row.per_score = dict(
                tensor_flops=total.tensor_flops * row.warps / scores,
                wgmma_flops=total.wgmma_flops * row.warps / scores,
                mufu=total.mufu_total * threads / scores,
                mufu_kinds={k: v * threads / scores for k, v in total.mufu.items()},
                ldg=total.ldg * threads / scores, ldg_bytes=total.ldg_bytes * threads / scores,
                shared_bytes=total.shared_bytes * threads / scores,
                wgmma_shared_bytes=total.wgmma_shared_bytes * row.warps / scores,
                issue=total.instructions * row.warps / scores)
        except Exception as error:  # every failure is a row
            row.error = f"{type(error).__name__}: {error}"
    return rows


def passes() -> list[Pass]:
    from .. import band, dman, tensorized
    anchor_kernels = anchor.load().KERNELS
    kernels = {"anchor": anchor_kernels, "anchor-causal": anchor_kernels, "mtsa": tensorized.KERNELS[:3],
               "dman": dman.KERNELS, "band": band.KERNELS[:3], "band-narrow": band.KERNELS[:3]}
    return [Pass(family, kernel, mask, head) for family, mask, head in FAMILIES for kernel in kernels[family]]


def _measure_job(job) -> list[Row]:
    p, d, arch, lengths = job
    return measure(p, d, arch, lengths)


# --------------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------------

def _stage(kernel: str) -> str:
    for stage in ("fwd", "bwd_kv", "bwd_q"):
        if kernel.endswith(stage) or f"_{stage}_" in kernel + "_":
            return stage
    return kernel


def _anchor_for(row: Row, rows: list[Row], causal: bool) -> Row | None:
    family = "anchor-causal" if causal else "anchor"
    for r in rows:
        if (r.family == family and _stage(r.kernel) == _stage(row.kernel) and r.head_dim == row.head_dim
                and r.arch == row.arch and r.n == row.n and not r.error):
            return r
    return None


def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if abs(x) < 1000 else f"{x:.0f}"


def _per_useful(row: Row, key: str) -> float:
    return row.per_score[key] * row.computed / max(row.useful, 1)


def absolute_table(rows: list[Row], n: int) -> str:
    """Per pass at length ``n``: tiles, resources, wgmma, and per computed score the tensor FLOPs, MUFU, global
    loads, shared-memory bytes and warp instructions (per 1k scores)."""
    lines = ["| pass | mask | d | arch | tiles (w/s) | regs | spill B | smem KB | blocks/SM (occ.) | wgmma "
             "| in mask | TC FLOP/score | MUFU/score | LDG/score (B) | smem B/score (+wgmma) | warp instr/1k scores |",
             "|---|---|---:|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.n != n:
            continue
        if r.error:
            lines.append(f"| {r.kernel} | {r.mask} | {r.head_dim} | sm_{r.arch} | | | | | | | | | | | | {r.error[:80]} |")
            continue
        s = r.per_score
        kinds = "+".join(f"{k.lower()} {v:.2f}" for k, v in sorted(s["mufu_kinds"].items()) if v >= 0.005)
        lines.append(
            f"| {r.kernel} | {r.mask} | {r.head_dim} | sm_{r.arch} | {r.tiles} ({r.warps}/{r.stages}) | {r.registers} "
            f"| {r.spill_bytes} | {r.smem / 1024:.0f} | {r.blocks_per_sm} ({r.occupancy:.0%}) | "
            f"{'yes' if r.wgmma else 'no'} | {r.useful_fraction:.1%} | {_fmt(s['tensor_flops'], 0)} | "
            f"{s['mufu']:.2f} ({kinds}) | {s['ldg']:.3f} ({_fmt(s['ldg_bytes'])}) | "
            f"{_fmt(s['shared_bytes'])} (+{_fmt(s['wgmma_shared_bytes'])}) | {_fmt(1000 * s['issue'], 0)} |")
    return "\n".join(lines)


_RATIOS = (("tensor_flops", "TC FLOPs"), ("mufu", "MUFU"), ("ldg_bytes", "LDG bytes"),
           ("shared_bytes", "smem bytes"), ("issue", "warp instr"))


def ratio_table(rows: list[Row], n: int) -> str:
    """Per maskattn pass at length ``n``: each per-score figure over the anchor's same pass, per computed score
    (against the anchor without a mask) and per useful score (against the anchor with the closest mask: causal for
    directional, banded and DMAN-causal masks)."""
    head = " | ".join(f"{label} /computed | /useful" for _, label in _RATIOS)
    lines = [f"| pass | mask | d | arch | in mask | {head} |", "|---|---|---:|---|---:|" + "---:|" * (2 * len(_RATIOS))]
    for r in rows:
        if r.n != n or r.family.startswith("anchor") or r.error:
            continue
        full, closest = _anchor_for(r, rows, False), _anchor_for(r, rows, r.mask != "full" and "full" not in r.mask)
        if full is None or closest is None:
            continue
        cells = []
        for key, _ in _RATIOS:
            a = full.per_score[key]
            b = _per_useful(closest, key)
            cells.append(f"{r.per_score[key] / a:.2f}" if a else "–")
            cells.append(f"{_per_useful(r, key) / b:.2f}" if b else "–")
        lines.append(f"| {r.kernel} | {r.mask} | {r.head_dim} | sm_{r.arch} | {r.useful_fraction:.1%} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(rows: list[Row], n: int) -> str:
    return (f"#### Per pass (n = {n}, B·H = {BATCH * HEADS}, bfloat16)\n\n" + absolute_table(rows, n)
            + f"\n\n#### Ratios to the anchor (n = {n})\n\n" + ratio_table(rows, n) + "\n")


def narrow_band_bound(width: int) -> float:
    """The largest share of tensor-core tiles' scores a band of ``width`` positions can fill, ``w / roundup(15 + w,
    16)``: ``tl.dot`` takes at least 16 query rows, which reach ``15 + width`` keys, computed in key tiles of at least
    16 (docs/gpu/offline-perf.md, "Narrow bands")."""
    return width / (16 * -(-(15 + width) // 16))


def _band_width(mask: str) -> int:
    """The positions of a report row's narrow band: ``band 11 (…)`` → 11, ``window(3) head`` → 7."""
    found = re.match(r"band (\d+)|window\((\d+)\)", mask)
    if found is None:
        raise ValueError(f"no band width in the mask label {mask!r}")
    return int(found.group(1)) if found.group(1) else 2 * int(found.group(2)) + 1


def _target_rows(rows: list[Row], n: int) -> dict[tuple, tuple[str, float, bool]]:
    """``(target, pass, d, arch) → (measured text, value, met)`` for the issue's targets at length ``n``."""
    out: dict[tuple, tuple[str, float, bool]] = {}
    for r in rows:
        if r.n != n or r.error or r.family.startswith("anchor"):
            continue
        where = (r.kernel, r.head_dim, r.arch)
        if r.family == "mtsa" and r.mask == "forward head" and _stage(r.kernel) == "fwd":
            a = _anchor_for(r, rows, False)
            if a:
                ratio = r.per_score["mufu"] / a.per_score["mufu"]
                out[("MUFU per score ≤ 1.5× the anchor's",) + where] = (f"{ratio:.2f}×", ratio, ratio <= 1.5)
        if r.family in ("mtsa", "dman") and r.mask != "window(3) head" and r.arch == 90 and r.head_dim in (64, 128):
            closest = _anchor_for(r, rows, r.mask != "full" and "full" not in r.mask)
            if closest:
                ratio = _per_useful(r, "issue") / _per_useful(closest, "issue")
                out[("warp instructions per useful score ≤ 1.5× the anchor's (dense passes)",) + where] = (
                    f"{ratio:.2f}×", ratio, ratio <= 1.5)
        if r.family == "mtsa" and r.mask == "forward head" and r.arch == 90 and r.head_dim == 128:
            out[("wgmma on sm_90 at d = 128",) + where] = ("HGMMA" if r.wgmma else "HMMA", float(r.wgmma), r.wgmma)
        if r.family == "dman" and r.arch == 90 and _stage(r.kernel) != "fwd":
            out[("DMAN backward on sm_90: wgmma, no spill",) + where] = (
                f"{'HGMMA' if r.wgmma else 'HMMA'}, {r.spill_bytes} B", float(r.wgmma),
                r.wgmma and r.spill_bytes == 0)
        if r.mask.startswith(("window", "band 11")):
            bound = narrow_band_bound(_band_width(r.mask))
            out[(f"computed scores inside the band at the tile bound ({r.mask}; the issue asked ≥ 40 %)",) + where] = (
                f"{r.useful_fraction:.1%} (bound {bound:.1%})", r.useful_fraction,
                r.useful_fraction >= 0.99 * bound)
        out[("no spill",) + where + (r.mask,)] = (f"{r.spill_bytes} B", r.spill_bytes, r.spill_bytes == 0)
    return out


def targets(rows: list[Row], n: int, before: list[Row] | None = None) -> str:
    """The issue's targets measured at length ``n`` (and, with ``before``, beside an earlier run): MUFU per score
    of MTSA's forward over the anchor's, wgmma in MTSA's passes at d = 128 and in DMAN's backward without a spill on
    sm_90, the share of computed scores inside narrow bands; spills are summarised in one line. A pass that failed
    is named in a line of its own and meets no target, and "no spill" is met only when every pass was measured."""
    now = _target_rows(rows, n)
    then = _target_rows(before or [], n)
    lines = ["| target | pass | d | arch | " + ("before | " if before else "") + "now | met |",
             "|---|---|---:|---|" + ("---:|" if before else "") + "---:|---|"]
    for key, (text, _, met) in sorted(now.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], -kv[0][3])):
        if key[0] == "no spill":
            continue
        target, kernel, d, arch = key[:4]
        old = then.get(key, ("–", 0.0, False))[0]
        lines.append(f"| {target} | {kernel} | {d} | sm_{arch} | " + (f"{old} | " if before else "")
                     + f"{text} | {'yes' if met else 'no'} |")
    spilling = sorted({(k[1], k[2], k[3]) for k, v in now.items() if k[0] == "no spill" and not v[2]})
    # a pass that failed (or a report without a measured pass) meets no target: its figures are not there to read
    failed = sorted({(r.kernel, r.head_dim, r.arch) for r in rows if r.n == n and r.error})
    measured = any(r.n == n and not r.error and not r.family.startswith("anchor") for r in rows)
    if failed or not measured:
        lines.append("| every pass measured (a failed pass meets no target) | "
                     + (", ".join(f"{k} d{d} sm_{a}" for k, d, a in failed) or "no maskattn pass") + " | | | "
                     + ("– | " if before else "") + f"{len(failed)} failed | no |")
    lines.append("| no spill (every pass of the report) | " + (", ".join(f"{k} d{d} sm_{a}" for k, d, a in spilling)
                                                             or ("all" if measured and not failed else "–"))
                 + " | | | "
                 + (f"{sum(not v[2] for k, v in then.items() if k[0] == 'no spill')} spilling | " if before else "")
                 + f"{len(spilling)} spilling | {'yes' if measured and not failed and not spilling else 'no'} |")
    return "\n".join(lines)


def load_rows(path: str) -> list[Row]:
    """The rows a ``--json`` run wrote (read through the bounded reader; :class:`maskattn.errors.DataError` naming
    the file when it is missing, too large, or not such rows)."""
    from ....files import read_text
    from ....errors import DataError
    try:
        rows = [Row(**row) for row in json.loads(read_text(path, "rows file"))]
    except (json.JSONDecodeError, TypeError) as error:
        raise DataError(f"{path} is not the rows of a --json run ({error})") from None
    return rows


_INTRO = """# Offline performance report: maskattn's Triton kernels beside an FA2-class anchor

Generated by `{command}` (triton {triton}, its
bundled `nvdisasm` / `cuobjdump`; {seconds:.0f} s on 2 CPU cores shared with a training run and other work) — no GPU. The module is `maskattn.kernels.triton.offline.perf_report`; the anchor is `benchmarks/anchor_attention.py`
(FlashAttention-2's forward and two-pass backward, written here from the published algorithm; the tiles in its
`TILES`). docs/design.md §3 describes the kernels; [compile-ci.md](compile-ci.md) the compile check whose launches
this report reuses.

**What ran.** For every pass of MTSA (`tensorized_*`), DMAN (`dman_*`), the local band (`band_*`, and the narrow
tiles of CSAN window 11) and the anchor (`anchor_*`, without a mask and causal): the launches the real launchers
make on an sm_90 and an sm_80 device (bfloat16, head dims 64, 128 and 150, the plain options of the compile check:
MTSA log-sigmoid, DMAN non-causal with the distance table of D = 128, no padding, no dropout), bound and compiled as
Triton would, disassembled, and read:

* the **hot loop** (the innermost loop with the most tensor-core instructions; one iteration = one tile of
  `BLOCK_M × BLOCK_N` scores) along its light path (an interior tile: the mask branch not taken; DMAN: a far tile)
  and its heavy path (a tile that crosses the mask or the sequence end; DMAN: a near tile);
* **per score, dynamically** at a shape — every program's instructions outside the loop once, plus the loop body
  once per tile it visits (interior tiles on the light path, edge tiles on the heavy one; the tiles each program
  visits mirrored in Python from the kernel's loop bounds, `perf_report.visited_tiles`), divided by the **computed**
  scores (the visited tiles' areas) or by the **useful** ones (inside the mask and the sequence);
* tensor-core FLOPs (`HMMA` = `mma.sync` m16n8k16 per warp, `HGMMA` = wgmma, per warpgroup), `MUFU` (special
  functions: `ex2`, `rcp`, `lg2`), global loads (`LDG` and the async copies `LDGSTS`: bytes per thread), shared
  memory (`LDS`, `LDSM` = ldmatrix, `STS`, `STSM`, the `LDGSTS` landing; in brackets the operands wgmma reads from
  shared memory itself), all warp instructions (issue slots), registers, spilled bytes (`STL`), shared memory
  per block and the blocks per SM they allow (occupancy = resident warps / 64).

**Shapes.** One (batch, head) pair's loop bounds at n = 2,048 and 16,384 (the launches are recorded with B·H = 8;
per-score figures do not depend on B·H). MTSA's rows are two of its heads from the same launch: a *forward* head
(keys `j < i`) and a *window(3)* head (`|i − j| ≤ 3`), each read from the launch that runs it (the window head's
launch of its own, with the narrow tiles: `tensorized.head_groups`).
"""

_PREDICTS = """## What each ratio predicts for GPU time — and what it cannot

Each maskattn pass is divided by the anchor's pass of the same kind (forward, key pass, query pass) at the same d,
architecture and n: **per computed score** against the anchor without a mask (the cost of one tile of work), **per
useful score** against the anchor with the closest mask (causal for directional, banded and windowed masks; full for
DMAN's full mask) — the cost of the same useful result. Rough per-SM rates that turn them into time (dense
bfloat16; the NVIDIA A100 and H100 whitepapers): tensor cores 2048 FLOP/clk on sm_80 and 4096 on sm_90 (wgmma;
`mma.sync` on sm_90 reaches about two thirds of it), special functions 16 MUFU/clk, issue 4 warp instructions/clk,
shared memory 128 B/clk.

* **TC FLOPs**: the tensor-core time of a pass that is tensor-bound. The anchor forward at d = 128 spends 512 FLOPs
  per score: 0.125 clk per score per SM on sm_90. A ratio of 1.5 (MTSA's forward: its second product, `Σ w·E`)
  is 1.5× that time when the tensor cores are the bottleneck, and a pass that runs `HMMA` on sm_90 where the anchor
  runs `HGMMA` is predicted ~1.5× slower again.
* **MUFU**: the special-function pipe. At d = 64 on sm_90 the anchor's one `ex2` per score (1/16 clk) takes as long
  as its tensor work (256/4096 clk): a pass with 2 MUFU per score there is MUFU-bound (FlashAttention-3 overlaps
  the two for this reason); at d = 128 the MUFU share halves. A ratio above ~1.5 at d = 64 predicts a slowdown
  of about that ratio.
* **LDG bytes**: traffic from L2 into the SMs (K and V reloaded by every query tile), not DRAM traffic: with the
  working set in L2 the DRAM bytes are the unique inputs and outputs. A high ratio predicts L2-bandwidth and
  latency pressure that more resident warps or deeper pipelining must hide.
* **smem bytes**: shared-memory bandwidth; on sm_80 `mma.sync` operands come through `ldmatrix` (counted), on sm_90
  wgmma reads them from shared memory itself (the bracketed figure).
* **warp instr**: issue slots. At d = 64 the anchor needs ~0.35 warp instructions per score (0.09 clk per score per
  SM): issue is within a factor of 1.5 of the tensor time, so a pass with twice the anchor's instructions per score
  is likely issue-bound.
* **blocks/SM (occupancy)**: how much latency the SM can hide by switching warps; FlashAttention-class kernels run
  at 1–2 blocks of 4–8 warps.

What no static count can say: stalls (dependency chains, barriers, the wgmma pipeline's waits — two passes with the
same counts can differ 2× in time), shared-memory bank conflicts, L1/L2 hit rates and DRAM bandwidth (the narrow
bands below are DRAM-bound whatever their tile share), how well `num_stages` hides load latency, wave quantisation
and tail effects at a given B·H, the elementwise work around the kernels (MTSA's fused `E = exp(S − c)` and `dO / D`
kernels, DMAN's reductions of `dP`), and cold code counted once per program (a division's slow path). The light/heavy split
assumes the only branches inside the hot loop are the mask (DMAN: near/far) branch, which holds for these kernels.
"""


def _section(title: str, rows: list[Row], n: int) -> str:
    return (f"### {title}: per pass (n = {n})\n\n" + absolute_table(rows, n)
            + f"\n\n### {title}: ratios to the anchor (n = {n})\n\n" + ratio_table(rows, n) + "\n")


def document(rows: list[Row], before: list[Row], command: str, seconds: float, notes: str = "",
             predictions: list[dict] | None = None, tutorial_rows: list[dict] | None = None) -> str:
    """The whole report (docs/gpu/offline-perf.md): what ran, the predicted time per family (``predictions``:
    :func:`.time_model.family_rows`) and its targets, the pass targets before and after, the anchor beside the
    tutorial (``tutorial_rows``: :func:`.tutorial.compare`), what the ratios predict, the tables now at every
    length and the tables before at their longest."""
    import triton

    from . import time_model, tutorial
    lengths = sorted({r.n for r in rows})
    target_n = TARGET_LENGTH if TARGET_LENGTH in lengths else lengths[-1]
    parts = [_INTRO.format(command=command, triton=triton.__version__, seconds=seconds)]
    if predictions:
        checks = time_model.ratio_targets(predictions) + time_model.width_targets(rows, target_n)
        parts.append("## Predicted time: forward + backward, as a ratio to flash attention\n\n" + _TIME_MODEL
                     + "\n" + time_model.table(predictions) + "\n\n### Targets by the prediction (sm_90)\n\n"
                     + "| target | predicted | met |\n|---|---:|---|\n"
                     + "\n".join(f"| {name} | {value} | {'yes' if met else 'no'} |" for name, value, met in checks)
                     + "\n")
    parts.append(f"## Targets per pass (n = {target_n})\n\n" + targets(rows, target_n, before) + "\n")
    if tutorial_rows:
        verdict = "within" if tutorial.within(tutorial_rows) else "not everywhere within"
        parts.append("## The anchor beside Triton's tutorial\n\n" + _TUTORIAL.format(verdict=verdict) + "\n"
                     + tutorial.table(tutorial_rows) + "\n")
    parts += [NOTES if not notes else notes, _PREDICTS]
    for n in reversed(lengths):
        parts.append(_section("Now", rows, n))
    if before:
        parts.append("## Before (the kernels as they were before this report's changes)\n\n"
                     + _section("Before", before, max(r.n for r in before)))
    return "\n".join(parts)


#: the length at which the per-pass targets are read
TARGET_LENGTH = 2048

_TIME_MODEL = """`maskattn.kernels.triton.offline.time_model`: each pass takes, per computed score, the largest of four limits
of one SM per clock — tensor-core FLOPs (wgmma 4,096 on sm_90, `mma.sync` ~2,730 there and 2,048 on sm_80),
`MUFU` (16), issue (4 warp instructions; libdevice's calls are counted instruction by instruction) and bytes loaded
from L2 (47) — times the scores it computes; a family adds its passes and the elementwise work outside them
(MTSA's fused elementwise kernels, DMAN's PyTorch reductions) over DRAM (13–14 B/clk/SM), measured by counting the
bytes every operation outside the kernels reads and writes (MTSA, DMAN; the anchor's Δ pre-pass: 4 B per element). The ratio is the family's forward + backward over the
anchor's with the nearest mask (`mtsa_layer`, `dman`: non-causal multi-head flash on the same B, H, n, d; `mtsa_head`,
the window head and the bands: causal flash); `bound` is the limit behind the largest share of the family's time
(`memory`: the elementwise work). A ratio, not a time: no stalls, no overlap beyond the largest limit, no occupancy.
Machine-readable: docs/gpu/offline-perf.json.
"""

_TUTORIAL = """`python -m maskattn.kernels.triton.offline.perf_report --tutorial PATH` compiles Triton's fused-attention
tutorial (`python/tutorials/06-fused-attention.py`, from the user's copy: not part of maskattn) and the anchor at
the tutorial's own tiles — forward 128 × 64 on 4 warps, 3 stages; backward 32 queries × 128 keys and 128 × 32 on
4 warps, 5 stages — float16 (the tutorial casts `p` to float16), non-causal, and reads the steady state of each loop
(its unmasked loop, per score). The anchor is {verdict} 5 % of the tutorial on every figure; where the tutorial's
fixed tiles spill (its backward at d = 128: 2.5 KB on sm_90, 23.6 KB on sm_80; every pass at d = 64 on sm_80:
240 B), the anchor at the same tiles issues fewer instructions, and the report's own anchor tiles (`TILES` in
`benchmarks/anchor_attention.py`) are chosen not to spill. Per score, tutorial → anchor (anchor / tutorial):
"""


#: what changed and why, in the document (kept here so that the report regenerates the whole page)
NOTES = """## What changed this round (issue 52), and what the figures say

* **An anchor as lean as the tutorial.** The anchor issued 1.31× (d 64) to 1.56× (d 128) the warp instructions per
  score of Triton's tutorial in the forward on sm_90, which made every ratio below too kind. The score scale was a
  multiply and the maximum an add per score; now the maximum is taken of the unscaled scores and
  `exp2(s·scale₂ − m)` is one FMA per score (the key and query passes likewise, `exp2(s·scale₂ − lse)`); interior
  tiles neither mask nor select, and whole tiles (`EVEN`: the length a multiple of both tile sizes, the head width a
  power of two) load without masks. Compiled beside the tutorial at the tutorial's own tiles (the section above):
  within 2 % at d = 64 on sm_90 — without tensor descriptors (TMA), which the tutorial's forward uses — and leaner
  wherever the tutorial's fixed tiles spill. The anchor's own tiles (`TILES`) are now, per pass, class and width,
  the ones with the fewest warp instructions per score that compile without spilling (e.g. the forward at d = 64 on
  sm_90: 128 × 128 on 8 warps, 227 per 1k scores, where the old 128 × 64 anchor issued 332). Interpreter parity of
  the anchor with float64 attention, whole and ragged tiles, causal or not: `tests/test_anchor_attention.py`.
* **The special-function unit where the passes are issue-bound.** The time model (the section "Predicted time")
  says MTSA's and DMAN's passes are bound by instruction issue, not by `MUFU`. MTSA's sigmoid therefore takes its
  reciprocal on the special-function unit again (`jit_helpers.reciprocal_mufu`: `rcp.approx.ftz.f32`, relative
  error 2⁻²³ for `1 + t` in [1, 2]; the previous round's three Newton steps cost seven FMAs per score), and every
  `log σ` (DMAN's gate, the band's log-sigmoid scores) its logarithm (`jit_helpers.log2_mufu`: `lg2.approx.f32`,
  absolute error below 2⁻²² on (1, 2], so below 1.2·10⁻⁷ in `log σ`; `tl.log2` is libdevice's accurate `log2f`,
  ~20 FMA-pipe instructions). Float64 and Triton's interpreter keep the exact operations.
* **DMAN's far tiles in one FMA per score.** A far tile's gate is one value per row: the forward and the query pass
  fold the scale, the row's gate and its maximum (log-sum-exp) into the exponent's argument
  (`jit_helpers.online_softmax_scaled`), mask keys only on the tile that crosses the sequence end or with key
  padding, and the key pass — where a key's mask decides only its own `dK`, `dV` rows — zeroes a masked key's rows
  once after the loop instead of selecting per score.
* Per 1k scores at n = 16,384, d = 64, sm_90, before → after (the before tables below):
  MTSA's forward head 579 / 844 / 698 → 391 / 655 / 509 warp instructions (forward / key pass / query pass;
  `MUFU` 1 → 2 per score), DMAN 473 / 1064 / 611 → 340 / 602 / 467 (its near tiles 1503 → 732 per forward tile).

## The previous round's changes (issue 41)

* **MTSA's sigmoid with one special function per score** (`jit_helpers.sigmoid_log2_fma`, all three MTSA
  passes). `σ = 1 / (1 + 2^(−x))` was an `ex2` and a `rcp` per score (Triton's `/` is `div.full.f32`: one `MUFU.RCP`).
  Now `t = 2^(−|x|)` (`ex2`), `σ = r` or `t·r` with `r = 1 / (1 + t)` and `1 + t` in [1, 2]: a linear start and
  three Newton steps on the FMA units (seven FMAs, relative error below float32's rounding; float64 divides
  exactly), so the forward's `MUFU` per score is the anchor's plus the epilogue's per-feature `N / D`. The price is
  issue slots (15–20 % more warp instructions per score). Interpreter parity against the float64 oracle and
  bit-identical backward are unchanged (`tests/test_triton_tensorized.py`).
* **wgmma in MTSA's backward on sm_90** (`runtime.TILE_TABLE`, 227 KB class). Every product of the key pass has the
  held key tile as its M dimension and the query pass the query tile, and wgmma needs 64 rows per warpgroup: the
  key pass holds 128 keys on 8 warps (d = 64: 32 queries × 128 keys; d = 128: 16 × 128, two stages), the query
  pass at d = 128 holds 128 queries (128 × 32, 8 warps). Global loads per score fall to a half or a quarter (larger
  held tiles reload the streamed operands less often); no spill in the plain configuration, 128 B in the key pass at
  d = 128 on sm_90 with every option on (identity scale, padding, dropout: within the compile check's 256 B budget).
  The key pass at d = 128 held 64 keys (32 × 64, 8 warps) until this report showed it at 2.0× the anchor's tensor
  FLOPs per score: two warpgroups over 64 held rows make Triton run part of every product on both. 4 warps spilled
  224 B and 32 queries × 128 keys 56–404 B; streaming 16 queries instead keeps 128 keys spill-free (sm_90 plain:
  250 registers). Per score at n = 2048 (64 → 128 keys): tensor FLOPs 2048 → 1536 (the pass's own 1.5× of the
  anchor), bytes loaded from L2 12.8 → 6.8, shared-memory bytes 32 (+112 wgmma) → 8 (+72), warp instructions per
  1k scores 2122 → 1492; the in-mask share of a forward head drops from 96.9 % to 94.1 % (wider tiles cross the
  diagonal more often). The same 16 × 128 tile on 8 warps replaced 32 × 32 at d = 64 on the 163 KB class (sm_80:
  bytes loaded from L2 per score 12.8 → 3.4, shared-memory bytes 109 → 76, warp instructions 1371 → 1160 per 1k;
  no spill with any option); on the 99 KB class it spills 24 B on sm_120, so 64 × 32 stays there.
* **DMAN's backward on sm_90: 128 held rows, wgmma in every product, no spill** (`dman_jit`, `runtime.TILE_TABLE`,
  227 KB class). Tiles are `BLOCK_M` queries × `BLOCK_N` keys (they were square): the query pass holds 128 queries
  and streams 32 keys, the key pass holds 128 keys and streams 32 queries (8 warps = two warpgroups of 64 held rows,
  two stages: the anchor's shapes), and the key pass is computed transposed — keys along the rows (`k·qᵀ`, `v·dOᵀ`,
  `pᵀ·dO`, `dSᵀ·q`) — so every product has the held tile as wgmma's M dimension. Near tiles are decided from `D`
  and `q_offset` inside the kernel (`_near_keys`, `_near_queries`), and the query pass writes its diagonal sums of
  `dz` per square of 32 queries (`dman.square_offsets`: one slot per offset of a square). Square 64 × 64 tiles
  spilled in the plain configuration (compiled for sm_90, bfloat16: the query pass 72–92 B at d = 64 and 364–380 B at
  d = 128 with 8 warps, 276–624 B with 4; the key pass 80–96 B at d = 128 with 8 warps): the near tile's working
  set (the gate, its gradient, `dS`, `dz` and its gather) of 64 × 64 scores beside the accumulators. Now (sm_90,
  plain): the query pass 223 / 246 registers at d = 64 / 128, the key pass 220 / 254, no spill, `HGMMA` only; with
  every option on (causal, padding, floor, dropout) the query pass at d = 128 spills 24 B and the key pass 12 B,
  within the compile check's 256 B budget. Per score at n = 2048 on sm_90 (before → now): bytes loaded from L2
  10.9 → 2.8 (key pass, d = 64), 19.1 → 5.0 (d = 128), 9.0 → 2.3 and 17.2 → 4.5 (query pass); warp instructions
  per 1k scores 1685 → 1169, 2068 → 1321, 1346 → 875, 1690 → 1014; tensor FLOPs the anchor's (no product run
  twice); `MUFU` 1.57 → 1.59 and 1.29 → 1.37 (near tiles of 128 × 32 are a larger share of the tiles). The
  per-score figures below read both of DMAN's loops
  (`perf_report.hot_loops`: near tiles the near loop, far tiles the far loop; the report read only the near loop
  before, which overstated `MUFU` and warp instructions). Interpreter parity with the float64 oracle for the
  output and every gradient, and bit-identical backward runs, with sm_80's square and sm_90's rectangular tiles
  (`tests/test_triton_dman_tiles.py`).
* **16 query rows per warp in DMAN's forward** (`runtime.TILE_TABLE`). Triton places every warp of a chained dot
  (scores → softmax → `p·v`) along the rows, so the forward's 64 × 64 tiles on 8 warps (sm_80 at d = 64 and 128,
  sm_90 at d = 128) gave each warp 8 rows of a 16-row `mma`: tensor FLOPs per score 2.0× the anchor's on sm_80 at
  d = 64 and 1.5× on sm_90 at d = 128. Now 128 queries on 8 warps, FlashAttention-2's shape: 128 × 64 with two
  stages on sm_90, 128 × 64 (d = 64) and 128 × 32 (d = 128; 128 × 64 spilled 280–316 B) with one stage on the
  163 KB and 99 KB classes; no spill in the plain configuration, 8–96 B with every option on (sm_100 / 103 the
  most; the compile check's budget is 256 B). Per score at
  n = 2048 (before → now): tensor FLOPs 512 → 256 (sm_80, d = 64) and 768 → 512 (sm_90, d = 128), the anchor's
  everywhere; `MUFU` 2.44 → 1.25 and 2.45 → 1.25; bytes loaded from L2 halved on every row (128-row tiles load
  each key tile half as often: 4.1–8.7 → 2.1–4.4); warp instructions per 1k scores 1325 → 693, 1391 → 761,
  1458 → 1017 (sm_80, d = 128) and 665 → 663 (sm_90, d = 64). The same cause doubled the products of MTSA's
  query pass at d = 128 on the 163 KB and 99 KB classes (64 × 32 on 8 warps): now 4 warps, tensor FLOPs per score
  1536 → 1024 (the pass's own 1.33× of the anchor), shared-memory bytes 226 → 132, warp instructions 1871 → 1336
  per 1k scores, no spill. And DMAN's query pass below the 227 KB class: at d = 128 its 32 × 32 tiles ran on
  8 warps (tensor FLOPs per score 1280, 1.67× the anchor's; `MUFU` 2.33) — now 4 warps: 768, 1.30, warp
  instructions per 1k scores 2593 → 1562 (sm_80); at d = 64 it holds 128 queries (128 × 32 on 8 warps, one stage,
  as on sm_90; 32 × 32 before): bytes loaded from L2 per score 8.6 → 2.2 (the anchor's), warp instructions 1208 →
  881. No spill in the plain configuration on any architecture, at most 48 B with every option. Interpreter parity
  and bit-identical backward with the new tiles (sm_80's at d = 64 and 128, sm_90's):
  `tests/test_triton_dman_tiles.py`.
* **The wide band's query pass at d = 64 on the 227 KB class: one stage** (`runtime.TILE_TABLE`). The compile
  check now compiles every option on with each of the band's tile shapes (`compile_check.SHAPE_OPTIONS`: before,
  "every option on" meant the narrow tiles only), and the wide 64 × 64 query pass with dropout, padding,
  log-sigmoid scores and a head area spilled 480 B on sm_100 / sm_103 (over the 256 B budget). With one stage: at
  most 92 B with every option, none plain, and per score on sm_90 bytes loaded from L2 7.6 → 6.2 and warp
  instructions 773 → 727 per 1k (3 blocks per SM instead of 2). Larger held tiles (128 rows) load less per
  computed score but a band of 129 positions fills 51 % of them instead of 68 %, more work per useful score, so
  the other wide-band tiles stay.
* **Narrow bands: tiles sized to the band** (`band_*_narrow`: 16 queries × 32 keys forward and in the query pass,
  16 keys × 32 queries in the key pass; bands of at most 33 positions, `band.band_tiles`). A window-11 band fills
  34 % of the computed scores instead of 11 %: per useful score a third of the tensor work, half the `MUFU`,
  up to a third fewer warp instructions (the query pass at d = 64: about as many), as many bytes loaded from L2 in
  the forward and the key pass and up to 1.6× in the query pass (16-row tiles reload keys more often), and
  `mma.sync` instead of wgmma on sm_90 (M = 16). **40 % is out of reach of tensor-core tiles**: a tile
  of `BLOCK_M` queries needs `BLOCK_M + w − 1` keys of a band of `w` positions, computed in key tiles of a power of
  two of at least 16, and `BLOCK_M` is at least 16 (below 16, `mma` pads the rows: the tensor cores compute the
  same products, half empty) — at most `w / roundup(15 + w, 16)` = 11/32 = 34.4 % for CSAN's window 11 and 7/32 =
  21.9 % for a window(3) head (the targets table shows each pass against this bound). Beyond it the scores must
  leave the tensor cores, and measured, that does not pay: `benchmarks/diagonal_band.py` compiles two forward
  kernels that compute only the band's scores — one key offset per step, a gathered `BLOCK_M × d` block of keys,
  `q·k` and `p·v` on the FMA units, with an online softmax (`online`) or an exact one over the `BLOCK_M × W`
  scores (`exact`) — and counts them as this report counts the tiles (`python benchmarks/diagonal_band.py`, 31 s).
  Per useful score at n = 2048, bfloat16, sm_90 (sm_80 within 5 %), tiles → online / exact: CSAN window 11 at d = 64
  9.8 → 22.9 / 28.5 warp instructions, 5.1 → 16.8 / 6.7 `MUFU`, 61 → 268 / 268 bytes loaded; at d = 128 12.3 →
  48.8 / 62.9 warp instructions, and both FMA kernels spill (384–760 B). MTSA's window(3) forward (whose tiles also
  compute `Σ w·E`) 20.4 → 24.5 / 30.3 at d = 64, 38.3 → 52.2 / 64.7 at d = 128. At 100 % in band the FMA kernels
  issue 1.2–5.1× the tiles' instructions. Part of that is Triton's layout (each row spread over 8 threads, which
  repeats the row's softmax 8 times: the `MUFU` above); a kernel written with one row per thread still needs about
  four FMA-pipe operations per feature per score (`q·k`, `p·v`, two bfloat16 conversions), d / 8 warp instructions
  per useful score — 8 at d = 64, 16 at d = 128 (an estimate, not compiled): the tiles' figures at best. So the
  narrow-band target is the tile bound, which every pass meets.
  And the in-band share does not decide these passes' time: a window-11 pass reads q, k, v and writes o once per
  position (4·d·2 bytes) for 4·d·w useful FLOPs — 5.5 FLOPs per DRAM byte, 16–48 with the computed ones, below the
  ~300 FLOPs per byte at which an H100 (~150 on an A100) stops being bound by DRAM; the warp instructions per
  useful score (issue) and the L2 traffic are what the smaller tiles change.
* **MTSA's window(3) heads: a launch of their own at the 21.9 % bound** (`tensorized.head_groups`). MTSA ran every
  head of a layer in one launch, so a window head took the directional heads' 64–128-row tiles (3.7–7.4 % of the
  computed scores inside its band). Heads whose band spans at most 33 positions now run in a second launch of each
  pass (a `HEADS` table per launch; the heads are disjoint, so there are no atomics and the backward stays
  bit-identical) with the band kernel's narrow shapes — 16 queries × 32 keys in the forward and the query pass,
  16 keys × 32 queries in the key pass — and key (query) tiles started where the band starts: 21.9 % on every row
  below, the most a tensor-core tile holds. Per useful score, before → now at n = 2048: tensor work 3–6× less,
  `MUFU` 1.5–4.8× less (the epilogue's per-feature `N / D` is now spread over 32 keys per row, so per *computed*
  score it rises to 2.3–4.5 `rcp`), warp instructions 1.4–1.9× fewer (the forward at d = 128 on sm_90: the same),
  shared-memory traffic up to 3.4× less; bytes loaded from L2 1.1–1.8× fewer in the forward but up to 1.85× more
  in the backward on sm_90 (the old key pass held 128 keys and the query pass 64–128 queries, so the streamed side
  was reloaded less often) — and no wgmma (M = 16), as in the band kernel's narrow tiles. Parity with the float64
  oracle, with the GPU's tiles of both launches, and a bit-identical second backward:
  `tests/test_triton_tensorized.py::test_heads_in_two_launches_with_the_gpus_tiles_match_float64_reference`.
* **The anchor** compiles without spilling everywhere in this report (on sm_80 at d = 128 its backward takes 64 × 64
  and 128 × 32 one-stage tiles; the before tables were measured against 128-key tiles that spilled 392 B there).
"""


#: the longest length the report takes: its per-score figures mirror every tile a pass visits in Python (a few
#: seconds per pass at 16,384, sixteen times that at 65,536), and its launches are recorded on CPU tensors of n rows
MAX_LENGTH = 65536


def _checked(parser: argparse.ArgumentParser, args) -> tuple[list[Pass], list[Row] | None]:
    """The passes the arguments choose and the ``--before`` rows; every bad argument stops the report in one line
    (argparse's error: the option, the value, what it takes) before anything is recorded or compiled — a head
    width, length or ``--jobs`` below 1 (every row an error, or no pass at all, the targets read "yes"), a
    family or pass the report does not have, filters that leave no maskattn pass (the anchor alone checks
    nothing), ``--before`` / ``--tutorial`` files that cannot be read, an output that cannot be written
    (:func:`maskattn.files.check_outputs`; an existing one is replaced, missing folders are created)."""
    from ....errors import ArgumentError, DataError
    from ....files import check_outputs
    for flag, values in (("--dims", args.dims), ("--lengths", args.lengths)):
        if min(values) < 1:
            parser.error(f"{flag} takes sizes of at least 1, got {min(values)}")
    if max(args.lengths) > MAX_LENGTH:
        parser.error(f"--lengths takes 1 … {MAX_LENGTH:,} (every visited tile is mirrored in Python), got "
                     f"{max(args.lengths)}")
    if args.jobs < 1:
        parser.error(f"--jobs takes at least 1 process, got {args.jobs}")
    every = passes()
    families = list(dict.fromkeys(p.family for p in every))
    strangers = [f for f in args.families or () if f not in families]
    if strangers:
        parser.error(f"--families: {', '.join(strangers)} is not a family of the report (they are "
                     f"{', '.join(families)})")
    kernels = list(dict.fromkeys(p.kernel for p in every))
    strangers = [k for k in args.kernels or () if k not in kernels]
    if strangers:
        parser.error(f"--kernels: {', '.join(strangers)} is not a pass of the report (they are {', '.join(kernels)})")
    chosen = [p for p in every if (not args.kernels or p.kernel in args.kernels or p.family.startswith("anchor"))
              and (not args.families or p.family in args.families or p.family.startswith("anchor"))]
    if all(p.family.startswith("anchor") for p in chosen):
        given = " ".join(f"--{name} {' '.join(getattr(args, name))}" for name in ("families", "kernels")
                         if getattr(args, name))
        parser.error(f"{given} leaves no maskattn pass to report (the anchor is compiled beside them, not alone)")
    if args.tutorial is not None and not os.path.isfile(args.tutorial):
        parser.error(f"--tutorial {args.tutorial}: no such file (Triton's python/tutorials/06-fused-attention.py)")
    try:
        check_outputs({"--json": args.json, "--markdown": args.markdown, "--doc": args.doc,
                       "--predictions": args.predictions},
                      inputs=[("the --before file", args.before), ("the --tutorial file", args.tutorial)],
                      overwrite=True)
        before = load_rows(args.before) if args.before else None
    except (ArgumentError, DataError) as error:
        parser.error(f"--before: {error}" if isinstance(error, DataError) else str(error))
    return chosen, before


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m maskattn.kernels.triton.offline.perf_report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", type=int, default=list(ARCHS), choices=[80, 86, 90])
    parser.add_argument("--dims", nargs="+", type=int, default=list(DIMS))
    parser.add_argument("--lengths", nargs="+", type=int, default=list(SHAPES))
    parser.add_argument("--kernels", nargs="+", help="only these passes (the anchor's counterparts are kept)")
    parser.add_argument("--families", nargs="+", help="only these families (anchor, mtsa, dman, band, …)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--markdown", help="write the tables here")
    parser.add_argument("--doc", help="write the whole report here (docs/gpu/offline-perf.md)")
    parser.add_argument("--before", help="rows of an earlier run (--json) to show as the 'before' tables")
    parser.add_argument("--predictions", help="write the predicted ratio of every family here (offline-perf.json)")
    parser.add_argument("--tutorial", help="Triton's python/tutorials/06-fused-attention.py: compile it beside the "
                                           "anchor at its own tiles")
    args = parser.parse_args(argv)
    chosen, before_rows = _checked(parser, args)
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    from .. import runtime
    if runtime.interpreted():
        parser.error("Triton's interpreter is on in this process: run the report in a fresh process")
    jobs = [(p, d, arch, tuple(args.lengths)) for p in chosen for d in args.dims for arch in args.archs]
    started = time.perf_counter()
    rows: list[Row] = []
    if args.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            for i, result in enumerate(pool.map(_measure_job, jobs)):
                rows += result
                sys.stderr.write(f"\r[{i + 1}/{len(jobs)}] {time.perf_counter() - started:.0f} s   ")
    else:
        for i, job in enumerate(jobs):
            rows += _measure_job(job)
            sys.stderr.write(f"\r[{i + 1}/{len(jobs)}] {time.perf_counter() - started:.0f} s   ")
    sys.stderr.write("\n")
    from . import time_model, tutorial
    wrapper = {family: time_model.wrapper_bytes(family)["per_element"] for family in ("tensorized", "dman")}
    predictions = time_model.family_rows(rows, wrapper)
    tutorial_rows = tutorial.compare(args.tutorial, args.archs, [d for d in args.dims if d in (64, 128)]) \
        if args.tutorial else None
    target_n = TARGET_LENGTH if TARGET_LENGTH in args.lengths else args.lengths[-1]
    text = ("\n".join(report(rows, n) for n in args.lengths) + "\n#### Targets\n\n"
            + targets(rows, target_n, before_rows) + "\n\n#### Predicted ratios\n\n" + time_model.table(predictions)
            + ("\n\n#### The anchor beside the tutorial\n\n" + tutorial.table(tutorial_rows) if tutorial_rows else ""))
    print(text)
    from ....files import atomic_write
    if args.doc:
        before = before_rows or []
        given = list(argv if argv is not None else sys.argv[1:])
        hidden = ("--json", "--markdown", "--jobs", "--tutorial")
        shown = [x for i, x in enumerate(given) if x not in hidden and (i == 0 or given[i - 1] not in hidden)]
        command = " ".join(["python -m maskattn.kernels.triton.offline.perf_report", *shown])
        atomic_write(args.doc, [document(rows, before, command, time.perf_counter() - started, predictions=predictions,
                                         tutorial_rows=tutorial_rows).encode()])
    if args.predictions:
        atomic_write(args.predictions, [(json.dumps(predictions, indent=1) + "\n").encode()])
    if args.json:
        atomic_write(args.json, [json.dumps([asdict(r) for r in rows], indent=1).encode()])
    if args.markdown:
        atomic_write(args.markdown, [(text + "\n").encode()])
    print(f"{len(rows)} rows, {sum(bool(r.error) for r in rows)} errors, {time.perf_counter() - started:.0f} s",
          file=sys.stderr)
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
