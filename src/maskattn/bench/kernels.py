"""Kernel-only TFLOP/s at flash-attn's benchmark shapes: maskattn's Triton kernels beside SDPA's flash kernel,
FlexAttention with the nearest mask and the FlashAttention-2-class anchor (``benchmarks/anchor_attention.py``).

``python -m maskattn.bench.kernels OUT [--budget S]`` (one CUDA GPU; ``scripts/gpu_check.py`` runs it as its part
"kernel TFLOP/s"). The conventions are flash-attn's (``benchmarks/benchmark_flash_attention.py``), so the rows
read beside published tables:

* **shapes** (:func:`plan`): bfloat16, ``batch · n = 16,384`` tokens and ``H · d = 2,048`` (H = 32 at d = 64, 16
  at d = 128), n = 512 … 16,384; inputs already projected, in each kernel's own layout (maskattn's kernels and
  SDPA: ``(B, n, H, d)`` viewed as ``(B, H, n, d)``, as the attention layers make them; the anchor and flex:
  contiguous ``(B, H, n, d)``);
* **FLOPs** (:func:`forward_flops`): forward ``4 · B · H · d`` per score — ``n²`` scores, ``n² / 2`` for a causal
  or directional mask (flash-attn halves), the in-band positions for a band (:func:`band_scores`); backward 2.5×,
  forward + backward 3.5× (:data:`PASS_FACTORS`). A maskattn row counts the FLOPs of the attention it replaces,
  not its own: MTSA's forward computes ``Σ w·E`` beside ``Σ w·v·E`` (6 d FLOPs per score, not 4 d) and DMAN's
  backward also reduces the gate's gradients, which the TFLOP/s do not credit — so TFLOP/s compare like times;
* **timing** (:func:`measure`): CUDA events around each call, median over repetitions after a warm-up call
  (compilation) and a timed estimate; forward with autograd recording (a training forward), forward + backward
  (``torch.autograd.grad``) timed as one call; backward = their difference. MTSA rows time the public entry point
  :func:`~maskattn.kernels.triton.tensorized.tensorized_triton`, whose per-element PyTorch work (``E = exp(S −
  c)``, ``v ⊙ E``, casts) runs outside the kernels and is included.

Rows are measured in :func:`plan`'s order — the offline prediction's lengths (2,048 and 16,384) first, flex
last (each of its masks compiles for tens of seconds) — within ``--budget`` seconds (:func:`run`): a row is started
only when its estimate (:func:`estimate_s`) fits, each is appended to ``OUT/rows.jsonl`` as soon as it is measured,
and the rows not measured are named as not reached (:func:`load`). ``OUT/kernels.md`` is the table
(:func:`render`), with the measured ratio to the anchor beside ``docs/gpu/offline-perf.json``'s predicted one
(:func:`offline_comparison`) where that file exists. ``--smoke``: the whole path on the CPU at toy sizes (the
Triton kernels under ``TRITON_INTERPRET=1``; flex forward only: PyTorch has no flex backward on the CPU).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

__all__ = ["Kernel", "KERNELS", "Settings", "Case", "PASS_FACTORS", "COMPILE_S", "band_scores", "scores",
           "forward_flops", "tflops", "shape", "plan", "reps_for", "estimate_s", "finish_row", "run", "measure",
           "load", "with_ratios", "offline_comparison", "render", "main"]

#: FLOPs of each pass as a multiple of the forward's (flash-attn's convention)
PASS_FACTORS = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
#: seconds a row's first call may take to compile, per implementation (its first row of a head width is
#: estimated at this; later rows from the measured time): Triton's three to four passes, torch.compile of flex
#: forward and backward, and of its block mask
COMPILE_S = {"sdpa": 2.0, "anchor": 10.0, "triton": 10.0, "flex": 40.0}
#: seconds of a row besides its calls (inputs, block masks)
SETUP_S = 0.5
#: entries of DMAN's distance table P: 2 D + 1 with D = 128 (as the offline report's "full, D = 128")
DMAN_MAX_DISTANCE = 128


@dataclass(frozen=True)
class Kernel:
    """A row kind: ``impl`` (``sdpa``, ``anchor``, ``triton``, ``flex``) under a mask. ``variant``: the maskattn
    computation a Triton row runs or a flex row stands for (``mtsa_layer``, ``dman``, ``mtsa_head``,
    ``mtsa_window_head``, ``band``, ``band_narrow``; None for SDPA and the anchor). ``counted``: the scores its
    FLOPs count (``full``, ``causal`` or ``band``, with ``band`` = ``(left, right)``); ``reference``: the mask of the
    SDPA / anchor row its time is divided by (``full`` or ``causal``)."""

    name: str
    impl: str
    mask: str
    counted: str = "full"
    band: tuple[int, int] | None = None
    variant: str | None = None
    reference: str = "full"

    @property
    def family(self) -> str | None:
        """The family of ``docs/gpu/offline-perf.json`` this row measures (Triton rows only)."""
        return self.variant if self.impl == "triton" else None


def _variants() -> list[Kernel]:
    maskattn = [
        Kernel("mtsa_layer", "triton", "MTSA layer: forward / backward heads, σ", variant="mtsa_layer"),
        Kernel("dman", "triton", "DMAN gate, D = 128", variant="dman"),
        Kernel("mtsa_head", "triton", "directional j < i, σ", "causal", variant="mtsa_head", reference="causal"),
        Kernel("mtsa_window_head", "triton", "window(3), σ", "band", (3, 3), "mtsa_window_head", "causal"),
        Kernel("band", "triton", "band 129 (SMAN-like)", "band", (64, 64), "band", "causal"),
        Kernel("band_narrow", "triton", "band 11 (CSAN window 11)", "band", (5, 5), "band_narrow", "causal"),
    ]
    return maskattn + [replace(k, name=f"flex_{k.variant}", impl="flex") for k in maskattn]


#: every row kind, in the order of a length's rows: SDPA flash and the anchor (non-causal, causal), maskattn's
#: kernels, then FlexAttention with the nearest mask of each
KERNELS: tuple[Kernel, ...] = (
    Kernel("sdpa_flash", "sdpa", "none"),
    Kernel("sdpa_flash_causal", "sdpa", "causal", "causal", reference="causal"),
    Kernel("anchor", "anchor", "none"),
    Kernel("anchor_causal", "anchor", "causal", "causal", reference="causal"),
    *_variants(),
)
_BY_NAME = {k.name: k for k in KERNELS}


@dataclass(frozen=True)
class Settings:
    """What :func:`plan` measures and how long each measurement runs: head widths, lengths (``first``: measured
    before the others), tokens per batch (``B · n``), model width (``H · d``); repetitions chosen so that one
    measurement takes about ``target_ms`` (within ``min_reps`` … ``max_reps``)."""

    dims: tuple[int, ...] = (64, 128)
    lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    first: tuple[int, ...] = (2048, 16384)
    tokens: int = 16384
    hidden: int = 2048
    kernels: tuple[str, ...] = tuple(k.name for k in KERNELS)
    target_ms: float = 100.0
    min_reps: int = 5
    max_reps: int = 30

    @classmethod
    def smoke(cls) -> Settings:
        """Toy sizes for the CPU (the command's path, not a measurement): d = 16, n = 16, B = H = 2, one call."""
        return cls(dims=(16,), lengths=(16,), first=(16,), tokens=32, hidden=32, target_ms=0.0, min_reps=1,
                   max_reps=1)


@dataclass(frozen=True)
class Case:
    """One row to measure: a kernel at head width ``d``, length ``n``, batch ``B`` and ``H`` heads."""

    kernel: Kernel
    d: int
    n: int
    B: int
    H: int

    @property
    def key(self) -> tuple[str, int, int]:
        return self.kernel.name, self.d, self.n


# --------------------------------------------------------------------------------------------------------------
# arithmetic
# --------------------------------------------------------------------------------------------------------------

def band_scores(n: int, left: int, right: int) -> int:
    """Positions ``(i, j)`` of an ``n × n`` score matrix with ``i − left <= j <= i + right`` (``left, right >=
    0``): ``n (l + r + 1) − l (l + 1) / 2 − r (r + 1) / 2`` with the sides clipped to ``n − 1``."""
    l, r = min(left, n - 1), min(right, n - 1)
    return n * (l + r + 1) - l * (l + 1) // 2 - r * (r + 1) // 2


def scores(kernel: Kernel, n: int) -> float:
    """The scores ``kernel``'s FLOPs count per (batch, head) at length ``n``: ``n²``, ``n² / 2`` (causal, as
    flash-attn counts it), or the band's positions."""
    if kernel.counted == "band":
        assert kernel.band is not None
        return float(band_scores(n, *kernel.band))
    return n * n / 2 if kernel.counted == "causal" else float(n * n)


def forward_flops(case: Case) -> float:
    """Forward FLOPs by flash-attn's convention: ``4 · B · H · d`` per counted score (:func:`scores`)."""
    return 4.0 * case.B * case.H * case.d * scores(case.kernel, case.n)


def tflops(flops: float, ms: float | None) -> float | None:
    """TFLOP/s of ``flops`` done in ``ms`` milliseconds (None without a positive time)."""
    return None if ms is None or ms <= 0 else flops / (ms * 1e-3) / 1e12


def shape(d: int, n: int, settings: Settings) -> tuple[int, int]:
    """``(B, H)`` of flash-attn's shapes: ``B = tokens // n`` (at least 1), ``H = hidden // d``."""
    return max(1, settings.tokens // n), max(1, settings.hidden // d)


def plan(settings: Settings) -> list[Case]:
    """The rows in the order they are measured: every kernel but flex at the ``first`` lengths, then at the other
    lengths, then flex at the ``first`` lengths and the others; within each, head width by head width (a head
    width's kernels compile once), length by length, kernels in :data:`KERNELS`' order."""
    kernels = [_BY_NAME[name] for name in settings.kernels]
    first = [n for n in settings.lengths if n in settings.first]
    rest = [n for n in settings.lengths if n not in settings.first]
    cases = []
    for flex in (False, True):
        for lengths in (first, rest):
            for d in settings.dims:
                for n in lengths:
                    cases += [Case(k, d, n, *shape(d, n, settings)) for k in kernels if (k.impl == "flex") == flex]
    return cases


def reps_for(step_ms: float, settings: Settings) -> int:
    """Repetitions of a call that takes ``step_ms``: about ``target_ms`` in all, within the settings' bounds."""
    wanted = settings.target_ms / step_ms if step_ms > 0 else settings.max_reps
    return int(min(settings.max_reps, max(settings.min_reps, round(wanted))))


def estimate_s(case: Case, settings: Settings, known: tuple[Case, float] | None) -> float:
    """Seconds :func:`measure` will take for ``case``: with ``known`` = (an earlier case of the same kernel and
    head width, its forward + backward ms), that time scaled by the FLOPs, over the warm-up, the estimate and the
    repetitions (forward ≈ forward + backward / 3.5); without, :data:`COMPILE_S` of its implementation."""
    if known is None:
        return COMPILE_S[case.kernel.impl] + SETUP_S
    earlier, step_ms = known
    step_ms *= forward_flops(case) / forward_flops(earlier)
    reps = reps_for(step_ms, settings)
    return SETUP_S + ((2 + reps) * step_ms + reps * step_ms / PASS_FACTORS["fwd_bwd"]) / 1e3


def finish_row(case: Case, fwd_ms: float | None, fwd_bwd_ms: float | None, **extra: Any) -> dict:
    """The record of a measured case: its identity, the three times (backward = forward + backward − forward)
    and their TFLOP/s by :data:`PASS_FACTORS`; ``extra`` (status, reps, seconds …) added as they are."""
    k = case.kernel
    bwd_ms = None if fwd_ms is None or fwd_bwd_ms is None else fwd_bwd_ms - fwd_ms
    flops = forward_flops(case)
    row = {"kernel": k.name, "impl": k.impl, "variant": k.variant, "family": k.family, "mask": k.mask,
           "counted": k.counted if k.band is None else f"band {k.band[0] + k.band[1] + 1}", "reference": k.reference,
           "d": case.d, "n": case.n, "B": case.B, "H": case.H, "fwd_flops": flops,
           "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "fwd_bwd_ms": fwd_bwd_ms}
    for name, ms in (("fwd", fwd_ms), ("bwd", bwd_ms), ("fwd_bwd", fwd_bwd_ms)):
        row[f"{name}_tflops"] = tflops(flops * PASS_FACTORS[name], ms)
    return {**row, "status": "ok", **extra}


# --------------------------------------------------------------------------------------------------------------
# the budget
# --------------------------------------------------------------------------------------------------------------

def run(cases: Sequence[Case], settings: Settings, *, budget_s: float, measure_case: Callable[[Case], dict],
        clock: Callable[[], float] = time.perf_counter, write: Callable[[dict], None] | None = None) -> list[dict]:
    """Measure ``cases`` in order within ``budget_s`` seconds of ``clock``: a case is started only when
    :func:`estimate_s` fits in what is left (else it is passed over: :func:`load` names it as not reached), each
    record goes to ``write`` at once; after a failure the same kernel and head width is not tried again (recorded
    as ``skipped``)."""
    start = clock()
    known: dict[tuple[str, int], tuple[Case, float]] = {}
    failed: dict[tuple[str, int], int] = {}
    rows = []
    for case in cases:
        key = (case.kernel.name, case.d)
        if key in failed:
            row = finish_row(case, None, None, status="skipped", message=f"failed at n = {failed[key]}")
        elif estimate_s(case, settings, known.get(key)) > budget_s - (clock() - start):
            continue
        else:
            row = measure_case(case)
            if row["status"] == "ok":
                known[key] = (case, row["fwd_bwd_ms"] if row["fwd_bwd_ms"] is not None else row["fwd_ms"])
            else:
                failed[key] = case.n
        rows.append(row)
        if write is not None:
            write(row)
    return rows


# --------------------------------------------------------------------------------------------------------------
# the calls
# --------------------------------------------------------------------------------------------------------------

def _load_anchor(path: Path):
    """``benchmarks/anchor_attention.py`` (or ``path``) as the module ``anchor_attention``, imported once."""
    if "anchor_attention" not in sys.modules:
        spec = importlib.util.spec_from_file_location("anchor_attention", path)
        if spec is None or spec.loader is None or not Path(path).is_file():
            raise FileNotFoundError(f"no anchor kernel at {path} (pass --anchor benchmarks/anchor_attention.py)")
        module = importlib.util.module_from_spec(spec)
        sys.modules["anchor_attention"] = module
        spec.loader.exec_module(module)
    return sys.modules["anchor_attention"]


def _tensor(case: Case, device, dtype, layout: str, grad: bool = True) -> torch.Tensor:
    """A ``(B, H, n, d)`` operand: ``projection`` — a ``(B, n, H, d)`` tensor with its heads transposed (the
    attention layers' and flash-attn's layout); ``contiguous`` — ``(B, H, n, d)`` in memory."""
    B, H, n, d = case.B, case.H, case.n, case.d
    t = torch.randn(B, n, H, d, device=device, dtype=dtype).transpose(1, 2) if layout == "projection" \
        else torch.randn(B, H, n, d, device=device, dtype=dtype)
    return t.requires_grad_(grad)


def _dman_parameters(case: Case, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DMAN's ``a`` ``(B, n)``, ``P`` ``(2 D + 1,)`` and ``U`` ``(H,)``: float32 parameters, trained."""
    return (torch.randn(case.B, case.n, device=device).requires_grad_(),
            torch.randn(2 * DMAN_MAX_DISTANCE + 1, device=device).requires_grad_(),
            torch.randn(case.H, device=device).requires_grad_())


def _mtsa_bands(variant: str, H: int) -> list[tuple[float, float]]:
    """Per-head ``(left, right)`` bands of an MTSA row: a layer's forward | backward heads with the diagonal
    (:func:`maskattn.attention.mtsa.directional_head_masks`), a directional head ``j < i``, a window(3) head."""
    if variant == "mtsa_layer":
        return [(math.inf, 0)] * (H // 2) + [(0, math.inf)] * (H - H // 2)
    return [(math.inf, -1)] * H if variant == "mtsa_head" else [(3, 3)] * H


def _triton_call(case: Case, device, dtype):
    from ..kernels.triton.band import band_triton
    from ..kernels.triton.dman import dman_triton
    from ..kernels.triton.tensorized import tensorized_triton

    variant = case.kernel.variant
    q, k, v = (_tensor(case, device, dtype, "projection") for _ in range(3))
    if variant == "dman":
        a, table, u = _dman_parameters(case, device)
        return (lambda: dman_triton(q, k, v, a, table, u, causal=False, key_padding_mask=None, q_offset=0,
                                    dropout_p=0.0, mask_floor=None)), (q, k, v, a, table, u)
    if variant in ("band", "band_narrow"):
        left, right = case.kernel.band or (0, 0)
        return (lambda: band_triton(q, k, v, left, right, None, None, None, case.d ** -0.5, False, 0.0)), (q, k, v)
    s2t = _tensor(case, device, dtype, "projection")
    bands = _mtsa_bands(str(variant), case.H)
    return (lambda: tensorized_triton(q, k, v, s2t, bands, None, scale="log_sigmoid", dropout_p=0.0)[0]), \
        (q, k, v, s2t)


@functools.cache
def _compiled_flex():
    """``flex_attention`` compiled with dynamic shapes (one compilation per mask and head width, not per length;
    Dynamo's limit raised past the rows' masks)."""
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(flex_attention, dynamic=True)


def _flex_call(case: Case, device, dtype):
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cuda = torch.device(device).type == "cuda"
    if cuda:
        flex = _compiled_flex()
    else:
        def flex(*args, **kwargs):  # the CPU's reference flex_attention (toy sizes: --smoke)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
                return flex_attention(*args, **kwargs)
    variant, H, half = str(case.kernel.variant), case.H, case.H // 2
    q, k, v = (_tensor(case, device, dtype, "contiguous", grad=cuda) for _ in range(3))
    inputs: tuple[torch.Tensor, ...] = (q, k, v)
    score_mod: Any = None
    mask_mod: Any = None
    if variant == "dman":
        a, table, u = _dman_parameters(case, device)
        if cuda:
            inputs = (q, k, v, a, table, u)
        else:  # flex on the CPU: forward only, on tensors that do not require gradients
            a, table, u = a.detach(), table.detach(), u.detach()
        D = DMAN_MAX_DISTANCE

        def score_mod(s, b, h, qi, kv):
            return s + F.logsigmoid(a[b, qi] + table[(qi - kv).clamp(-D, D) + D] + u[h])
    else:
        if variant.startswith("mtsa"):
            def score_mod(s, b, h, qi, kv):
                return F.logsigmoid(s)
        if variant == "mtsa_layer":
            def mask_mod(b, h, qi, kv):
                return torch.where(h < half, kv <= qi, kv >= qi)
        elif variant == "mtsa_head":
            def mask_mod(b, h, qi, kv):
                return kv < qi
        else:
            left, right = case.kernel.band or (0, 0)

            def mask_mod(b, h, qi, kv):
                return (kv >= qi - left) & (kv <= qi + right)
    block = None if mask_mod is None else create_block_mask(
        mask_mod, None, H if variant == "mtsa_layer" else None, case.n, case.n, device=device, _compile=cuda)

    return (lambda: flex(q, k, v, score_mod=score_mod, block_mask=block)), (inputs if cuda else ())


def _call(case: Case, device, dtype, anchor: Path):
    """``(call, inputs)``: ``call()`` runs ``case``'s forward and returns its output; ``inputs`` are the tensors
    whose gradients backward computes (none: forward only — flex on the CPU)."""
    impl = case.kernel.impl
    if impl == "sdpa":
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (_tensor(case, device, dtype, "projection") for _ in range(3))
        causal = case.kernel.counted == "causal"

        def call():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return call, (q, k, v)
    if impl == "anchor":
        module = _load_anchor(anchor)
        q, k, v = (_tensor(case, device, dtype, "contiguous") for _ in range(3))
        causal = case.kernel.counted == "causal"
        return (lambda: module.attention(q, k, v, causal)), (q, k, v)
    return _triton_call(case, device, dtype) if impl == "triton" else _flex_call(case, device, dtype)


def _times_ms(fn: Callable[[], object], reps: int, device) -> list[float]:
    """Milliseconds of each of ``reps`` calls: CUDA events around each (queued back to back, one synchronisation
    at the end) on a GPU, the wall clock (synchronised) elsewhere."""
    if torch.device(device).type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        fn()
        times.append((time.perf_counter() - begin) * 1e3)
    return times


def measure(case: Case, settings: Settings, *, device="cuda", dtype=torch.bfloat16,
            anchor: Path = Path("benchmarks/anchor_attention.py")) -> dict:
    """Time ``case``: one call forward + backward (compiles; its wall time is ``first_call_s``), one timed to
    choose the repetitions (:func:`reps_for`), then the medians of the forward alone and of forward + backward
    (:func:`finish_row`). A failure is recorded (status ``error``, the exception's first line), not raised."""
    started = time.perf_counter()
    try:
        call, inputs = _call(case, device, dtype, anchor)

        first = time.perf_counter()
        out = call()
        grad_out = torch.randn_like(out)
        if inputs:
            torch.autograd.grad(out, inputs, grad_out)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        first_call_s = time.perf_counter() - first
        del out

        def step():
            result = call()
            if inputs:
                torch.autograd.grad(result, inputs, grad_out)
        reps = settings.min_reps if settings.min_reps >= settings.max_reps else \
            reps_for(_times_ms(step, 1, device)[0], settings)
        fwd_ms = statistics.median(_times_ms(call, reps, device))
        step_ms = statistics.median(_times_ms(step, reps, device)) if inputs else None
        row = finish_row(case, fwd_ms, step_ms, reps=reps, first_call_s=round(first_call_s, 3),
                         message="" if inputs else "forward only: no flex backward on the CPU")
    except Exception as exc:  # noqa: BLE001 - a failing kernel is a row of the report, not the end of the run
        message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        row = finish_row(case, None, None, status="error", message=message[:300])
    finally:
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    row["wall_s"] = round(time.perf_counter() - started, 3)
    return row


# --------------------------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------------------------

def load(folder: Path, offline: Path | None = None) -> dict:
    """What a run left in ``folder`` (complete or stopped): its plan (``plan.json``), every row of ``rows.jsonl``
    (a truncated last line is dropped), the planned rows not measured (``not_reached``), and, when ``offline``
    (``docs/gpu/offline-perf.json``) exists, :func:`offline_comparison` on the run's device architecture."""
    folder = Path(folder)
    if not (folder / "plan.json").exists():
        return {"rows": [], "not_reached": [], "planned": 0, "comparison": [], "offline": None}
    meta = json.loads((folder / "plan.json").read_text(encoding="utf-8"))
    rows = []
    if (folder / "rows.jsonl").exists():
        for line in (folder / "rows.jsonl").read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    done = {(r["kernel"], r["d"], r["n"]) for r in rows}
    not_reached = [p for p in meta["plan"] if (p["kernel"], p["d"], p["n"]) not in done]
    rows = with_ratios(rows)
    comparison = []
    if offline is not None and Path(offline).is_file():
        comparison = offline_comparison(rows, json.loads(Path(offline).read_text(encoding="utf-8")),
                                        meta.get("arch"), {(p["kernel"], p["d"], p["n"]) for p in meta["plan"]})
    return {**{k: v for k, v in meta.items() if k != "plan"}, "planned": len(meta["plan"]), "rows": rows,
            "not_reached": not_reached, "comparison": comparison,
            "offline": None if offline is None or not Path(offline).is_file() else str(offline)}


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row with ``vs_sdpa`` and ``vs_anchor``: its forward + backward time over that of SDPA flash / the
    anchor with its reference mask (non-causal or causal) at the same d and n (None where either is missing;
    forward over forward where a row has no backward)."""
    def ratio(row, ref):
        mine = "fwd_bwd_ms" if row["fwd_bwd_ms"] is not None else "fwd_ms"
        measured = row["status"] == "ok" and ref is not None and row[mine] and ref[mine]
        return row[mine] / ref[mine] if measured else None

    ok = {(r["kernel"], r["d"], r["n"]): r for r in rows if r["status"] == "ok"}
    out = []
    for row in rows:
        row = dict(row)
        for column, base in (("vs_sdpa", "sdpa_flash"), ("vs_anchor", "anchor")):
            ref = ok.get((base + ("_causal" if row["reference"] == "causal" else ""), row["d"], row["n"]))
            row[column] = ratio(row, ref)
        out.append(row)
    return out


def _anchor_mask(text: str | None, family: str | None) -> str:
    """``full`` or ``causal`` from an offline row's ``anchor_mask`` (``non-causal``, ``full``, ``causal`` …);
    otherwise the family's own reference (:data:`KERNELS`)."""
    text = (text or "").lower()
    if "non" in text or "full" in text:
        return "full"
    if "causal" in text:
        return "causal"
    return _BY_NAME[family].reference if family is not None and family in _BY_NAME else "full"


def _arch(value: Any) -> int | None:
    """An architecture as an int: ``90``, ``"90"`` and ``"sm_90"`` alike (None if it is none of these)."""
    try:
        return int(str(value).removeprefix("sm_"))
    except ValueError:
        return None


def offline_comparison(rows: list[dict], offline: list[dict], arch: int | None,
                       planned: set[tuple[str, int, int]] | None = None) -> list[dict]:
    """The measured forward + backward ratio (maskattn kernel / anchor with the offline row's ``anchor_mask``)
    beside each ``docs/gpu/offline-perf.json`` row of a planned (family, d, n) — ``planned``, default the rows'
    own — on this architecture (every architecture when ``arch`` is None), with measured / predicted (None where
    either time is missing)."""
    ok = {(r["kernel"], r["d"], r["n"]): r for r in rows if r["status"] == "ok" and r["fwd_bwd_ms"]}
    planned = planned if planned is not None else {(r["kernel"], r["d"], r["n"]) for r in rows}
    out = []
    for p in offline:
        family, d, n = p.get("family"), p.get("d"), p.get("n")
        if (family, d, n) not in planned or (arch is not None and _arch(p.get("arch")) != arch):
            continue
        mask = _anchor_mask(p.get("anchor_mask"), family)
        mine, ref = ok.get((family, d, n)), ok.get(("anchor" + ("_causal" if mask == "causal" else ""), d, n))
        measured = mine["fwd_bwd_ms"] / ref["fwd_bwd_ms"] if mine and ref else None
        predicted = p.get("predicted_ratio")
        out.append({"family": family, "d": d, "n": n, "arch": p.get("arch"), "anchor_mask": mask,
                    "predicted_ratio": predicted, "measured_ratio": measured, "bound": p.get("bound"),
                    "measured_over_predicted": measured / predicted if measured and predicted else None})
    return out


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _ranges(items: list[dict]) -> list[str]:
    """``kernel d: n, n, …`` per kernel and head width of plan entries."""
    grouped: dict[tuple[str, int], list[int]] = {}
    for p in items:
        grouped.setdefault((p["kernel"], p["d"]), []).append(p["n"])
    return [f"{name} d {d}: n {', '.join(str(n) for n in sorted(ns))}" for (name, d), ns in grouped.items()]


def render(summary: dict, heading: str = "##") -> str:
    """The markdown section of a :func:`load` summary: the conventions, one table row per measured row (ordered
    by head width, kernel and length), the rows not reached, failures, and the offline comparison."""
    rows, order = summary["rows"], {k.name: i for i, k in enumerate(KERNELS)}
    lines = [f"{heading} Kernel TFLOP/s at flash-attn's shapes", "",
             f"bf16, B·n = {_count(summary.get('tokens'))} tokens, H·d = {_count(summary.get('hidden'))}; kernel only "
             "(inputs already projected). Median ms (CUDA events, after a warm-up call); backward = forward + "
             "backward − forward. TFLOP/s by flash-attn's convention: forward 4·B·H·d per score — n², n²/2 causal "
             "or directional, the in-band positions for a band — backward 2.5×, forward + backward 3.5×; a maskattn "
             "row counts the attention it replaces (MTSA's second product, DMAN's gate gradients not credited). "
             "× SDPA / × anchor: forward + backward time over SDPA flash's / the anchor's with the row's reference "
             "mask (non-causal, or causal for directional, windowed and banded masks). "
             f"{len(rows)} of {summary['planned']} rows measured.", "",
             "| kernel | mask | d | n | B×H | fwd ms | bwd ms | fwd+bwd ms | fwd TFLOP/s | bwd TFLOP/s | "
             "fwd+bwd TFLOP/s | × SDPA flash | × anchor |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["d"], order.get(r["kernel"], 99), r["n"])):
        if r["status"] != "ok":
            continue
        lines.append(f"| {r['kernel']} | {r['mask']} | {r['d']} | {r['n']} | {r['B']}×{r['H']} | "
                     f"{_num(r['fwd_ms'], 3)} | {_num(r['bwd_ms'], 3)} | {_num(r['fwd_bwd_ms'], 3)} | "
                     f"{_num(r['fwd_tflops'], 1)} | {_num(r['bwd_tflops'], 1)} | {_num(r['fwd_bwd_tflops'], 1)} | "
                     f"{_num(r['vs_sdpa'])} | {_num(r['vs_anchor'])} |")
    lines.append("")
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["Failed or skipped:", ""] + [f"- {r['kernel']} d {r['d']} n {r['n']}: {r['status']}: "
                                               f"{r['message']}" for r in failed] + [""]
    notes = [r for r in rows if r["status"] == "ok" and r.get("message")]
    lines += [f"- {r['kernel']} d {r['d']} n {r['n']}: {r['message']}" for r in notes] + ([""] if notes else [])
    firsts: dict[tuple[str, int], float] = {}
    for r in rows:
        if r["status"] == "ok" and r.get("first_call_s") is not None and (r["kernel"], r["d"]) not in firsts:
            firsts[(r["kernel"], r["d"])] = r["first_call_s"]
    if firsts:
        lines += ["First call (compilation included), s: " + "; ".join(
            f"{name} d {d} {seconds:.1f}" for (name, d), seconds in firsts.items()) + ".", ""]
    if summary["not_reached"]:
        count = len(summary["not_reached"])
        lines += [f"Not reached within the budget ({count} row{'s' if count != 1 else ''}): "
                  + "; ".join(_ranges(summary["not_reached"])) + ".", ""]
    if summary.get("offline"):
        lines += [f"{heading}# Against the offline prediction ({summary['offline']})", "",
                  "Forward + backward time, maskattn kernel / anchor, measured beside predicted "
                  f"(architecture sm_{summary.get('arch') or '?'}).", "",
                  "| family | d | n | anchor mask | predicted | measured | measured / predicted | bound |",
                  "|---|---:|---:|---|---:|---:|---:|---|"]
        for c in summary["comparison"]:
            lines.append(f"| {c['family']} | {c['d']} | {c['n']} | {c['anchor_mask']} | "
                         f"{_num(c['predicted_ratio'])} | {_num(c['measured_ratio'])} | "
                         f"{_num(c['measured_over_predicted'])} | {c['bound'] or '–'} |")
        lines.append("")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------------------------

def _csv(text: str, cast=int) -> tuple:
    return tuple(cast(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    """``python -m maskattn.bench.kernels OUT``: measure :func:`plan`'s rows within ``--budget`` seconds and write
    ``OUT/plan.json``, ``OUT/rows.jsonl`` (as it goes), ``OUT/kernels.json`` and ``OUT/kernels.md``. Exit code 2
    without CUDA (unless ``--smoke``), 1 when a row failed, else 0."""
    started = time.perf_counter()
    parser = argparse.ArgumentParser(prog="python -m maskattn.bench.kernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder for plan.json, rows.jsonl, kernels.json and kernels.md")
    parser.add_argument("--budget", type=float, default=90.0, help="seconds for the whole run (default 90)")
    parser.add_argument("--dims", help="head widths, comma-separated (default 64,128)")
    parser.add_argument("--lengths", help="sequence lengths, comma-separated (default 512,…,16384)")
    parser.add_argument("--kernels", help=f"row kinds, comma-separated (default all: {', '.join(_BY_NAME)})")
    parser.add_argument("--anchor", type=Path, default=Path(os.environ.get("MASKATTN_ANCHOR",
                                                                           "benchmarks/anchor_attention.py")),
                        help="the anchor kernel's file (default benchmarks/anchor_attention.py, or $MASKATTN_ANCHOR)")
    parser.add_argument("--offline", type=Path, default=Path("docs/gpu/offline-perf.json"),
                        help="the offline prediction to compare with, when it exists")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (tests the command)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("maskattn.bench.kernels: no CUDA device; use --smoke to run the path on the CPU", file=sys.stderr)
        return 2
    settings = Settings.smoke() if args.smoke else Settings()
    unknown = set(_csv(args.kernels, str) if args.kernels else ()) - set(_BY_NAME)
    if unknown:
        parser.error(f"unknown kernels {sorted(unknown)}; expected some of {', '.join(_BY_NAME)}")
    if args.dims:
        settings = replace(settings, dims=_csv(args.dims))
    if args.lengths:
        settings = replace(settings, lengths=_csv(args.lengths))
    if args.kernels:
        settings = replace(settings, kernels=_csv(args.kernels, str))
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the first kernel (and the anchor) loads
    from .measure import machine_info

    info: dict[str, Any] = machine_info(device)
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        info["arch"] = 10 * major + minor
    cases = plan(settings)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {**info, "tokens": settings.tokens, "hidden": settings.hidden, "settings": asdict(settings),
            "budget_s": args.budget, "plan": [{"kernel": c.kernel.name, "d": c.d, "n": c.n} for c in cases]}
    (args.out / "plan.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    with open(args.out / "rows.jsonl", "w", encoding="utf-8") as sink:
        def write(row: dict) -> None:
            sink.write(json.dumps(row) + "\n")
            sink.flush()
        rows = run(cases, settings, budget_s=args.budget - (time.perf_counter() - started), write=write,
                   measure_case=lambda case: measure(case, settings, device=device, anchor=args.anchor))
    summary = load(args.out, args.offline)
    (args.out / "kernels.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    (args.out / "kernels.md").write_text(render(summary, "#"), encoding="utf-8")
    print(f"wrote {args.out / 'kernels.md'}: {len(rows)} of {len(cases)} rows")
    return 1 if any(r["status"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
