"""Measurement helpers shared by the benchmark scripts: wall time, peak memory and FLOPs of a call.

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

import torch

__all__ = ["synchronize", "peak_memory_bytes", "time_call", "count_flops", "machine_info"]


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
