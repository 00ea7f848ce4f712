"""The benchmark loop: every selected candidate at every length on every device, one record per point."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn

from ..errors import ArgumentError, ArgumentTypeError
from .costs import Point, estimate_bytes, family_of, forward_flops, step_flops, useful_attention_flops
from ..device import available_memory_bytes, is_out_of_memory
from .measure import count_flops, machine_info, matmul_gflops_per_s, measure_inference, measure_point
from .settings import (
    DTYPES,
    BenchSettings,
    Candidate,
    resolve_devices,
    select_candidates,
)

__all__ = ["run_benchmark", "BenchResult", "FIELDS", "MEMORY_FRACTION", "FALLBACK_BUDGET_GIB"]

#: Default memory budget: this fraction of the memory available on the device when the run starts.
MEMORY_FRACTION = 0.5
#: Budget when the available memory cannot be read (non-Linux CPU).
FALLBACK_BUDGET_GIB = 4.0

#: The fields of one record (CSV columns, JSON record keys), with their meaning.
FIELDS: dict[str, str] = {
    "device": "cpu or cuda",
    "mechanism": "registered mechanism or baseline name",
    "backend": "backend of the mechanism ('torch' for the baselines)",
    "label": "mechanism/backend (the baseline name for baselines); the line label of the plots",
    "kind": "'mechanism' (registered) or 'baseline'",
    "family": "cost model (maskattn.bench.costs): dense, local, tensorized, tensorized_naive, algorithm1, lstm, "
              "cnn, other (no analytic model)",
    "n": "sequence length",
    "batch": "batch size",
    "width": "d_model (input width)",
    "heads": "attention heads",
    "dtype": "float32, float64 or bfloat16",
    "status": "ok, skipped (over the memory budget, or out of memory) or failed (an error; see reason)",
    "reason": "why a point was skipped or failed (empty when ok)",
    "fwd_ms_median": "median forward time (ms), autograd recording",
    "fwd_ms_min": "fastest forward (ms)",
    "fwd_ms_max": "slowest forward (ms)",
    "mode": "train (forward + backward) or inference (forward under no_grad)",
    "compiled": "whether the module ran through torch.compile(fullgraph=True)",
    "bwd_ms_median": "median backward time (ms), forward excluded (empty in inference mode)",
    "bwd_ms_min": "fastest backward (ms)",
    "bwd_ms_max": "slowest backward (ms)",
    "peak_mib": "peak memory allocated by one forward+backward (inference: forward) (MiB), inputs and parameters "
                "excluded",
    "est_mib": "the analytic estimate of that peak used for the budget check (MiB)",
    "gflop": "FLOPs of one forward+backward (inference: forward) (GFLOP)",
    "flop_source": "'analytic' (maskattn.bench.costs) or 'FlopCounterMode' (unmodelled module)",
    "achieved_gflops": "gflop / (fwd_ms_median + bwd_ms_median): achieved GFLOP/s",
    "matmul_gflops": "the machine's dense matmul rate: GFLOP/s of a square matmul (1024 on the CPU, 4096 on CUDA) "
                     "on this device and dtype (fastest of 5), measured once per device",
    "matmul_fraction": "achieved_gflops / matmul_gflops (a fraction of the machine's matmul rate, at most ~1; "
                       "the table prints '–' above 1: the reference was then measured at a busier moment)",
    "attention_tflops": "useful attention TFLOP/s: FLOPs of the attention core over the pairs its mask allows "
                        "(maskattn.bench.costs.useful_attention_flops; causal and directional masks: about half) / "
                        "the step time, projections included in the time (so a lower bound on the kernel's own rate)",
}


@dataclass
class BenchResult:
    """Everything one benchmark run produced: JSON-ready dicts."""

    machine: dict
    settings: dict
    descriptions: dict[str, str]  # label → what the module is
    notes: list[str]
    records: list[dict]
    wall_s: float

    def to_dict(self) -> dict:
        return {"format": "maskattn-bench/1", "machine": self.machine, "settings": self.settings,
                "fields": FIELDS, "descriptions": self.descriptions, "notes": self.notes, "wall_s": self.wall_s,
                "records": self.records}


#: the side of the square matmul whose rate is ``matmul_gflops`` (the machine's dense rate), per device type
REFERENCE_MATMUL = {"cpu": 1024, "cuda": 4096}


def _budget_bytes(settings: BenchSettings, device: str) -> tuple[int, str]:
    """The memory budget on ``device`` and how it was chosen."""
    if settings.mem_budget_gb is not None:
        return int(settings.mem_budget_gb * 2**30), "--mem-budget-gb"
    available = available_memory_bytes(device)
    if available is None:
        return int(FALLBACK_BUDGET_GIB * 2**30), f"fallback {FALLBACK_BUDGET_GIB:g} GiB (available memory unknown)"
    return int(MEMORY_FRACTION * available), f"{MEMORY_FRACTION:g} x available {available / 2**30:.1f} GiB"


def _machine(devices: list[str]) -> dict:
    info = machine_info("cpu")
    info.pop("device")
    info["cpu_count"] = os.cpu_count()
    if hasattr(os, "getloadavg"):
        info["load_average_start"] = list(os.getloadavg())
    if "cuda" in devices:
        info["gpu"] = machine_info("cuda")["gpu"]
    return info


def _build(candidate: Candidate, settings: BenchSettings, device: str, dtype: torch.dtype) -> nn.Module:
    try:
        module = candidate.build()
    except (ValueError, TypeError) as exc:
        raise ArgumentError(f"cannot build {candidate.label} with width={settings.width}, heads={settings.heads}: "
                         f"{exc}") from None
    module = module.to(device=device, dtype=dtype).train(settings.mode == "train")
    return cast(nn.Module, torch.compile(module, fullgraph=True)) if settings.compile else module


def _flops(module: nn.Module, candidate: Candidate, point: Point, x: torch.Tensor,
           grad_out: torch.Tensor | None) -> tuple[int, str]:
    """(FLOPs of one step, source): analytic when modelled, else counted by FlopCounterMode (``grad_out``
    None: a forward under ``no_grad``)."""
    inference = grad_out is None
    flops = (forward_flops if inference else step_flops)(_eager(module), candidate.backend, point)
    if flops is not None:
        return flops, "analytic"

    eager = _eager(module)  # the same math; a compiled module under FlopCounterMode's dispatch would not compile

    def step():
        if inference:
            with torch.no_grad():
                eager(x)
        else:
            eager(x).backward(grad_out)

    flops = count_flops(step)
    module.zero_grad(set_to_none=True)
    x.grad = None
    return flops, "FlopCounterMode"


def _eager(module: nn.Module) -> nn.Module:
    """The module itself of a ``torch.compile`` wrapper (for the cost model)."""
    return getattr(module, "_orig_mod", module)


def _record(candidate, module, point, device, settings, **values) -> dict:
    record = dict.fromkeys(FIELDS)
    record.update(device=device, mechanism=candidate.name, backend=candidate.backend, label=candidate.label,
                  kind=candidate.kind, family=family_of(_eager(module), candidate.backend), n=point.n,
                  batch=point.batch, width=point.width, heads=settings.heads, dtype=settings.dtype, reason="",
                  mode=settings.mode, compiled=settings.compile)
    record.update(values)
    return record


def run_benchmark(settings: BenchSettings, *, log: Callable[[str], None] | None = None,
                  on_length: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """Run the benchmark ``settings`` describe; ``log`` receives progress lines and notes (skipped
    points, pairs left out); ``on_length`` receives the result so far after each sequence length (with a note
    that it is partial), so that a run stopped part-way keeps what it measured. Raises ``ValueError`` before
    measuring anything when a selected module cannot be built with the settings (e.g. ``heads`` too small for
    ``csan2d``)."""
    if not isinstance(settings, BenchSettings):
        raise ArgumentTypeError(f"settings must be a maskattn.bench.BenchSettings, got {type(settings).__name__}")
    say = log or (lambda message: None)
    # the CPU memory measurement runs the profiler once per point; kineto logs each start/stop on stderr
    # at its highest level (USDT, 5) — level 6 keeps the terminal readable (an explicit setting wins)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    started = time.perf_counter()
    devices = resolve_devices(settings.device)
    dtype = DTYPES[settings.dtype]
    machine = _machine(devices)
    notes: list[str] = []
    records: list[dict] = []
    budgets: dict[str, dict] = {}
    descriptions: dict[str, str] = {}
    plans = []
    for device in devices:  # select and build everything first: configuration errors surface before any run
        candidates, left_out = select_candidates(settings, device)
        torch.manual_seed(settings.seed)
        modules = [_build(c, settings, device, dtype) for c in candidates]
        budget, how = _budget_bytes(settings, device)
        budgets[device] = {"gib": budget / 2**30, "source": how}
        notes += left_out
        descriptions.update((c.label, c.description) for c in candidates)
        plans.append((device, candidates, modules, budget))
    for message in notes:
        say(message)

    def result(result_notes: list[str]) -> BenchResult:
        return BenchResult(machine=machine, settings={**settings.to_dict(), "mem_budget": budgets},
                           descriptions=descriptions, notes=result_notes, records=list(records),
                           wall_s=time.perf_counter() - started)

    for device, candidates, modules, budget in plans:
        # one reference rate per device: a square matmul large enough to reach the machine's dense rate (a bmm of
        # the scores' own small shape is dominated by overheads, so modules seemed to run at 65x "the matmul rate")
        size = REFERENCE_MATMUL["cuda" if device.startswith("cuda") else "cpu"]
        matmul = matmul_gflops_per_s(1, size, size, dtype=dtype, device=device)
        for n in settings.lengths:
            point = Point(settings.batch, n, settings.width, dtype)
            started_n = time.perf_counter()
            generator = torch.Generator(device="cpu").manual_seed(settings.seed + n)
            x = torch.randn(point.batch, n, point.width, generator=generator).to(device=device, dtype=dtype)
            x.requires_grad_(True)
            counts = {"ok": 0, "skipped": 0, "failed": 0}
            for candidate, module in zip(candidates, modules):
                record = _run_point(candidate, module, point, x, device, settings, budget, matmul, say)
                counts[record["status"]] += 1
                records.append(record)
            say(f"{device} n={n}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
                + f" ({time.perf_counter() - started_n:.1f} s)")
            del x
            if on_length is not None:
                on_length(result([*notes, f"partial result: {device} measured up to n = {n} of "
                                           f"{list(settings.lengths)}"]))
    if hasattr(os, "getloadavg"):
        machine["load_average_end"] = list(os.getloadavg())
    return result(notes)


def _run_point(candidate, module, point, x, device, settings, budget, matmul, say) -> dict:
    """Measure one (candidate, length) point, or record why it was skipped or failed."""
    estimate = estimate_bytes(_eager(module), candidate.backend, point)
    base = dict(est_mib=estimate / 2**20, matmul_gflops=matmul)
    if estimate > budget:
        reason = f"estimated {estimate / 2**30:.2f} GiB > budget {budget / 2**30:.2f} GiB"
        say(f"skipped {device} {candidate.label} n={point.n}: {reason}")
        return _record(candidate, module, point, device, settings, status="skipped", reason=reason, **base)
    out_width = getattr(_eager(module), "out_dim", point.width)
    generator = torch.Generator(device="cpu").manual_seed(settings.seed)
    grad_out = None if settings.mode == "inference" else \
        torch.randn(point.batch, point.n, out_width, generator=generator).to(device=device, dtype=x.dtype)
    if settings.compile:  # a fresh compilation per point (in the warm-up): no recompile limit across modules
        torch._dynamo.reset()
    try:
        if grad_out is None:
            measured = measure_inference(module, x, repeats=settings.repeats, warmup=settings.warmup, device=device)
        else:
            measured = measure_point(module, x, grad_out, repeats=settings.repeats, warmup=settings.warmup,
                                     device=device)
        flops, source = _flops(module, candidate, point, x, grad_out)
    except (RuntimeError, ValueError) as exc:
        module.zero_grad(set_to_none=True)
        x.grad = None
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if is_out_of_memory(exc):
            reason = f"out of memory: {first_line}"
            say(f"skipped {device} {candidate.label} n={point.n}: {reason}")
            return _record(candidate, module, point, device, settings, status="skipped", reason=reason, **base)
        reason = f"{type(exc).__name__}: {first_line}"
        say(f"FAILED {device} {candidate.label} n={point.n}: {reason}")
        return _record(candidate, module, point, device, settings, status="failed", reason=reason, **base)
    fwd_ms, bwd_ms, peak = measured["fwd_ms_median"], measured["bwd_ms_median"], measured.pop("peak_bytes")
    assert fwd_ms is not None and peak is not None  # every measurement times the forward and its peak memory
    seconds = (fwd_ms + (bwd_ms or 0.0)) / 1e3
    achieved = flops / seconds / 1e9
    useful = useful_attention_flops(_eager(module), point, inference=grad_out is None)
    return _record(candidate, module, point, device, settings, status="ok", **base, **measured,
                   peak_mib=peak / 2**20, gflop=flops / 1e9, flop_source=source, achieved_gflops=achieved,
                   matmul_fraction=achieved / matmul,
                   attention_tflops=None if useful is None else useful / seconds / 1e12)
