"""Measurement: wall time, peak memory and FLOPs of a call; one benchmark point (forward and backward time
measured separately, peak memory); and the machine's matmul rate. The one place the library measures — the
``maskattn bench`` runner, the scripts under ``benchmarks/`` and the tests all call these functions.

Peak memory on CPU is read from PyTorch's own allocator: the call runs inside
``torch.profiler.profile(profile_memory=True)``, which records every allocation and free made through
the CPU allocator — including scratch buffers allocated inside fused kernels — as ``[memory]`` events
with signed byte counts. Their running sum in time order is the live memory allocated by the call;
its maximum is the peak. Tensors that exist before the call (inputs, parameters) are not counted;
everything created during it is (saved activations, temporaries, gradients). On CUDA the peak is
``torch.cuda.max_memory_allocated()`` minus the allocation before the call.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn as nn

__all__ = ["synchronize", "peak_memory_bytes", "time_call", "count_flops", "machine_info", "measure_point",
           "measure_inference", "matmul_gflops_per_s"]


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated by PyTorch while ``fn()`` runs (its return value is dropped inside)."""
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        result = fn()
        synchronize(device)
        del result
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
        del result
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def time_call(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1,
              device: torch.device | str = "cpu") -> dict[str, float]:
    """Median, minimum and maximum wall time (seconds) of ``fn()`` over ``repeats`` runs after ``warmup``."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": repeats}


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of the matrix products in ``fn()`` (forward and backward), counted by
    ``torch.utils.flop_counter.FlopCounterMode``; element-wise work is not counted."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def machine_info(device: torch.device | str = "cpu") -> dict[str, object]:
    """What a benchmark record says about the machine: PyTorch, Python, platform, processor, torch threads, the
    device and, on CUDA, the GPU's name."""
    device = torch.device(device)
    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info

#: Largest output (bytes) of the reference matrix multiply; larger shapes are timed on a part of it
#: (fewer of the B·H matrices), which leaves the rate per FLOP essentially unchanged.
MATMUL_MAX_BYTES = 256 * 2**20


def measure_point(module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, *, repeats: int, warmup: int,
                  device: str) -> dict[str, float | int | None]:
    """Time ``module(x)`` and its backward separately and measure the peak memory of one training step.

    ``x`` ``(B, n, width)`` requires grad; ``grad_out`` has the output's shape and is passed to
    ``backward``. Order: ``warmup`` untimed steps; one step under the memory measurement
    (:func:`peak_memory_bytes`: everything allocated during forward + backward,
    parameter gradients included); ``repeats`` timed forward passes (with autograd recording, as in
    training); then ``repeats`` times: an untimed forward and a timed backward. Times in milliseconds.
    """
    parameters = list(module.parameters())

    def clear_grads():
        x.grad = None
        for p in parameters:
            p.grad = None

    def forward():
        return module(x)

    def step():
        clear_grads()
        forward().backward(grad_out)

    for _ in range(warmup):
        step()
    clear_grads()
    peak = peak_memory_bytes(step, device)
    fwd = time_call(forward, repeats=repeats, warmup=0, device=device)
    bwd = []
    for _ in range(repeats):
        clear_grads()
        out = forward()
        synchronize(device)
        bwd.append(time_call(partial(out.backward, grad_out), repeats=1, warmup=0, device=device)["median_s"])
    clear_grads()
    return {
        "fwd_ms_median": 1e3 * fwd["median_s"], "fwd_ms_min": 1e3 * fwd["min_s"], "fwd_ms_max": 1e3 * fwd["max_s"],
        "bwd_ms_median": 1e3 * statistics.median(bwd), "bwd_ms_min": 1e3 * min(bwd), "bwd_ms_max": 1e3 * max(bwd),
        "peak_bytes": int(peak),
    }


@torch.no_grad()
def measure_inference(module: nn.Module, x: torch.Tensor, *, repeats: int, warmup: int,
                      device: str) -> dict[str, float | int | None]:
    """Time ``module(x)`` under ``torch.no_grad()`` and measure the peak memory of one forward: ``warmup``
    untimed calls, one under the memory measurement, ``repeats`` timed. Times in milliseconds; the backward
    fields are None."""
    x = x.detach()
    for _ in range(warmup):
        module(x)
    peak = peak_memory_bytes(lambda: module(x), device)
    fwd = time_call(lambda: module(x), repeats=repeats, warmup=0, device=device)
    return {"fwd_ms_median": 1e3 * fwd["median_s"], "fwd_ms_min": 1e3 * fwd["min_s"], "fwd_ms_max": 1e3 * fwd["max_s"],
            "bwd_ms_median": None, "bwd_ms_min": None, "bwd_ms_max": None, "peak_bytes": int(peak)}


def matmul_gflops_per_s(matrices: int, n: int, d: int, *, dtype: torch.dtype, device: str,
                        repeats: int = 5) -> float:
    """Measured GFLOP/s of ``torch.bmm`` of ``(matrices, n, d) × (matrices, d, n)`` — the score product of
    attention with ``matrices = B·H`` and ``d = d_h`` — from the *fastest* of ``repeats`` runs after one
    warm-up: the rate this machine reaches for the shape, which a busy machine hides from a median.
    Shapes whose output exceeds :data:`MATMUL_MAX_BYTES` are timed on fewer matrices (and, for very
    long sequences, fewer output columns)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    columns = max(1, min(n, MATMUL_MAX_BYTES // (n * itemsize)))
    matrices = max(1, min(matrices, MATMUL_MAX_BYTES // (n * columns * itemsize)))
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(matrices, n, d, generator=generator).to(device=device, dtype=dtype)  # (M, n, d)
    b = torch.randn(matrices, d, columns, generator=generator).to(device=device, dtype=dtype)  # (M, d, c)
    seconds = time_call(lambda: torch.bmm(a, b), repeats=repeats, warmup=1, device=device)["min_s"]
    return 2 * matrices * n * columns * d / seconds / 1e9
