"""Where the Triton kernels can run, the tiles they run with, and the one place they are launched — without
importing Triton.

Triton compiles the kernels for CUDA devices. Its interpreter (``TRITON_INTERPRET=1`` in the environment
before the kernels are first used) runs the same kernels on CPU tensors with NumPy; the test suite and CI
use it to check every kernel against the float64 references on machines without a GPU. The interpreter is
for tests: ``backend="auto"`` never chooses it (docs/design.md §2).

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so the choice is made once, when the first
kernel module is imported (:func:`load`), and :func:`interpreted` reports that choice afterwards.

**Targets and tiles** (docs/design.md §3, docs/gpu.md "Offline compile check"). A CUDA device is a
:class:`Target`: its compute capability and the shared memory one block may opt into. The tiles of every kernel
pass come from one table, :data:`TILE_TABLE`, per shared-memory class of device (99, 163 or 227 KB per block)
and head width; every entry is compiled ahead of time for sm_80, sm_86 and sm_90 by
:mod:`maskattn.kernels.triton.offline.compile_check` (in CI), which fails on a refused launch, a compile error, shared
memory over the class's limit or spilled registers. A device below the smallest class, or a head width without a
table entry, is declared unsupported (:func:`target_reason`), so ``auto`` never picks a launch that would fail.

**Launches** go through :func:`launch`: a grid within CUDA's limits, a note naming the switch that takes Triton out
of ``auto``'s choices (:data:`DISABLE_ENV`) on any failure, and — for the offline compile check — a recorder
that keeps ``(kernel, grid, arguments)`` instead of launching (:func:`recording`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import torch

from ..precision import tf32_matmul

__all__ = ["installed", "missing_reason", "interpreted", "not_interpreted", "load", "device_reason", "dtype_reason",
           "head_dim_reason", "call_reasons", "kernel_dtype", "Tiles", "Target", "TARGETS", "TILE_TABLE", "ARCH_TILES",
           "tile_class", "target_of", "target_reason", "declared_limits", "tiles", "MAX_HEAD_DIM", "next_power_of_2", "cdiv",
           "feature_split", "feature_width", "feature_constants", "splits_features",
           "stride_args", "accumulator", "value_dtype", "launch_constants", "FEATURE_MULTIPLE", "padded_head_dim",
           "pad_features", "unpad_features", "placeholder", "device_table", "launch",
           "Launch", "launch_device", "recording", "assume_target", "DISABLE_ENV", "disabled", "GRID_LIMIT"]

#: the widest head (query/key or value features) the kernels take: tiles keep a row of each in registers
MAX_HEAD_DIM = 256
#: set to 1 to take the Triton kernels out of ``backend="auto"``'s choices (an explicit ``backend="triton"`` still
#: runs them); README "Backends"
DISABLE_ENV = "MASKATTN_DISABLE_TRITON"
#: the largest grid the launches use: one axis, CUDA's limit for ``gridDim.x``
GRID_LIMIT = 2**31 - 1
_CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: under the interpreter float64 runs too, and bfloat16 is computed in float32 (:func:`kernel_dtype`)
_INTERPRETER_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_loaded_interpreted: bool | None = None
#: set by :func:`not_interpreted`: describe the kernels as they run on a machine without the interpreter (a plain
#: global, which compiled graphs read without a graph break)
_describing = False


#: looked up once, at import, without importing Triton (a plain constant: compiled graphs trace it without a cache)
_INSTALLED = importlib.util.find_spec("triton") is not None


def installed() -> bool:
    """Whether the ``triton`` package can be imported."""
    return _INSTALLED


def missing_reason() -> str | None:
    """Why the Triton backend is missing from this installation, or None."""
    return None if installed() else "needs the triton package (pip install triton; CUDA builds of PyTorch ship it)"


def disabled() -> bool:
    """Whether the user took the Triton kernels out of ``auto``'s choices (``MASKATTN_DISABLE_TRITON=1``)."""
    return os.environ.get(DISABLE_ENV, "0").strip().lower() not in ("", "0", "false", "no", "off")


def interpreted() -> bool:
    """Whether the kernels run (or, once loaded, will run) under Triton's CPU interpreter."""
    if _describing or _assumed is not None:
        return False
    if _loaded_interpreted is not None:
        return _loaded_interpreted
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@contextlib.contextmanager
def not_interpreted():
    """Inside: :func:`interpreted` is False — for tables that describe the backends as they are on a user's
    machine (the backend table, the list of limits), whatever the test suite's environment."""
    global _describing
    previous, _describing = _describing, True
    try:
        yield
    finally:
        _describing = previous


def load(module: str):
    """Import the Triton kernel module ``maskattn.kernels.triton.<module>`` (which imports Triton) on first use."""
    global _loaded_interpreted
    if _loaded_interpreted is None:
        _loaded_interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    return importlib.import_module(f"{__package__}.{module}")


# --------------------------------------------------------------------------------------------------
# targets: a CUDA device's compute capability and shared memory, and the tiles that fit it
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """A CUDA device as the kernels see it: ``arch`` = compute capability ``10·major + minor`` and ``smem`` = the
    shared memory (bytes) one block may opt into."""

    arch: int
    smem: int

    @property
    def name(self) -> str:
        return f"sm_{self.arch}"


KB = 1024
#: opt-in shared memory per block of the compute capabilities the kernels serve (CUDA programming guide, "Technical
#: Specifications per Compute Capability"), for devices whose properties do not report it
_SMEM_BY_ARCH = {80: 163 * KB, 86: 99 * KB, 87: 163 * KB, 89: 99 * KB, 90: 227 * KB, 100: 227 * KB, 103: 227 * KB,
                 120: 99 * KB, 121: 99 * KB}
#: the architectures the offline compile check compiles in CI (``--matrix ci``), with their opt-in shared memory per
#: block — exactly the ones ``auto`` (and ``backend="triton"``) accepts: a device of another compute capability is
#: declared unsupported (:func:`target_reason`), since no kernel was ever compiled for it (Triton 3.9's bundled
#: ptxas 12.9 / 13.4 compiles all of them: docs/gpu.md, "Offline compile check")
TARGETS = {arch: Target(arch, smem) for arch, smem in _SMEM_BY_ARCH.items()}
#: the shared-memory classes of :data:`TILE_TABLE`, largest first: a device takes the largest class it holds
_CLASSES = ((227 * KB, "227K"), (163 * KB, "163K"), (99 * KB, "99K"))
#: the oldest compute capability the kernels compile for (bfloat16 ``tl.dot`` needs Ampere)
MIN_ARCH = 80


@dataclass(frozen=True)
class Tiles:
    """One launch configuration: ``block_m`` query rows × ``block_n`` keys per tile, ``warps`` and ``stages``
    (software pipelining) of the compiled kernel."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    #: MTSA's key pass only: the scores and ``dW`` with the streamed queries along their rows and the key-side
    #: products taking them transposed (``tensorized_jit._bwd_kv_tile_query_rows``), so 8 warps split a 64-key
    #: tile's three accumulators by features — a 160-wide head (d 150) keeps them in 120 registers per thread
    query_rows: bool = False


#: (block_m, block_n, warps, stages) per kernel pass and head width, for the 99 KB (sm_86, sm_89), 163 KB (sm_80) and
#: 227 KB (sm_90) classes — chosen by compiling candidates for each architecture with the offline check and keeping the
#: first that meets its contract (half precision, every option set; docs/gpu.md "Offline compile check"). In the key
#: passes (``*_bwd_kv``) ``block_n`` keys are held and ``block_m`` queries stream.
_TABLE: dict[str, dict[int, tuple[tuple[Any, ...] | None, ...]]] = {
    # pass                    width: 99 KB            163 KB            227 KB
    # 160 is a split width (runtime.feature_split: d 150's 128 + 32 features; DMAN's and the band's entries say why
    # theirs below). MTSA's: 8 warps hold 64 queries on the mma.sync classes (tensorized_jit's tail products apart:
    # the value products' warps along the features, none run twice) and 128 — two warpgroups of 64 — on the 227 KB class (wgmma; one stage: two spill
    # 8–24 bytes). Where a class has no entry (None) the pass runs one power-of-two block of 256 features
    # (runtime.splits_features)
    "tensorized_fwd":        {64: ((64, 64, 4, 2), (64, 64, 4, 2), (64, 64, 4, 2)),
                              128: ((64, 64, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2)),
                              160: ((64, 64, 8, 1), (64, 64, 8, 1), (128, 32, 8, 1)),
                              256: ((32, 32, 8, 1), (32, 32, 8, 1), (64, 32, 8, 1))},
    # MTSA's backward on the 227 KB class (sm_90): wgmma needs 64 rows per warpgroup in the held tile (keys in
    # the key pass, queries in the query pass) — docs/gpu/offline-perf.md. The key pass at d 128 holds 128 keys on
    # 8 warps (64 keys on 8 warps ran part of every product twice; 16 streamed queries keep 128 keys spill-free),
    # as at d 64 on the 163 KB class (32 held keys reloaded the queries 4× as often; on the 99 KB class 128 keys
    # spill 24 bytes on sm_120).
    # Below it the query pass at d 128 holds 64 queries on 4 warps (8 warps ran every product twice: Triton puts a
    # chained dot's warps along the rows)
    # At the split width 160 the 227 KB class's query pass holds 128 queries as at d 128; its key pass streams 128
    # queries past 64 held keys with the queries along the rows of the scores (the fifth field: Tiles.query_rows —
    # 128 held keys, or 64 on one warpgroup, keep three 160-wide accumulators in 240 registers per thread and spill;
    # 64 on 8 warps along the keys ran the scores and dW twice). One stage: two need 256 KB. The mma.sync classes
    # keep one block of 256 (their split tiles spilled 300–450 bytes or ran products twice)
    "tensorized_bwd_q":      {64: ((64, 32, 4, 2), (64, 32, 4, 2), (64, 64, 4, 2)),
                              128: ((64, 32, 4, 2), (64, 32, 4, 2), (128, 32, 8, 2)),
                              160: (None, None, (128, 32, 8, 2)),
                              256: ((32, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
    "tensorized_bwd_kv":     {64: ((64, 32, 4, 2), (16, 128, 8, 2), (32, 128, 8, 2)),
                              128: ((64, 32, 8, 2), (64, 32, 8, 2), (16, 128, 8, 2)),
                              160: (None, None, (128, 64, 8, 1, True)),
                              256: ((16, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
    # MTSA's window heads (bands of at most 33 positions; tensorized.head_groups) in a launch of their own, key
    # (query) tiles started at the band start: 16 queries × 32 keys (key pass: 16 keys × 32 queries), as the band's
    # narrow tiles (width 128: 4 warps; 2 spilled 8–52 bytes); width 256 keeps the wide entries
    "tensorized_fwd_narrow": {64: ((16, 32, 2, 1), (16, 32, 2, 1), (16, 32, 2, 1)),
                              128: ((16, 32, 4, 1), (16, 32, 4, 1), (16, 32, 4, 1)),
                              160: ((16, 32, 4, 1), (16, 32, 4, 1), (16, 32, 4, 1)),
                              256: ((32, 32, 8, 1), (32, 32, 8, 1), (64, 32, 8, 1))},
    "tensorized_bwd_q_narrow": {64: ((16, 32, 2, 2), (16, 32, 2, 2), (16, 32, 2, 2)),
                                128: ((16, 32, 4, 1), (16, 32, 4, 1), (16, 32, 4, 1)),
                                160: ((16, 32, 2, 1), (16, 32, 2, 1), (16, 32, 4, 1)),
                                256: ((32, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
    "tensorized_bwd_kv_narrow": {64: ((32, 16, 2, 2), (32, 16, 2, 2), (32, 16, 2, 2)),
                                 128: ((32, 16, 4, 2), (32, 16, 4, 2), (32, 16, 4, 2)),
                                 160: ((32, 16, 4, 2), (32, 16, 4, 2), (32, 16, 4, 2)),
                                 256: ((16, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
    # DMAN (issue 41; dman_jit: strip of P, near / far loops): the forward holds 128 queries on 8 warps, 16 rows
    # per warp as FlashAttention-2 (Triton puts every warp of a chained dot along the rows: 64 rows on 8 warps ran
    # each product twice, 1.5–2× the tensor work of the anchor), 64 keys (32 at d 128 below the 227 KB class,
    # where 64 spilled 280–316 bytes); no spill in the plain configuration, within 256 bytes with every option on
    # every architecture of the class (docs/gpu/offline-perf.md). The backward on the 227 KB class holds 128 rows and
    # streams 32 (FlashAttention-2's shapes: the query pass 128 queries × 32 keys, the key pass 32 queries × 128
    # keys, 8 warps = two warpgroups of 64 held rows each): wgmma in every product, no spill in the plain
    # configuration at d 64 and 128, where square 64 × 64 tiles spilled 72–380 bytes (docs/gpu/offline-perf.md);
    # the key pass at d 64 streams 64 queries since its far tiles read each query's gate (535 → 439 warp
    # instructions per 1k scores at n = 2,048; 32 queries: 535); on the 163 KB class it runs one stage there (two
    # spilled 12 bytes on sm_80 without options once it read the gates: 128 registers; one stage: none, at most 16
    # bytes with every option on sm_87).
    # The query pass's BLOCK_M is a multiple of its BLOCK_N (its diagonal sums of dz are per square of BLOCK_N
    # queries); at d 256 bwd_q takes 16 × 16 tiles (32 × 32 spill 4–8 bytes on sm_87 / sm_100 / sm_120). Below the
    # 227 KB class the query pass holds 128 queries at d 64 (one stage: two spill 12 bytes on sm_80) and 32 on 4
    # warps at d 128 (8 warps ran every product of 32 rows twice; 64 or 128 rows spill 104–192 bytes).
    # At the split width 160 (d 150's 128 + 32 features; dman_jit's feature blocks) each class keeps its d-128 tiles
    # where they fit, candidates from there to fewer stages and then other shapes, the first with no spill in either
    # plain form, wgmma on sm_90 and no product run twice (tensor FLOPs per score 4 / 8 / 6 × 160): the forward on
    # every class and sm_90's query pass as at d 128 (sm_90's 2 stages: the loops' invariants kept in the loop —
    # hoisted, they spilled 76 and 12 bytes); sm_90's key pass with one stage (two spill 72–128 bytes: two 160-wide
    # accumulators on 128 held keys; 64 streamed queries 436 B); the mma.sync classes' key pass as at d 128; their
    # query pass 64 queries on 8 warps (the d-128 32 × 32 spills: 44 bytes with two stages on sm_80, 16 causal with
    # one; 4 bytes on sm_120 / 121)
    "dman_fwd":              {64: ((128, 64, 8, 1), (128, 64, 8, 1), (128, 64, 8, 2)),
                              128: ((128, 32, 8, 1), (128, 32, 8, 1), (128, 64, 8, 2)),
                              160: ((128, 32, 8, 1), (128, 32, 8, 1), (128, 64, 8, 2)),
                              256: ((32, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
    "dman_bwd_q":            {64: ((128, 32, 8, 1), (128, 32, 8, 1), (128, 32, 8, 2)),
                              128: ((32, 32, 4, 1), (32, 32, 4, 2), (128, 32, 8, 2)),
                              160: ((64, 32, 8, 1), (64, 32, 8, 1), (128, 32, 8, 2)),
                              256: ((16, 16, 4, 1), (16, 16, 4, 1), (16, 16, 2, 1))},
    "dman_bwd_kv":           {64: ((32, 32, 4, 2), (32, 32, 4, 1), (64, 128, 8, 2)),
                              128: ((64, 64, 8, 1), (64, 64, 8, 1), (32, 128, 8, 2)),
                              160: ((64, 64, 8, 1), (64, 64, 8, 1), (32, 128, 8, 1)),
                              256: ((32, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
    # the band's query pass at d 64 on the 227 KB class runs one stage: two spilled 480 bytes on sm_100 / sm_103 with
    # every option on (a wide band's tiles with dropout and padding; docs/gpu/compile-ci.md).
    # At the split width 160 (d 150 as 128 + 32 features; band_jit) the 227 KB class holds 64 queries on one
    # warpgroup in the forward and the query pass (wgmma; 8 warps ran part of the forward's products twice, 2 stages
    # spilled 24 B) and streams 128 queries past 64 held keys on two warpgroups in the key pass (64 queries on 4
    # warps spilled 72–516 B: two 160-wide accumulators per held key; on 8 warps part of every product ran twice).
    # The mma.sync classes hold 64 × 64 on 8 warps in the forward and the query pass (the tail's products in regions
    # of their own: band_jit, jit_helpers.tail_region); their key pass takes 16 × 16 on 2 warps (1.33× of d 128 per
    # useful score and feature on sm_80; 32 × 16 compiled clean but predicts 1.46×, larger tiles spilled
    # 700–11,600 B or ran products twice)
    "band_fwd":              {64: ((64, 64, 4, 2), (64, 64, 4, 2), (64, 64, 4, 2)),
                              128: ((64, 64, 8, 2), (64, 64, 8, 2), (64, 64, 8, 2)),
                              160: ((64, 64, 8, 1), (64, 64, 8, 1), (64, 64, 4, 1)),
                              256: ((32, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
    "band_bwd_q":            {64: ((64, 32, 4, 2), (64, 32, 4, 2), (64, 64, 4, 1)),
                              128: ((64, 64, 8, 2), (64, 64, 8, 2), (64, 64, 8, 2)),
                              160: ((64, 64, 8, 1), (64, 64, 8, 1), (64, 64, 4, 1)),
                              256: ((32, 32, 4, 1), (32, 32, 4, 1), (32, 32, 8, 1))},
    "band_bwd_kv":           {64: ((32, 64, 4, 2), (32, 32, 4, 2), (64, 64, 8, 2)),
                              128: ((32, 64, 8, 2), (32, 64, 8, 2), (32, 64, 8, 2)),
                              160: ((16, 16, 2, 1), (16, 16, 2, 1), (128, 64, 8, 1)),
                              256: ((32, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
    # narrow bands (<= 33 positions): 16 queries per tile (32 keys per query tile, 16 keys per key tile), so a
    # window-11 band fills 34 % of the computed scores (64-query tiles: 11 %); mma.sync, not wgmma (M < 64). Width
    # 256 takes the wide entries (the query pass's 8 warps below the 227 KB class spilled 4–8 bytes without options
    # on sm_86 / 87 / 89 / 120 / 121, as the wide pass's had). The split width 160 keeps 16-row tiles on 2 warps
    # (34 % of the computed scores in a window-11 band, the tile bound; 4 warps ran products twice), the key pass
    # 16 keys × 16 queries (32 queries spilled 12–320 B)
    "band_fwd_narrow":       {64: ((16, 32, 2, 1), (16, 32, 2, 1), (16, 32, 2, 1)),
                              128: ((16, 32, 2, 1), (16, 32, 2, 1), (16, 32, 2, 1)),
                              160: ((16, 32, 2, 1), (16, 32, 2, 1), (16, 32, 2, 1)),
                              256: ((32, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
    "band_bwd_q_narrow":     {64: ((16, 32, 2, 2), (16, 32, 2, 2), (16, 32, 2, 2)),
                              128: ((16, 32, 4, 1), (16, 32, 4, 1), (16, 32, 4, 1)),
                              160: ((16, 32, 2, 1), (16, 32, 2, 1), (16, 32, 2, 1)),
                              256: ((32, 32, 4, 1), (32, 32, 4, 1), (32, 32, 8, 1))},
    "band_bwd_kv_narrow":    {64: ((32, 16, 4, 2), (32, 16, 4, 2), (32, 16, 2, 2)),
                              128: ((32, 16, 2, 1), (32, 16, 2, 1), (32, 16, 2, 1)),
                              160: ((16, 16, 2, 1), (16, 16, 2, 1), (16, 16, 2, 1)),
                              256: ((32, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1))},
}

#: The tiles per kernel pass × shared-memory class × head width (the wider of the key and value heads in 16-bit units,
#: rounded up to a power of two: 16 … 64 take the 64 entry; a float32 head of d features the 2d entry — or, for a
#: pass with an entry at a split width, that width: 160 for d 145–160 in every family, :func:`_table_width`), from
#: :data:`_TABLE`: every entry is compiled by the offline check for each architecture of its class (CI). Passes: MTSA
#: (``tensorized_*``), DMAN (``dman_*``) and the band (``band_*``; ``band_*_narrow`` for bands of at most 33
#: positions, whose inner tiles are 32 wide).
TILE_TABLE: dict[tuple[str, str, int], Tiles] = {
    (kernel, cls, width): Tiles(*tiles) for kernel, widths in _TABLE.items() for width, per_class in widths.items()
    for cls, tiles in zip(("99K", "163K", "227K"), per_class) if tiles is not None}

#: Entries for one architecture whose class's tiles spill there: Blackwell (sm_100 / sm_103) shares the 227 KB class
#: with sm_90 but allocates registers otherwise — sm_90's MTSA forward (64 × 32, 4 warps; wgmma) spills 16 bytes there
#: at width 128 and the band's dQ pass 124 bytes; with the log-sigmoid source MTSA's key pass (16 × 128, 8 warps)
#: spills 16 bytes there at width 128 (32 streamed queries: none, 188 registers), and DMAN's key pass at width 64
#: (64 × 128, 8 warps, 2 stages: 64 streamed queries on sm_90) 32 bytes causal (32 × 128: none, 206 registers).
#: At the split width 160 sm_90's 128-query forward spills 12 bytes there (tcgen05 keeps the accumulators in tensor
#: memory: 64 queries on 8 warps, 142 registers), and the 99 KB class's DMAN key pass (64 × 64, 8 warps) 24 bytes
#: causal on sm_120 / 121 (32 × 64 and 32 × 32 on 4 warps: 16 and 4 bytes; 32 × 32 on 8 warps: none, 209 registers,
#: no product run twice — its sm_86 SASS has 8 × 160 tensor FLOPs per score).
#: ``(kernel, arch, width)`` → tiles, compiled by the offline check like every entry (the launchers record them
#: under :func:`assume_target`).
_ARCH_TABLE: dict[tuple[str, int, int], tuple[int, int, int, int]] = {
    ("tensorized_fwd", 100, 128): (64, 32, 8, 2), ("tensorized_fwd", 103, 128): (64, 32, 8, 2),
    ("tensorized_bwd_kv", 100, 128): (32, 128, 8, 2), ("tensorized_bwd_kv", 103, 128): (32, 128, 8, 2),
    ("band_bwd_q", 100, 128): (64, 64, 8, 1), ("band_bwd_q", 103, 128): (64, 64, 8, 1),
    ("dman_bwd_kv", 100, 64): (32, 128, 8, 2), ("dman_bwd_kv", 103, 64): (32, 128, 8, 2),
    ("tensorized_fwd", 100, 160): (64, 32, 8, 2), ("tensorized_fwd", 103, 160): (64, 32, 8, 2),
    ("dman_bwd_kv", 120, 160): (32, 32, 8, 1), ("dman_bwd_kv", 121, 160): (32, 32, 8, 1),
}
ARCH_TILES: dict[tuple[str, int, int], Tiles] = {key: Tiles(*tiles) for key, tiles in _ARCH_TABLE.items()}

#: the target the launchers assume instead of the device's (:func:`assume_target`; the offline compile check)
_assumed: Target | None = None


@contextlib.contextmanager
def assume_target(target: Target):
    """Inside: the launchers choose tiles and constants as they would on a CUDA device ``target``, whatever the
    tensors' device (the offline compile check records those launches; :func:`recording`)."""
    global _assumed
    previous, _assumed = _assumed, target
    try:
        yield target
    finally:
        _assumed = previous


def tile_class(target: Target) -> str | None:
    """The :data:`TILE_TABLE` class of ``target`` (the largest whose shared memory it has), or None."""
    for size, name in _CLASSES:
        if target.smem >= size:
            return name
    return None


_device_targets: dict[int, Target] = {}


def target_of(device: torch.device | str) -> Target | None:
    """The :class:`Target` of a CUDA ``device`` (read once per device index), the assumed one inside
    :func:`assume_target`, or None (a CPU tensor outside it: the interpreter)."""
    if _assumed is not None:
        return _assumed
    device = torch.device(device)
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _device_targets:
        major, minor = torch.cuda.get_device_capability(index)
        arch = 10 * major + minor
        smem = getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 0) or \
            _SMEM_BY_ARCH.get(arch, 48 * KB)
        _device_targets[index] = Target(arch, int(smem))
    return _device_targets[index]


def _units(dtype: torch.dtype) -> int:
    """16-bit units per element of ``dtype`` (at least 1)."""
    return max(2, torch.empty((), dtype=dtype).element_size()) // 2


def _width(head_dim: int, dtype: torch.dtype = torch.float16) -> int:
    """The :data:`TILE_TABLE` head width of ``head_dim`` features in ``dtype``: the next power of two, at least 64, in
    16-bit units — a float32 head of d features takes the tiles of a 16-bit head of 2d (the same bytes per row)."""
    return max(64, next_power_of_2(head_dim * _units(dtype)))


def _split_width(head_dim: int, dtype: torch.dtype = torch.float16) -> int | None:
    """The :data:`TILE_TABLE` key of a head of ``head_dim`` features tiled as a main and a tail block
    (:func:`feature_split` of its padded width): the width they cover in 16-bit units (d 150 → 128 + 32 → 160), or
    None where the padded width is a power of two (one block: :func:`_width`'s entry)."""
    main, tail = feature_split(padded_head_dim(head_dim))
    return (main + tail) * _units(dtype) if tail else None


def _table_width(kernel: str, cls: str, head_dim: int, dtype: torch.dtype) -> int:
    """The head width of ``kernel``'s :data:`TILE_TABLE` entry for ``head_dim`` features in ``dtype`` on class
    ``cls``: the split shape's own (:func:`_split_width`) where the pass has one — every family's passes tile the
    feature axis — else the power of two above (:func:`_width`)."""
    split = _split_width(head_dim, dtype)
    if split is not None and (kernel, cls, split) in TILE_TABLE:
        return split
    return _width(head_dim, dtype)


def target_reason(device: str, head_dim: int, kernels: tuple[str, ...], dtype: torch.dtype = torch.float16
                  ) -> str | None:
    """Why the kernels ``kernels`` cannot launch on the current CUDA device (``device`` a device type) for heads of
    ``head_dim`` features in ``dtype`` — too old a GPU, too little shared memory for any tile class, or no tile entry
    for the head width — or None. Off CUDA (the interpreter) there is nothing to check."""
    if device != "cuda" or _describing:
        return None
    if _assumed is None and not torch.cuda.is_available():
        return None
    target = target_of("cuda")
    assert target is not None
    if target.arch < MIN_ARCH:
        return (f"needs compute capability {MIN_ARCH // 10}.{MIN_ARCH % 10} or newer (bfloat16 tensor cores), got "
                f"{target.arch // 10}.{target.arch % 10}")
    cls = tile_class(target)
    if cls is None:
        return (f"needs at least {_CLASSES[-1][0] // KB} KB of shared memory per block, the device offers "
                f"{target.smem // KB} KB")
    if target.arch not in TARGETS:
        return (f"was never compiled for compute capability {target.arch // 10}.{target.arch % 10} ({target.name}): "
                f"the offline compile check in CI covers {', '.join(t.name for t in TARGETS.values())} only")
    missing = [k for k in kernels if (k, cls, _table_width(k, cls, head_dim, dtype)) not in TILE_TABLE]
    if missing:
        what = str(dtype).removeprefix("torch.")
        return (f"has no tile configuration for {what} heads of {head_dim} features within {target.smem // KB} KB of "
                f"shared memory per block ({target.name}: {', '.join(missing)})")
    return None


def declared_limits(kernels: tuple[str, ...]) -> list[str]:
    """The device limits of the passes ``kernels`` as :func:`target_reason` applies them, in words (for
    ``maskattn list --backends`` and the docs)."""
    limits = [f"needs compute capability {MIN_ARCH // 10}.{MIN_ARCH % 10} or newer (bfloat16 tensor cores)",
              f"needs at least {_CLASSES[-1][0] // KB} KB of shared memory per block",
              f"runs on the architectures the offline compile check compiles in CI: "
              f"{', '.join(t.name for t in TARGETS.values())} (another compute capability is refused)"]
    for size, cls in _CLASSES:
        widths = [w for w in (64, 128, 256) if all((k, cls, w) in TILE_TABLE for k in kernels)]
        if widths and widths[-1] < MAX_HEAD_DIM:
            limits.append(f"takes 16-bit head dims up to {widths[-1]} on devices with {size // KB} KB of shared memory "
                          "per block (no tiles of wider heads fit)")
    widest = max((w for (k, _, w) in TILE_TABLE if k in kernels), default=0)
    if widest < 2 * MAX_HEAD_DIM:
        limits.append(f"takes float32 head dims up to {widest // 2} (a float32 row takes the tiles of a 16-bit row "
                      "twice as wide)")
    return limits


def splits_features(kernel: str, head_dim: int, device: torch.device | str, dtype: torch.dtype = torch.float16
                    ) -> bool:
    """Whether pass ``kernel`` runs heads of ``head_dim`` features (the wider of the key and value heads) as a main and
    a tail feature block (:func:`feature_split`, :func:`feature_constants`) on ``device``: the padded width is not a
    power of two and — on a CUDA device — :data:`TILE_TABLE` has the split shape's own entry for the device's class
    (:func:`_split_width`: MTSA's and DMAN's 160 = 128 + 32). Elsewhere the pass takes one power-of-two block (256
    for 160) with its features masked at the width, as :func:`launch_constants` says. Under the interpreter every
    such width splits."""
    split = _split_width(head_dim, dtype)
    if split is None:
        return False
    target = target_of(device)
    if target is None or interpreted():
        return True
    return (kernel, tile_class(target) or "99K", split) in TILE_TABLE


def tiles(kernel: str, head_dim: int, device: torch.device | str, dtype: torch.dtype = torch.float16) -> Tiles:
    """The tiles of kernel pass ``kernel`` for heads of ``head_dim`` features (the wider of the key and value heads)
    in ``dtype`` on ``device``: :data:`TILE_TABLE`'s entry for the device's class. Under the interpreter the tiles
    are 16 × 16, so that test lengths such as 37 or 70 cross several tiles and the masking at tile edges is
    exercised."""
    target = target_of(device)
    if target is None or interpreted():
        return Tiles(16, 16, 1, 1)
    cls = tile_class(target) or "99K"
    width = _table_width(kernel, cls, head_dim, dtype)
    return ARCH_TILES.get((kernel, target.arch, width)) or TILE_TABLE[(kernel, cls, width)]


# --------------------------------------------------------------------------------------------------
# what a call may run: devices, dtypes, head widths
# --------------------------------------------------------------------------------------------------

def device_reason(device: str) -> str | None:
    """Why the kernels cannot run on ``device`` (a device type), or None (whether Triton is installed is
    :func:`missing_reason`'s question)."""
    if device == "cuda":
        return None
    if device == "cpu" and interpreted():
        return None
    return (f"runs on CUDA devices (on {device} tensors only under Triton's interpreter, TRITON_INTERPRET=1, "
            f"which is for tests), got a {device} tensor")


def dtype_reason(dtype: torch.dtype, device: str) -> str | None:
    """Why the kernels cannot compute in ``dtype`` on ``device``, or None (also where they cannot run on
    ``device`` at all: :func:`device_reason` says so)."""
    if device != "cuda" and not interpreted():
        return None
    allowed = _INTERPRETER_DTYPES if interpreted() else _CUDA_DTYPES
    if dtype in allowed:
        return None
    where = "under Triton's interpreter" if interpreted() else "on CUDA"
    return f"takes {', '.join(str(d).removeprefix('torch.') for d in allowed)} {where}, got {str(dtype).removeprefix('torch.')}"


def head_dim_reason(**dims: int) -> str | None:
    """Why head dimensions ``dims`` (name → size) are too wide for the kernels, or None."""
    wide = {name: size for name, size in dims.items() if size > MAX_HEAD_DIM}
    if not wide:
        return None
    listed = ", ".join(f"{name} = {size}" for name, size in wide.items())
    return f"takes head dims up to {MAX_HEAD_DIM}, got {listed}"


def call_reasons(device: str, dtype: torch.dtype, head_dims: dict[str, int], kernels: tuple[str, ...] = ()
                 ) -> list[str]:
    """The reasons every kernel shares: :func:`device_reason`, :func:`dtype_reason`, :func:`head_dim_reason` and,
    on CUDA, :func:`target_reason` for the passes ``kernels``."""
    reasons = [r for r in (device_reason(device), dtype_reason(dtype, device), head_dim_reason(**head_dims)) if r]
    if not reasons and kernels:
        reason = target_reason(device, max(head_dims.values()), kernels, dtype)
        if reason:
            reasons.append(reason)
    return reasons


# --------------------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------------------

def next_power_of_2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def stride_args(*tensors: torch.Tensor) -> list[int]:
    """The strides of 4-D tensors, flattened in order (the kernels index (b, h, position, feature))."""
    return [s for t in tensors for s in t.stride()]


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels take their inputs in: the inputs' own, except bfloat16 under the interpreter, whose
    ``tl.dot`` on bfloat16 is wrong (NumPy has no bfloat16): there the wrappers cast to float32 and cast the
    result back, so the CPU tests still run the bfloat16 plumbing (autocast, dtypes of outputs and gradients)."""
    return torch.float32 if dtype == torch.bfloat16 and interpreted() else dtype


def value_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the operands that carry exponentials of unbounded range (MTSA's ``E`` and ``v ⊙ E``; the
    gradients ``dO / D``) for inputs of ``dtype``: bfloat16 for half-precision inputs — float32's exponent range
    at half precision's cost (float16's range ends ~10 below the largest score: docs/design.md §3) — else the
    inputs' own. Under the interpreter bfloat16 is float32 (:func:`kernel_dtype`)."""
    if dtype in (torch.float16, torch.bfloat16):
        return kernel_dtype(torch.bfloat16)
    return dtype


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The kernels' accumulator dtype for inputs of ``dtype``: float64 for float64, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def launch_constants(q: torch.Tensor, v: torch.Tensor) -> dict:
    """The compile-time constants every kernel takes for queries ``q`` and values ``v``: ``PRECISION`` of
    ``tl.dot`` (float32 operands: IEEE unless PyTorch allows TF32 for float32 matrix products —
    :func:`maskattn.kernels.precision.tf32_matmul`, which reads torch's ``fp32_precision`` API where it exists;
    ignored for half precision), ``ACC`` (the accumulator type) and the padded head widths ``BLOCK_DK``,
    ``BLOCK_DV`` (powers of two, at least 16)."""
    half = q.dtype in (torch.float16, torch.bfloat16)
    precision = "tf32" if half or (q.dtype == torch.float32 and tf32_matmul()) else "ieee"
    return dict(PRECISION=precision,
                ACC=load("jit_helpers").accumulator_type(str(accumulator(q.dtype)).removeprefix("torch.")),
                BLOCK_DK=max(16, next_power_of_2(q.shape[-1])), BLOCK_DV=max(16, next_power_of_2(v.shape[-1])))


#: the wrappers pad head features to a multiple of this many (issue 41 §1.2; docs/gpu.md, "Head widths"): the kernels
#: then see a width and row strides divisible by 16, which Triton specialises on — their feature loads and stores
#: are whole 16-byte vectors under a uniform mask. A width such as 72 or 150 read row by row with per-element
#: masks spilled 152–948 bytes per thread; padded to 80 and 160 it spills none
FEATURE_MULTIPLE = 16


def padded_head_dim(head_dim: int) -> int:
    """``head_dim`` rounded up to a multiple of :data:`FEATURE_MULTIPLE` (at least 16)."""
    return max(FEATURE_MULTIPLE, cdiv(head_dim, FEATURE_MULTIPLE) * FEATURE_MULTIPLE)


def feature_split(width: int) -> tuple[int, int]:
    """``(main, tail)``: the feature blocks of a padded head ``width`` (a multiple of 16) in kernels that tile the
    feature axis (MTSA's, DMAN's and the band's: :func:`.jit_helpers.feature_blocks`) — the largest power of two at most
    ``width`` and the next power of two (at least 16) at or above the rest, so 160 (d 150) is 128 + 32 and 80 (d 72,
    80) 64 + 16, not one block of 256 or 128. ``(width, 0)`` — one block, no tail — for a power of two, and
    ``(2^k, 0)`` where the two blocks would cover as much as the power of two above (208 → 256: two ``tl.dot`` s for
    no saving)."""
    whole = max(FEATURE_MULTIPLE, next_power_of_2(width))
    if whole == width:
        return whole, 0
    main = whole // 2
    tail = max(FEATURE_MULTIPLE, next_power_of_2(width - main))
    return (whole, 0) if main + tail >= whole else (main, tail)


def feature_width(head_dim: int) -> int:
    """The feature width the kernels lay a head of ``head_dim`` features out at: :func:`padded_head_dim`,
    and for a split width (:func:`feature_split`) main + tail — 160 for d 150, 80 for d 72, 192 for d 176 —, so no
    feature of a block lies past the matrix and the blocks' loads and stores mask rows only (the wrappers' zeros fill
    the rest)."""
    main, tail = feature_split(padded_head_dim(head_dim))
    return main + tail if tail else padded_head_dim(head_dim)


def feature_constants(k_width: int, v_width: int) -> dict:
    """The feature-block constants of a launch of kernels that tile the feature axis, for padded key and value
    widths: ``BLOCK_DK`` / ``BLOCK_DV`` the width each covers (main + tail) and ``TAIL_DK`` / ``TAIL_DV`` its tail —
    given only where there is one, so a power-of-two width launches with exactly :func:`launch_constants`' keys and
    values (the kernels' default tail is 0: no tail code is compiled)."""
    out: dict = {}
    for axis, width in (("K", k_width), ("V", v_width)):
        main, tail = feature_split(width)
        out[f"BLOCK_D{axis}"] = main + tail
        if tail:
            out[f"TAIL_D{axis}"] = tail
    return out


def pad_features(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` with its last (feature) axis zero-padded to ``width`` — ``t`` itself when it is that wide already. Zero
    features add nothing to ``q·k`` and give zero output columns, which :func:`unpad_features` drops; autograd
    slices the gradients back."""
    if t.shape[-1] == width:
        return t
    return torch.nn.functional.pad(t, (0, width - t.shape[-1]))


def unpad_features(t: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` features of ``t`` (a view; ``t`` itself when it has no padding)."""
    return t if t.shape[-1] == width else t[..., :width]


def placeholder(t: torch.Tensor | None, like: torch.Tensor, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """``t``, or a one-element tensor on ``like``'s device for a pointer argument the kernel will not read."""
    return t if t is not None else like.new_empty(1, dtype=dtype)


_device_tables: dict = {}


def device_table(values: list[int], device: torch.device) -> torch.Tensor:
    """A small int32 table (per-head bands, head areas) on ``device``, copied there once per (values, device):
    later calls read no host memory, so a step on CUDA has no host-to-device copy."""
    key = (tuple(values), str(device))
    if key not in _device_tables:
        _device_tables[key] = torch.tensor(values, dtype=torch.int32, device=device)
    return _device_tables[key]


def cdiv(a: int, b: int) -> int:
    """``⌈a / b⌉`` (the number of tiles)."""
    return -(-a // b)


# --------------------------------------------------------------------------------------------------
# launching
# --------------------------------------------------------------------------------------------------

@dataclass
class Launch:
    """One recorded launch: the ``@triton.jit`` kernel, its grid, its arguments as the launcher passed them and the
    device it would run on (:func:`launch_device`: the tensors' device, made current around the launch)."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict
    device: torch.device | None = None


_recorder: list[Launch] | None = None


def launch_device(*args, **kwargs) -> torch.device | None:
    """The device of the tensors among a launch's arguments (None when there are none). Triton launches on the
    *current* CUDA device and its current stream; :func:`launch` makes this device current around the launch, so
    ``cuda:1`` tensors run on GPU 1 (on its current stream) whatever device is current. Tensors on different
    devices are refused (:class:`~maskattn.errors.InputError`): one kernel cannot read both."""
    devices = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.device not in devices:
            devices.append(value.device)
    if len(devices) > 1:
        from ...errors import InputError
        raise InputError(f"a Triton launch takes tensors on one device, got tensors on "
                         f"{', '.join(str(d) for d in devices)}: move them to one device")
    return devices[0] if devices else None


def _on_device(device: torch.device | None):
    """A context that makes ``device`` CUDA's current device (and so its current stream Triton's), or nothing off
    CUDA (the interpreter)."""
    if device is None or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)


@contextlib.contextmanager
def recording(target: Target):
    """Inside: launches are recorded, not run, with the tiles and constants of CUDA device ``target``
    (:func:`assume_target`); yields the list of :class:`Launch` es (the offline compile check)."""
    global _recorder
    previous, _recorder = _recorder, []
    try:
        with assume_target(target):
            yield _recorder
    finally:
        _recorder = previous


def launch(kernel, programs: int, *args, **kwargs) -> None:
    """Launch ``kernel`` over ``programs`` programs on one grid axis (CUDA's ``gridDim.x``: up to 2³¹ − 1; the
    kernels decode their tile and (batch, head) pair from the program id, so no axis meets the 65,535 cap of
    ``gridDim.y``), on the tensors' device (:func:`launch_device`, made current around the launch, so the launch
    goes to that device's current stream). A failure inside the launch keeps its traceback and gains a note naming
    :data:`DISABLE_ENV`."""
    if programs > GRID_LIMIT:
        from ...errors import InputError
        raise InputError(f"a Triton launch of {programs:,} programs exceeds CUDA's grid limit of {GRID_LIMIT:,} "
                         "(batch × heads × tiles): split the batch")
    if programs == 0:
        return
    device = launch_device(*args, **kwargs)
    if _recorder is not None:
        _recorder.append(Launch(kernel, (programs,), args, kwargs, device))
        return
    try:
        with _on_device(device):
            kernel[(programs,)](*args, **kwargs)
    except Exception as error:
        name = getattr(getattr(kernel, "fn", None), "__name__", str(kernel))
        note = (f"maskattn: the Triton kernel {name} failed; set {DISABLE_ENV}=1 to keep backend='auto' from choosing "
                "the Triton kernels (docs/gpu.md)")
        add_note = getattr(error, "add_note", None)  # Python >= 3.11
        if add_note is not None:
            add_note(note)
        else:
            error.args = (*error.args, note)
        raise
