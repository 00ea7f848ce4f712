"""Compile maskattn's Triton kernels for NVIDIA GPUs ahead of time, on a machine without one (docs/gpu.md,
"Offline compile check").

Triton's interpreter, which runs the kernels on the CPU in the tests, is lenient: it ignores unknown launch
keywords, shared-memory limits and registers. This check sees what a GPU would:

1. It drives the real launchers (:func:`.tensorized.tensorized_triton`, :func:`.dman.dman_triton`,
   :func:`.band.band_triton`, forward and backward through autograd) on small CPU tensors inside
   :func:`.runtime.recording` — the launchers choose tiles and constants as on a CUDA device of each architecture,
   and :func:`.runtime.launch` records ``(kernel, grid, arguments)`` instead of launching. Configurations that the
   registry declares unsupported on an architecture (:func:`.runtime.target_reason`) are never launched and are
   listed as such.
2. It binds each recorded launch as ``JITFunction.run`` does (``create_function_from_signature`` and
   ``JITFunction._pack_args``: an unknown keyword is refused there, integer arguments are specialised) and
   compiles it with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` — no driver needed,
   only the ``ptxas`` that the ``triton`` wheel bundles.
3. It reports, per kernel × configuration × architecture: registers, spilled bytes, stack, shared memory against
   the architecture's per-block limit, and ptxas's performance advisories (e.g. C7515, wgmma serialised); and fails
   on a refused launch, a compile error, shared memory or registers over the limit, and — the kernels' performance
   contract — spills in half precision (none in a plain configuration at any head width up to 256, at most 256
   bytes with options at head dims up to 128) or a wgmma serialisation advisory on sm_90 and newer. A *plain*
   configuration is every one without an option (:attr:`Case.plain`: no padding, dropout, floor, log-sigmoid
   scores or head area, the default scale) in each form of the call (:data:`STRUCTURE`): non-causal and causal for
   every family — DMAN's decoders are a compilation of their own — and both of the band's tile shapes.
4. It fails, in one line, where it would check nothing: bad arguments (a kernel it does not know, head widths or
   a length below 1, a length over :data:`MAX_SEQ_LEN`, ``--jobs`` below 1, a report into a place it cannot write:
   :func:`maskattn.files.check_outputs`) before anything is recorded or compiled, and a run in which some kernel
   asked for was never compiled (every case of it unsupported). Its reports are written atomically
   (:func:`maskattn.files.atomic_write`); ``--markdown``'s begins with the command that made it (:func:`header`).

Run it in its own process (Triton reads ``TRITON_INTERPRET`` when the kernels are first decorated):
``python -m maskattn.kernels.triton.offline.compile_check --matrix ci --jobs 2``. It relies on Triton's binding
internals as of Triton 3.x (``create_function_from_signature``, ``_pack_args``); a Triton without them is
reported, not guessed at. ``--matrix`` (:data:`MATRICES`): ``smoke`` (a slow test's few
compilations), ``ci`` (.ci/run: float16 and bfloat16, head widths 64 / 128 / 256, the head width of every shipped
preset and 72 / 80 / 96, every plain configuration and every option on — each causal and not, each tile shape — on
every architecture ``auto`` accepts — :data:`.runtime.TARGETS`), ``half`` (every head width and option set) and
``full`` (also float32, IEEE and TF32): slow tests. ``--options`` replaces the matrix's option sets (``plain``:
the plain configurations alone).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import os
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from collections.abc import Iterable
from typing import Any

__all__ = ["Case", "Row", "MATRICES", "EXTRA_WIDTHS", "STRUCTURE", "plain_sets", "option_sets", "preset_head_widths",
           "matrix_pairs", "cases", "record", "bind", "compile_rows", "compile_pairs", "padding_share", "violations",
           "summary", "table", "header", "kernel_names", "unchecked", "main"]

#: per-architecture launch limits besides shared memory (64K 32-bit registers per block)
REGISTERS_PER_BLOCK = 65536
DTYPES = ("fp16", "bf16", "fp32", "tf32")
#: spill budgets of the performance contract (bytes of spill stores), half precision: without options at every head
#: width (up to 256), with options at head dims <= 128
SPILL_BUDGET_PLAIN = 0
SPILL_BUDGET_OPTIONS = 256


@dataclass(frozen=True)
class Case:
    """One call of a launcher: ``family`` (``mtsa``, ``dman``, ``band``), head width, dtype name and options."""

    family: str
    head_dim: int
    dtype: str
    options: tuple[tuple[str, object], ...]

    @property
    def label(self) -> str:
        opts = " ".join(k if v is True else f"{k}={v}" for k, v in self.options if v not in (False, None))
        return f"d={self.head_dim} {self.dtype}" + (f" {opts}" if opts else "")

    @property
    def plain(self) -> bool:
        """Every option off (:data:`PLAIN`) but the call's form (:data:`STRUCTURE`: causal or not, the tile shape)."""
        return all(value == PLAIN[self.family][key] for key, value in self.options
                   if key not in STRUCTURE[self.family])


@dataclass
class Row:
    """One compilation (or one launch refused or declared unsupported) and what ptxas said of it."""

    kernel: str
    case: str
    arch: int
    status: str  # ok | bound (not compiled) | refused | error | unsupported
    plain: bool = False
    dtype: str = ""
    head_dim: int = 0
    tiles: str = ""
    warps: int = 0
    stages: int = 0
    registers: int = 0
    spill: int = 0
    stack: int = 0
    smem: int = 0
    smem_limit: int = 0
    advisories: list[str] = field(default_factory=list)
    seconds: float = 0.0
    message: str = ""
    #: the share of the tensor-core work spent on padding features (:func:`padding_share`)
    padding: float = 0.0


#: every family's options: the values each takes, and the plain (all off, non-causal) choice. ``causal``: DMAN's
#: ``causal=True`` (the decoders' DMAN: a compile-time constant of its own), the band ``i − left … i`` (``right = 0``:
#: SMAN / CSAN in a decoder) and an MTSA layer whose heads all look back (forward, causal, a causal window) — the
#: band's and MTSA's bands are run-time arguments, not specialised, so their causal launches bind to the
#: compilations of the non-causal ones (recorded and bound all the same: a kernel that specialised on them would
#: compile them apart)
OPTIONS: dict[str, dict[str, tuple[Any, ...]]] = {
    "mtsa": dict(causal=(False, True), scale=("log_sigmoid", "identity"), kpm=(False, True), dropout=(False, True)),
    "dman": dict(causal=(False, True), kpm=(False, True), floor=(False, True), dropout=(False, True)),
    "band": dict(causal=(False, True), narrow=(False, True), logsig=(False, True), area=(1, 3), kpm=(False, True),
                 dropout=(False, True)),
}
PLAIN: dict[str, dict[str, Any]] = {
    "mtsa": dict(causal=False, scale="log_sigmoid", kpm=False, dropout=False),
    "dman": dict(causal=False, kpm=False, floor=False, dropout=False),
    "band": dict(causal=False, narrow=False, logsig=False, area=1, kpm=False, dropout=False),
}
ALL: dict[str, dict[str, Any]] = {
    "mtsa": dict(causal=True, scale="identity", kpm=True, dropout=True),
    "dman": dict(causal=True, kpm=True, floor=True, dropout=True),
    "band": dict(causal=True, narrow=True, logsig=True, area=3, kpm=True, dropout=True),
}


#: options that choose a launch's tiles, not the kernel's code (the band's narrow tiles): "all on" is compiled with
#: each of their values, so every tile shape meets the options (a wide band with dropout is not a narrow one)
SHAPE_OPTIONS: dict[str, tuple[str, ...]] = {"band": ("narrow",)}
#: the form of a call rather than an option of it: its tile shapes (:data:`SHAPE_OPTIONS`) and causal or not. Every
#: combination of their values is a configuration of its own, compiled plain (every other option off: a
#: :attr:`Case.plain` case, spill budget 0 at every width) and with every other option on
STRUCTURE: dict[str, tuple[str, ...]] = {family: ("causal", *SHAPE_OPTIONS.get(family, ())) for family in OPTIONS}


def _forms(family: str, base: dict[str, Any]) -> list[dict[str, Any]]:
    """``base`` once per combination of the values of the family's :data:`STRUCTURE` options (``base``'s first)."""
    sets = [dict(base)]
    for key in STRUCTURE[family]:
        sets += [dict(s, **{key: value}) for s in list(sets) for value in OPTIONS[family][key] if value != s[key]]
    return sets


def _all_on(family: str) -> list[dict[str, Any]]:
    """Every option on, once per combination of the family's :data:`STRUCTURE` values."""
    return _forms(family, ALL[family])


def plain_sets(family: str) -> list[dict[str, Any]]:
    """The family's plain configurations: every option off, once per combination of its :data:`STRUCTURE` values
    (non-causal and causal; the band's wide and narrow tiles)."""
    return _forms(family, PLAIN[family])


def option_sets(family: str, which: str) -> list[dict[str, Any]]:
    """``plain`` (every plain configuration: all off, causal and not, every tile shape), ``all`` (all on, the same
    forms), ``both``, or ``each`` (both, and each plain configuration with one option changed)."""
    sets = {"plain": plain_sets(family), "all": _all_on(family),
            "both": [*plain_sets(family), *_all_on(family)]}.get(which)
    if sets is not None:
        return [dict(s) for s in sets]
    out = [*plain_sets(family), *_all_on(family)]
    out += [dict(plain, **{key: value}) for plain in plain_sets(family) for key, values in OPTIONS[family].items()
            if key not in STRUCTURE[family] for value in values if value != plain[key]]
    unique = {tuple(sorted(o.items())): o for o in out}
    return list(unique.values())


#: head widths that are not powers of two, common in pretrained models (issue 41 §1.2), compiled beside the
#: presets' own (:func:`preset_head_widths`)
EXTRA_WIDTHS = (72, 80, 96)
#: architectures from this one on are recorded apart from older ones of the same shared-memory class (a tile
#: table keyed by architecture generation would give them other launches)
MIN_RECORD_SPLIT = 90
#: stands for the head widths of the shipped presets in a matrix's head dims (:func:`preset_head_widths`)
PRESETS = "presets"
#: the architectures of the first CI matrix (issue "GPU kernels that launch"); every other one ``auto`` accepts
#: (:data:`.runtime.TARGETS`: sm_87, sm_89, sm_100, sm_103, sm_120, sm_121) is compiled in bfloat16
_FIRST_ARCHS = (80, 86, 90)


def preset_head_widths() -> tuple[int, ...]:
    """The head width ``d_model / num_heads`` of every shipped preset (``maskattn/configs/*.yaml``) whose model
    has attention of its own (a ``model.d_model`` and ``model.num_heads``; the ``*-minilm`` presets fine-tune a
    pretrained encoder and have neither), sorted and without repeats — read from the files, so a new preset's width
    enters the CI matrix by itself. Widths above :data:`.runtime.MAX_HEAD_DIM` are listed too (the check reports
    them as unsupported: ``auto`` runs another backend)."""
    from importlib import resources

    from ....sections import parse_yaml

    widths = set()
    for entry in (resources.files("maskattn") / "configs").iterdir():
        if not entry.name.endswith(".yaml"):
            continue
        preset = parse_yaml(entry.read_text(encoding="utf-8"), f"preset {entry.name}")
        model = (preset.get("model") if isinstance(preset, dict) else None) or {}
        d_model, heads = model.get("d_model"), model.get("num_heads")
        if isinstance(d_model, int) and isinstance(heads, int) and heads > 0 and d_model % heads == 0:
            widths.add(d_model // heads)
    return tuple(sorted(widths))


def _archs() -> tuple[int, ...]:
    from .. import runtime
    return tuple(sorted(runtime.TARGETS))


#: the matrices: blocks of (dtypes, head dims, option sets, architectures), each block a product; a case and
#: architecture in several blocks is compiled once. ``smoke``: a slow test's compilations (every kernel once, at the
#: widest half-precision configuration, on the smallest and the largest shared memory); ``ci``: .ci/run's — half
#: precision at head widths 64 / 128 / 256 (16 and 32 take the 64 entries with narrower features), every plain
#: configuration and every option on (:func:`option_sets`' ``both``: each causal and not, each tile shape) on
#: sm_80 / 86 / 90; bfloat16 with the same options at the presets' head widths and 72 / 80 / 96 (the
#: wrappers pad them to a multiple of 16, so they bind to the compilations of the powers of two: no compilation of
#: their own); and bfloat16 at all those widths on every other architecture ``auto`` accepts
#: (:data:`.runtime.TARGETS`). ``half`` and ``full``: every head width and option set
#: (slow tests).
MATRICES: dict[str, tuple[tuple[tuple[str, ...], tuple[int | str, ...], str, tuple[int, ...] | None], ...]] = {
    "smoke": ((("fp16",), (128,), "all", (86, 90)),),
    "ci": ((("fp16", "bf16"), (64, 128, 256), "both", _FIRST_ARCHS),
           (("bf16",), (PRESETS, *EXTRA_WIDTHS), "both", _FIRST_ARCHS),
           (("bf16",), (64, 128, 256, PRESETS, *EXTRA_WIDTHS), "both", None)),  # None: every other target
    "half": ((("fp16", "bf16"), (16, 32, 64, 128, 256, PRESETS, *EXTRA_WIDTHS), "each", _FIRST_ARCHS),),
    "full": ((("fp16", "bf16", "fp32", "tf32"), (16, 32, 64, 128, 256, PRESETS, *EXTRA_WIDTHS), "each",
              _FIRST_ARCHS),),
}


def _dims(dims) -> tuple[int, ...]:
    out: list[int] = []
    for d in dims:
        for width in (preset_head_widths() if d == PRESETS else (d,)):
            if width not in out:
                out.append(width)
    return tuple(out)


def _cases(dtypes, dims, which, families) -> list[Case]:
    return [Case(family, d, dtype, tuple(sorted(options.items())))
            for family in families for d in _dims(dims) for dtype in dtypes for options in option_sets(family, which)]


def cases(matrix: str, families=("mtsa", "dman", "band")) -> list[Case]:
    """Every case of ``matrix`` (on any architecture), without repeats."""
    seen: dict[Case, None] = {}
    for dtypes, dims, which, _ in MATRICES[matrix]:
        seen.update(dict.fromkeys(_cases(dtypes, dims, which, families)))
    return list(seen)


def matrix_pairs(matrix: str, families=("mtsa", "dman", "band"), *, dims=None, dtypes=None, archs=None,
                 options=None) -> list[tuple[Case, int]]:
    """The (case, architecture) pairs of ``matrix``, without repeats; ``dims``, ``dtypes``, ``archs`` and
    ``options`` (:func:`option_sets`' ``which``) replace the blocks' own."""
    pairs: dict[tuple[Case, int], None] = {}
    for block_dtypes, block_dims, which, block_archs in MATRICES[matrix]:
        if block_archs is None:
            block_archs = tuple(a for a in _archs() if a not in _FIRST_ARCHS)
        block_cases = _cases(tuple(dtypes or block_dtypes), tuple(dims or block_dims), options or which, families)
        for arch in archs or block_archs:
            pairs.update(dict.fromkeys((case, arch) for case in block_cases))
    return list(pairs)


# --------------------------------------------------------------------------------------------------
# 1. the launches the launchers make
# --------------------------------------------------------------------------------------------------

def _torch_dtype(name: str):
    import torch
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}[name]


def _tf32(enabled: bool):
    """TF32 allowed for float32 ``tl.dot`` or not, through the API the launchers read (torch's ``fp32_precision``
    where it exists: :func:`maskattn.kernels.precision.tf32_matmul_set`)."""
    from ...precision import tf32_matmul_set
    return tf32_matmul_set(enabled)


def _heads(B: int, n: int, H: int, d: int, dtype, grad: bool = True):
    """``(B, H, n, d)`` as the attention layers make it: a ``(B, n, H, d)`` projection with the heads transposed."""
    import torch
    t = torch.randn(B, n, H, d).to(dtype).transpose(1, 2)
    return t.requires_grad_() if grad else t


def _padding(B: int, n: int):
    import torch
    kpm = torch.zeros(B, n, dtype=torch.bool)
    kpm[-1, n - 7:] = True
    return kpm


def _call(case: Case, n: int) -> None:
    """Run ``case``'s launcher forward and backward (inside :func:`.runtime.recording`: nothing launches)."""
    import torch

    from ..band import band_triton
    from ..dman import dman_triton
    from ..tensorized import tensorized_triton
    opts: dict[str, Any] = dict(case.options)
    inputs: tuple[Any, ...]
    dtype, d, B, H = _torch_dtype(case.dtype), case.head_dim, 2, 4
    kpm = _padding(B, n) if opts["kpm"] else None
    drop = 0.1 if opts["dropout"] else 0.0
    with _tf32(case.dtype == "tf32"):
        if case.family == "mtsa":
            q, k, v, s2t = (_heads(B, n, H, d, dtype) for _ in range(4))
            # an encoder's heads (forward, backward, causal, a window) or, causal, a decoder's (each sees no later key)
            bands = ([(math.inf, -1), (math.inf, 0), (3, 0), (math.inf, 0)] if opts["causal"]
                     else [(math.inf, -1), (-1, math.inf), (math.inf, 0), (3, 3)])
            out, _ = tensorized_triton(q, k, v, s2t, bands, kpm, scale=opts["scale"], dropout_p=drop)
            inputs = (q, k, v, s2t)
        elif case.family == "dman":
            q, k, v = (_heads(B, n, H, d, dtype) for _ in range(3))
            a = torch.randn(B, n, requires_grad=True)
            table = torch.randn(2 * 128 + 1, requires_grad=True)
            u = torch.randn(H, requires_grad=True)
            out = dman_triton(q, k, v, a, table, u, causal=opts["causal"], key_padding_mask=kpm, q_offset=0,
                              dropout_p=drop, mask_floor=1e-4 if opts["floor"] else None)
            inputs = (q, k, v, a, table, u)
        else:
            q, k, v = (_heads(B, n, H, d, dtype) for _ in range(3))
            width = 5 if opts["narrow"] else 64
            area = opts["area"]
            index = torch.zeros(H, area, dtype=torch.long) if area > 1 else None
            valid = torch.ones(H, area, dtype=torch.bool) if area > 1 else None
            out = band_triton(q, k, v, width, 0 if opts["causal"] else width, index, valid, kpm, d ** -0.5,
                              opts["logsig"], drop)
            inputs = (q, k, v)
        torch.autograd.grad(out, inputs, torch.randn_like(out))


def _kernel_names(family: str) -> tuple[str, ...]:
    from .. import band, dman, tensorized
    return {"mtsa": tensorized.KERNELS, "dman": dman.KERNELS, "band": band.KERNELS}[family]


def record(case: Case, arch: int, n: int = 256):
    """``(launches, reason)``: the launches ``case`` makes on ``arch`` (a list of :class:`.runtime.Launch`), or
    ``([], reason)`` when the registry declares the case unsupported there."""
    from .. import runtime
    target = runtime.TARGETS[arch]
    with runtime.assume_target(target):
        reason = runtime.target_reason("cuda", case.head_dim, _kernel_names(case.family), _torch_dtype(case.dtype))
    if reason:
        return [], reason
    with runtime.recording(target) as launches:
        _call(case, n)
    return list(launches), None


# --------------------------------------------------------------------------------------------------
# 2. bind and compile as JITFunction.run would, without a driver
# --------------------------------------------------------------------------------------------------

def bind(kernel, args, kwargs, arch: int):
    """``(options, signature, constexprs, attrs)`` exactly as ``JITFunction.run`` derives them; raises what it
    raises (``KeyError`` for a keyword the kernel does not take)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(GPUTarget("cuda", arch, 32))
    kwargs = dict(kwargs, debug=False, instrumentation_mode="", fpsan_homomorphic_casts=False)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    return kernel._pack_args(backend, kwargs, bound, specialization, options)


_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_ADVICE = re.compile(r"\((C\d+)\) ([^\n]*)")


def padding_share(head_dim: int, block_dk: int, block_dv: int) -> float:
    """The share of a pass's ``tl.dot`` work (multiply-adds ∝ ``BLOCK_DK`` for ``q·k``, ``BLOCK_DV`` for the value
    products) spent on padding features, for heads of ``head_dim`` query/key and value features."""
    return 1.0 - 2 * head_dim / (block_dk + block_dv)


def _blocks(constexprs, kernel) -> dict[str, int]:
    names = kernel.arg_names
    return {names[path[0]]: value for path, value in constexprs.items() if names[path[0]].startswith("BLOCK")}


def _describe(constexprs, kernel) -> str:
    blocks = _blocks(constexprs, kernel)
    m, n = blocks.get("BLOCK_M", blocks.get("BLOCK")), blocks.get("BLOCK_N", blocks.get("BLOCK"))
    if m is None and n is None:  # an elementwise kernel (MTSA's per-element work): rows × features per program
        names = kernel.arg_names
        rows = next((value for path, value in constexprs.items() if names[path[0]] == "ROWS"), None)
        return f"{rows} rows d{blocks.get('BLOCK_DV', blocks.get('BLOCK_D'))}"
    return f"{m}x{n} d{blocks.get('BLOCK_DK')}/{blocks.get('BLOCK_DV')}"


@dataclass
class _Job:
    kernel: Any
    case: Case
    arch: int
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict


def _ptxas_verbose(ptx: str, arch: int) -> str:
    """``ptxas -v`` on a kernel's PTX with the options Triton uses: its resource usage and advisories."""
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as f:
            f.write(ptx)
        done = subprocess.run([get_ptxas(arch).path, "-v", "--regAllocOptLevel=2",
                               f"--gpu-name={sm_arch_from_capability(arch)}", source, "-o",
                               os.path.join(folder, "kernel.cubin")], capture_output=True, text=True)
        return done.stdout + done.stderr


def _compile(job: _Job) -> Row:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .. import runtime
    name = job.kernel.fn.__name__
    blocks = _blocks(job.constexprs, job.kernel)
    row = Row(name, job.case.label, job.arch, "ok", job.case.plain, job.case.dtype, job.case.head_dim,
              _describe(job.constexprs, job.kernel), job.options["num_warps"], job.options["num_stages"],
              smem_limit=runtime.TARGETS[job.arch].smem,
              # elementwise kernels (no BLOCK_DK: no tl.dot) put no tensor work on padding
              padding=padding_share(job.case.head_dim, blocks["BLOCK_DK"], blocks["BLOCK_DV"]) if "BLOCK_DK" in blocks
              else 0.0)
    triton.knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(ASTSource(job.kernel, job.signature, job.constexprs, job.attrs),
                                      target=GPUTarget("cuda", job.arch, 32), options=job.options)
    except Exception as error:  # every failure is a result row
        row.status, row.message = "error", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=4)}"
        row.seconds = time.perf_counter() - started
        return row
    row.seconds = time.perf_counter() - started
    text = log.getvalue()
    if "Used" not in text:  # Triton's cache answered: no ptxas ran
        text = _ptxas_verbose(compiled.asm["ptx"], job.arch)
    registers, spill = _PTXAS_REGISTERS.search(text), _PTXAS_SPILL.search(text)
    if registers is None or spill is None:
        row.status, row.message = "error", "ptxas printed no resource usage (-v):\n" + text[-2000:]
        return row
    row.registers, row.stack, row.spill = int(registers.group(1)), int(spill.group(1)), int(spill.group(2))
    row.smem = int(compiled.metadata.shared or 0)
    row.advisories = sorted({f"{code}: {message.strip()[:120]}" for code, message in _PTXAS_ADVICE.findall(text)})
    return row


def _jobs(pairs: list[tuple[Case, int]], n: int, kernels=None) -> tuple[list[_Job], list[Row]]:
    """The distinct compilations of the (case, architecture) ``pairs`` and the rows of launches refused at binding or
    declared unsupported."""
    jobs: list[_Job] = []
    rows: list[Row] = []
    seen: dict = {}  # compilation → its job
    from .. import runtime
    recorded: dict = {}
    for case, arch in pairs:
        # the launchers choose tiles and constants per shared-memory class (runtime.tiles), so the launches of one
        # case are recorded once per class and bound for each architecture of it — once per architecture where
        # runtime.ARCH_TILES has entries of its own
        own = arch if any(key[1] == arch for key in runtime.ARCH_TILES) else None
        record_key = (case, runtime.tile_class(runtime.TARGETS[arch]), arch >= MIN_RECORD_SPLIT, own)
        if record_key not in recorded:
            recorded[record_key] = record(case, arch, n)
        launches, reason = recorded[record_key]
        if reason:
            rows.append(Row("*", case.label, arch, "unsupported", case.plain, case.dtype, case.head_dim,
                            message=reason))
            continue
        for launch in launches:
            name = launch.kernel.fn.__name__
            if kernels and name not in kernels:
                continue
            try:
                options, signature, constexprs, attrs = bind(launch.kernel, launch.args, launch.kwargs, arch)
            except Exception as error:  # a launch JITFunction.run would refuse before compiling
                rows.append(Row(name, case.label, arch, "refused", case.plain, case.dtype, case.head_dim,
                                message=f"{type(error).__name__}: {error}"))
                continue
            key = (name, arch, repr(sorted(signature.items())), repr(sorted(constexprs.items(), key=str)),
                   repr(sorted(attrs.items(), key=str)), repr(sorted(options.__dict__.items())))
            if key in seen:
                # one compilation of several cases: it answers to the strictest contract among them (a plain
                # case's, spill budget 0, whichever case recorded it first)
                if case.plain and not seen[key].case.plain:
                    seen[key].case = case
                continue
            seen[key] = _Job(launch.kernel, case, arch, signature, constexprs, attrs, dict(options.__dict__))
            jobs.append(seen[key])
    return jobs, rows


_JOBS: list[_Job] = []


def _compile_index(index: int) -> Row:
    return _compile(_JOBS[index])


def compile_rows(case_list: list[Case], archs, **options) -> list[Row]:
    """:func:`compile_pairs` of every case of ``case_list`` on every architecture of ``archs``."""
    return compile_pairs(list(itertools.product(case_list, archs)), **options)


def compile_pairs(pairs: list[tuple[Case, int]], *, jobs: int = 1, n: int = 256, kernels=None,
                  bind_only: bool = False, progress=None) -> list[Row]:
    """Record, bind and compile the (case, architecture) ``pairs`` (only the kernels named in ``kernels``, if given);
    one :class:`Row` per distinct compilation, refused launch or unsupported case (``bind_only``: no compilation —
    a row ``bound`` per distinct launch, which catches refused launches in seconds)."""
    global _JOBS
    work, rows = _jobs(pairs, n, kernels)
    if bind_only:
        rows += [Row(job.kernel.fn.__name__, job.case.label, job.arch, "bound", job.case.plain, job.case.dtype,
                     job.case.head_dim, _describe(job.constexprs, job.kernel), job.options["num_warps"],
                     job.options["num_stages"]) for job in work]
        rows.sort(key=lambda r: (r.kernel, r.arch, r.case))
        return rows
    _JOBS = work
    with contextlib.ExitStack() as stack:
        results: Iterable[Row]
        if jobs <= 1:
            results = map(_compile, work)
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            pool = stack.enter_context(ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")))
            results = pool.map(_compile_index, range(len(work)))
        for i, row in enumerate(results):
            rows.append(row)
            if progress:
                progress(i + 1, len(work), row)
    rows.sort(key=lambda r: (r.kernel, r.arch, r.case))
    return rows


# --------------------------------------------------------------------------------------------------
# 3. the contract, and the report
# --------------------------------------------------------------------------------------------------

def violations(row: Row) -> list[str]:
    """What is wrong with ``row`` (empty when nothing is): a refused launch, a compile error, shared memory or
    registers over the limit, and, in half precision, spills — none in a plain configuration (every option off,
    causal or not: :attr:`Case.plain`) at any head width the kernels take (up to 256: issue 41 §1.2; issue 52 §4),
    at most 256 bytes with options at head dims up to 128 — or, at head dims up to
    128, a wgmma serialisation advisory on sm_90 and newer."""
    if row.status in ("refused", "error"):
        return [f"{row.status}: {row.message.splitlines()[0] if row.message else ''}"]
    if row.status in ("unsupported", "bound"):
        return []
    found = []
    if row.smem > row.smem_limit:
        found.append(f"shared memory {row.smem} B over the {row.smem_limit} B per-block limit of sm_{row.arch}")
    if row.registers * row.warps * 32 > REGISTERS_PER_BLOCK:
        found.append(f"{row.registers} registers × {row.warps * 32} threads over 64K per block")
    if row.dtype in ("fp16", "bf16") and (row.head_dim <= 128 or row.plain):
        budget = SPILL_BUDGET_PLAIN if row.plain else SPILL_BUDGET_OPTIONS
        if row.spill > budget:
            found.append(f"{row.spill} bytes spilled (budget {budget})")
    if row.dtype in ("fp16", "bf16") and row.head_dim <= 128:
        serialised = [a for a in row.advisories if a.startswith(("C7515", "C7512", "C7510", "C7509", "C7508"))]
        if row.arch >= 90 and serialised:
            found.append("wgmma serialised: " + "; ".join(serialised))
    return found


def summary(rows: list[Row]) -> str:
    """Per architecture: compilations, refused launches, unsupported cases, errors, over shared memory, spilling,
    the largest spill, rows with advisories, contract violations."""
    lines = ["| arch | compiled (bound) | refused | unsupported | errors | over shared memory | spilling "
             "| max spill (B) | with advisories | violations |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arch in sorted({r.arch for r in rows}):
        mine = [r for r in rows if r.arch == arch]
        ok = [r for r in mine if r.status == "ok"]
        bound = sum(r.status == "bound" for r in mine)
        lines.append("| sm_{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            arch, f"{len(ok)}" + (f" ({bound})" if bound else ""), sum(r.status == "refused" for r in mine),
            sum(r.status == "unsupported" for r in mine),
            sum(r.status == "error" for r in mine), sum(r.smem > r.smem_limit for r in ok),
            sum(r.spill > 0 for r in ok), max((r.spill for r in ok), default=0),
            sum(bool(r.advisories) for r in ok), sum(bool(violations(r)) for r in mine)))
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    """One Markdown line per row."""
    lines = ["| kernel | case | arch | tiles | warps/stages | registers | spill (B) | smem (KB) | MMA padding "
             "| advisories | |", "|---|---|---|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        bad = violations(r)
        if r.status in ("ok",):
            lines.append(f"| {r.kernel} | {r.case} | sm_{r.arch} | {r.tiles} | {r.warps}/{r.stages} | {r.registers} | "
                         f"{r.spill} | {r.smem / 1024:.1f} | {r.padding:.0%} | {', '.join(a.split(':')[0] for a in r.advisories)} | "
                         f"{'; '.join(bad)} |")
        else:
            lines.append(f"| {r.kernel} | {r.case} | sm_{r.arch} | | | | | | | | {r.status}: "
                         f"{(r.message.splitlines() or [''])[0][:160]} |")
    return "\n".join(lines)


def kernel_names(families=tuple(OPTIONS)) -> tuple[str, ...]:
    """The ``@triton.jit`` kernels of ``families`` as :class:`Row` names them (a pass's ``_narrow`` tiles run the
    pass's kernel)."""
    from .. import tensorized
    names: dict[str, None] = {}
    for family in families:
        names.update(dict.fromkeys(k.removesuffix("_narrow") for k in _kernel_names(family)))
        if family == "mtsa":  # and its elementwise kernels, whose tiles are not the table's (no tile_class)
            names.update(dict.fromkeys(tensorized.ELEMENTWISE_KERNELS))
    return tuple(names)


def unchecked(rows: list[Row], wanted: Iterable[str]) -> list[str]:
    """The kernels of ``wanted`` that no row compiled (or, ``--bind-only``, bound): a check of them checked
    nothing — every case unsupported, or none asked for."""
    checked = {r.kernel for r in rows if r.status in ("ok", "bound")}
    return [k for k in wanted if k not in checked]


#: the longest sequence the check records its launches at: the launches do not depend on the length (sizes are
#: not specialised; 256 crosses several tiles of every pass), while the CPU tensors it records them with grow with it
MAX_SEQ_LEN = 16384


def header(argv, rows: list[Row], seconds: float) -> str:
    """The ``--markdown`` report's first lines: the command that made it (``argv``: its arguments, ``None`` for
    ``sys.argv``; ``--json`` left out), the Triton that compiled it, its counts and time — so the report says how to
    regenerate it."""
    import triton

    given = list(sys.argv[1:] if argv is None else argv)
    shown = [x for i, x in enumerate(given) if x != "--json" and (i == 0 or given[i - 1] != "--json")]
    command = " ".join(["python -m maskattn.kernels.triton.offline.compile_check", *shown])
    compiled = sum(r.status in ("ok", "bound") for r in rows)
    bad = sum(bool(violations(r)) for r in rows)
    return (f"Generated by `{command}` (triton {triton.__version__} and the ptxas it bundles, no GPU; "
            f"{len(rows):,} rows, {compiled:,} {'bound' if any(r.status == 'bound' for r in rows) else 'compiled'}, "
            f"{bad} violations, {seconds:.0f} s). What it checks: docs/gpu.md, \"Offline compile check\".\n\n")


def _check_outputs(parser: argparse.ArgumentParser, outputs: dict[str, str | None]) -> None:
    """Refuse, in one line before anything is compiled, an output path the check could not write at its end (a
    folder, a path below a file, a read-only place; two options naming one file): the project's rule for every
    command's outputs (:func:`maskattn.files.check_outputs`). An existing report is replaced (the docs' report is
    regenerated in place), and missing folders on the way are created when it is written."""
    from ....errors import ArgumentError
    from ....files import check_outputs
    try:
        check_outputs(outputs, overwrite=True)
    except ArgumentError as error:
        parser.error(str(error))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m maskattn.kernels.triton.offline.compile_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", choices=list(MATRICES), default="half")
    parser.add_argument("--family", nargs="+", choices=list(OPTIONS), default=list(OPTIONS))
    from .. import runtime
    parser.add_argument("--archs", nargs="+", type=int, choices=sorted(runtime.TARGETS),
                        help="default: the matrix's")
    parser.add_argument("--dims", nargs="+", type=int, help="head dims (default: the matrix's; these replace them)")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, help="default: the matrix's")
    parser.add_argument("--options", choices=("plain", "all", "both", "each"),
                        help="option sets (default: each block's): plain = every option off, causal and not, every "
                             "tile shape; all = every option on, the same forms; each = both and each plain "
                             "configuration with one option changed")
    parser.add_argument("--kernels", nargs="+", metavar="KERNEL",
                        help=f"only these kernels (of {', '.join(kernel_names())})")
    parser.add_argument("--seq-len", type=int, default=256, help=f"1 … {MAX_SEQ_LEN}")
    parser.add_argument("--jobs", type=int, default=1, help="compile in this many processes")
    parser.add_argument("--bind-only", action="store_true", help="record and bind every launch, compile nothing")
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--markdown", help="write the summary and the table here")
    args = parser.parse_args(argv)
    # bad arguments: one line, before anything is recorded or compiled
    if args.dims and min(args.dims) < 1:
        parser.error(f"--dims takes head widths of at least 1 feature, got {min(args.dims)}")
    if not 1 <= args.seq_len <= MAX_SEQ_LEN:
        parser.error(f"--seq-len takes 1 … {MAX_SEQ_LEN} (the launches do not depend on the length), got "
                     f"{args.seq_len}")
    if args.jobs < 1:
        parser.error(f"--jobs takes at least 1 process, got {args.jobs}")
    if args.kernels:
        known = kernel_names(args.family)
        strangers = [k for k in args.kernels if k not in known]
        if strangers:
            parser.error(f"--kernels: {', '.join(strangers)} is not a kernel of {', '.join(args.family)} "
                         f"(they are {', '.join(known)})")
    _check_outputs(parser, {"--json": args.json, "--markdown": args.markdown})
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    if runtime.interpreted():
        parser.error("Triton's interpreter is on in this process (TRITON_INTERPRET=1 when the kernels were "
                     "loaded): run the check in a fresh process")
    pairs = matrix_pairs(args.matrix, tuple(args.family), dims=args.dims, dtypes=args.dtypes, archs=args.archs,
                         options=args.options)
    started = time.perf_counter()

    def progress(i, total, row):
        sys.stderr.write(f"\r[{i}/{total}] {time.perf_counter() - started:.0f} s  {row.kernel} sm_{row.arch} "
                         f"{row.status}        ")
        sys.stderr.flush()
    try:
        rows = compile_pairs(pairs, jobs=args.jobs, n=args.seq_len, kernels=args.kernels, bind_only=args.bind_only,
                             progress=progress)
    except ImportError as error:
        print(f"error: the offline check needs Triton's binding internals ({error})", file=sys.stderr)
        return 2
    sys.stderr.write("\n")
    report = summary(rows)
    print(report)
    bad = [(r, v) for r in rows for v in violations(r)]
    for r, v in bad:
        print(f"VIOLATION {r.kernel} [{r.case}] sm_{r.arch}: {v}")
    print(f"{len(rows)} rows, {sum(r.status in ('ok', 'bound') for r in rows)} "
          f"{'bound' if args.bind_only else 'compiled'}, {len(bad)} violations, {time.perf_counter() - started:.0f} s")
    from ....files import atomic_write
    if args.json:
        atomic_write(args.json, [json.dumps([asdict(r) for r in rows], indent=1).encode()])
    if args.markdown:
        atomic_write(args.markdown, [(header(argv, rows, time.perf_counter() - started) + report + "\n\n"
                                      + table(rows) + "\n").encode()])
    missing = unchecked(rows, args.kernels or kernel_names(args.family))
    if missing:  # a check that checked nothing must not pass
        print(f"error: nothing {'bound' if args.bind_only else 'compiled'} for {', '.join(missing)}: every case of "
              "it is unsupported or left out by the arguments, so the check checked nothing there", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
