"""The anchor beside Triton's own fused-attention tutorial (docs/gpu/offline-perf.md, "The anchor beside the
tutorial").

The report's ratios are only as honest as its anchor (``benchmarks/anchor_attention.py``): a weak anchor makes every
maskattn pass look cheap. This module compiles the tutorial — ``python/tutorials/06-fused-attention.py`` of the
Triton repository, from a path the user passes (it is not part of maskattn) — and the anchor at the tutorial's own
tiles (:data:`TUTORIAL_TILES`), for the same architectures and head widths, and reads both machine codes the way the
report reads every pass: the steady state of each loop (its light path: an interior tile, no mask) per score — warp
instructions, ``MUFU`` and tensor-core FLOPs. Both in float16 (the tutorial's kernels cast ``p`` to float16).

The tutorial's forward loads tiles through tensor descriptors (``desc.load``; the revision of Triton ≥ 3.4) and its
backward is one kernel with two loops per program — the key loop (``dK``, ``dV``: ``BLOCK_M1`` queries streamed
over ``BLOCK_N1`` held keys) and the query loop (``dQ``: ``BLOCK_N2`` keys over ``BLOCK_M2`` queries) — each as a
masked (diagonal) and an unmasked loop; the unmasked ones are its steady state. The anchor splits the same two
loops into two kernels (``anchor_bwd_kv``, ``anchor_bwd_q``). A loop is told by its tensor-core FLOPs per iteration
(``4d``, ``8d`` and ``6d`` per score for the forward, the key loop and the query loop), so a loop that is not found
is an error, never a silent zero.

Loading the tutorial runs its module-level code, which asks the active Triton driver for a device: it runs with a
stand-in driver that names ``arch`` (no GPU is touched), and ``torch.cuda.get_device_capability`` answering
``arch`` (its autotuning filters ask).
"""

from __future__ import annotations

import importlib.util
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from . import anchor, sass

#: the tutorial's tiles, ``(block_m, block_n, warps, stages)``: its forward's test configuration (128 × 64 on
#: 4 warps, the autotuner's pick for d ≤ 128 without warp specialisation) and its backward's fixed launch
#: (``BLOCK_M1, BLOCK_N1 = 32, 128``; ``BLOCK_M2, BLOCK_N2 = 128, 32``; 4 warps, 5 stages)
TUTORIAL_TILES = {"fwd": (128, 64, 4, 3), "bwd_kv": (32, 128, 4, 5), "bwd_q": (128, 32, 4, 5)}
#: tensor-core FLOPs per score of each loop, in units of the head width d
FLOPS_PER_SCORE = {"fwd": 4, "bwd_kv": 8, "bwd_q": 6}
#: the per-score figures compared, with the report's names
FIGURES = (("issue", "warp instr / 1k scores", 1000.0), ("mufu", "MUFU / score", 1.0),
           ("tensor_flops", "TC FLOP / score", 1.0))


class _Driver:
    """A stand-in for ``triton.runtime.driver.active`` while the tutorial's module-level code runs."""

    def __init__(self, arch: int):
        self.arch = arch

    def get_active_torch_device(self):
        import torch
        return torch.device("cpu")

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", self.arch, 32)


@contextmanager
def _as_device(arch: int):
    import triton
    with mock.patch.object(triton.runtime.driver, "_active", _Driver(arch), create=True), \
            mock.patch("torch.cuda.get_device_capability", lambda *args, **kwargs: (arch // 10, arch % 10)):
        yield


def load(path: str | Path, arch: int):
    """The tutorial module at ``path``, imported as if on a CUDA device of ``arch`` (no GPU touched)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--tutorial: no file at {path} (python/tutorials/06-fused-attention.py of Triton)")
    name = f"_maskattn_tutorial_sm{arch}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"--tutorial: {path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with _as_device(arch):
        spec.loader.exec_module(module)
    for kernel in ("_attn_fwd", "_attn_bwd"):
        if not hasattr(module, kernel):
            raise ImportError(f"--tutorial: {path} has no {kernel}: not Triton's fused-attention tutorial")
    return module


def _jit(kernel):
    """The ``JITFunction`` under an autotuner (the tutorial's forward is autotuned)."""
    from triton.runtime.jit import JITFunction
    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


def _by_name(kernel, values: dict, **constants):
    """``(args, kwargs)`` of ``kernel`` filled from ``values`` by parameter name (the tutorial's revisions name the
    same things alike); a parameter without a value is an error naming it."""
    jit = _jit(kernel)
    missing = [n for n in jit.arg_names if n not in values]
    if missing:
        raise TypeError(f"the tutorial's {jit.fn.__name__} takes {missing}, which this report does not know "
                        "(a revision of the tutorial other than Triton ≥ 3.4's)")
    return jit, tuple(values[n] for n in jit.arg_names), constants


@dataclass
class Steady:
    """The steady state of one loop: per score, along its light path."""

    issue: float
    mufu: float
    tensor_flops: float
    registers: int
    spill_bytes: int


def steady(launch, arch: int, loop: str, head_dim: int, area: int, warps: int) -> Steady:
    """Compile ``launch`` for ``arch`` and read, per score, the light path of its innermost loop whose tensor-core
    FLOPs per iteration are ``FLOPS_PER_SCORE[loop] · head_dim · area`` (an iteration computes ``area`` scores)."""
    cubin, _, _, _ = sass.compile_launch(launch, arch)
    text, registers = sass.disassemble(cubin)
    instructions = sass.parse_sass(text)
    wanted = FLOPS_PER_SCORE[loop] * head_dim * area
    found = []
    for a, b in sass.innermost_loops(instructions):
        light = sass.classify(sass.path_counts(instructions[a:b + 1])[0])
        if abs(light.tensor_flops * warps - wanted) <= 1e-6 * wanted:
            found.append(light)
    if len(found) != 1:
        raise RuntimeError(f"{launch.kernel.fn.__name__}: {len(found)} loops with {wanted} tensor FLOPs per "
                           f"iteration (the {loop} loop of {area} scores at d = {head_dim}); expected one")
    light = found[0]
    return Steady(light.instructions * warps / area, light.mufu_total * 32 * warps / area,
                  light.tensor_flops * warps / area, registers, sass.spilled_bytes(text))


def _launch(kernel, args, kwargs):
    from .. import runtime
    return runtime.Launch(kernel, (1,), args, kwargs)


def tutorial_passes(module, arch: int, head_dim: int, n: int = 2048) -> dict[str, Steady]:
    """The tutorial's forward and its backward's two loops at :data:`TUTORIAL_TILES`, float16, non-causal
    forward (its backward is causal only: its unmasked loops are the steady state)."""
    import torch
    batch, heads = 2, 4
    q = torch.empty(batch, heads, n, head_dim, dtype=torch.float16)
    rows = torch.empty(batch, heads, n, dtype=torch.float32)
    stride = q.stride()
    values = dict(Q=q, K=q, V=q, DO=q, DQ=q, DK=q, DV=q, Out=q, desc_q=q, desc_k=q, desc_v=q, desc_o=q,
                  sm_scale=head_dim ** -0.5, M=rows, D=rows, Z=batch, H=heads, N_CTX=n,
                  stride_z=stride[0], stride_h=stride[1], stride_tok=stride[2], stride_d=stride[3])
    out = {}
    m, nb, warps, stages = TUTORIAL_TILES["fwd"]
    jit, args, kwargs = _by_name(module._attn_fwd, values | dict(
        HEAD_DIM=head_dim, BLOCK_M=m, BLOCK_N=nb, FP8_OUTPUT=False, STAGE=1, warp_specialize=False,
        IS_HOPPER=arch == 90, CAUSAL=False), num_warps=warps, num_stages=stages)
    out["fwd"] = steady(_launch(jit, args, kwargs), arch, "fwd", head_dim, m * nb, warps)
    m1, n1, warps, stages = TUTORIAL_TILES["bwd_kv"]
    m2, n2, _, _ = TUTORIAL_TILES["bwd_q"]
    jit, args, kwargs = _by_name(module._attn_bwd, values | dict(
        BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=m2, BLOCK_N2=n2, BLK_SLICE_FACTOR=2, HEAD_DIM=head_dim),
        num_warps=warps, num_stages=stages)
    launch = _launch(jit, args, kwargs)
    out["bwd_kv"] = steady(launch, arch, "bwd_kv", head_dim, m1 * n1, warps)
    out["bwd_q"] = steady(launch, arch, "bwd_q", head_dim, m2 * n2, warps)
    return out


def anchor_passes(arch: int, head_dim: int, n: int = 2048) -> dict[str, Steady]:
    """The anchor's three passes at :data:`TUTORIAL_TILES`, float16, non-causal, whole tiles."""
    import torch
    anchor_module = anchor.load()
    pairs = 8
    x = torch.empty(pairs, n, head_dim, dtype=torch.float16)
    rows = torch.empty(pairs, n, dtype=torch.float32)
    out = {}
    common = dict(CAUSAL=False, EVEN=True, BLOCK_D=head_dim)
    m, nb, warps, stages = TUTORIAL_TILES["fwd"]
    out["fwd"] = steady(_launch(anchor_module.anchor_fwd, (x, x, x, x, rows, n, head_dim, n // m, 0.18),
                                dict(common, BLOCK_M=m, BLOCK_N=nb, num_warps=warps, num_stages=stages)),
                        arch, "fwd", head_dim, m * nb, warps)
    m, nb, warps, stages = TUTORIAL_TILES["bwd_kv"]
    out["bwd_kv"] = steady(_launch(anchor_module.anchor_bwd_kv, (x, x, x, x, rows, rows, x, x, n, head_dim, n // nb, 0.125,
                                                          0.18),
                                   dict(common, BLOCK_M=m, BLOCK_N=nb, num_warps=warps, num_stages=stages)),
                           arch, "bwd_kv", head_dim, m * nb, warps)
    m, nb, warps, stages = TUTORIAL_TILES["bwd_q"]
    out["bwd_q"] = steady(_launch(anchor_module.anchor_bwd_q, (x, x, x, x, rows, rows, x, n, head_dim, n // m, 0.125, 0.18),
                                  dict(common, BLOCK_M=m, BLOCK_N=nb, num_warps=warps, num_stages=stages)),
                          arch, "bwd_q", head_dim, m * nb, warps)
    return out


def _direction(passes: dict[str, Steady], key: str) -> dict[str, float]:
    """Per score: the forward, and the backward as its two loops together (each score is visited by both)."""
    return {"forward": getattr(passes["fwd"], key),
            "backward": getattr(passes["bwd_kv"], key) + getattr(passes["bwd_q"], key)}


def compare(path: str | Path, archs=(90, 80), dims=(64, 128)) -> list[dict]:
    """One row per (direction, d, arch): each figure of the tutorial and of the anchor, and their ratio."""
    rows = []
    for arch in archs:
        module = load(path, arch)
        for d in dims:
            theirs, ours = tutorial_passes(module, arch, d), anchor_passes(arch, d)
            for direction in ("forward", "backward"):
                row: dict = {"direction": direction, "d": d, "arch": arch}
                for key, _, _ in FIGURES:
                    t, a = _direction(theirs, key)[direction], _direction(ours, key)[direction]
                    row[key] = {"tutorial": t, "anchor": a, "ratio": a / t if t else float("nan")}
                rows.append(row)
    return rows


def within(rows: list[dict], tolerance: float = 0.05) -> bool:
    """Every figure of every row within ``tolerance`` of the tutorial's (the issue's 5 %)."""
    return all(abs(row[key]["ratio"] - 1.0) <= tolerance for row in rows for key, _, _ in FIGURES)


def table(rows: list[dict]) -> str:
    """The comparison as a Markdown table: per direction, d and architecture, each figure tutorial → anchor (×)."""
    head = " | ".join(label for _, label, _ in FIGURES)
    lines = [f"| direction | d | arch | {head} |", "|---|---:|---|" + "---|" * len(FIGURES)]
    for row in rows:
        cells = []
        for key, _, unit in FIGURES:
            r = row[key]
            cells.append(f"{r['tutorial'] * unit:.0f} → {r['anchor'] * unit:.0f} ({r['ratio']:.2f}×)" if unit > 1
                         else f"{r['tutorial']:.3g} → {r['anchor']:.3g} ({r['ratio']:.2f}×)")
        lines.append(f"| {row['direction']} | {row['d']} | sm_{row['arch']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
