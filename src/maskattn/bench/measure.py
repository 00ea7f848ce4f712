"""Measuring one point: forward and backward time (separately), peak memory, and the machine's matmul rate."""

from __future__ import annotations

import statistics
from functools import partial

import torch
import torch.nn as nn

from ..benchmarking import peak_memory_bytes, synchronize, time_call

__all__ = ["measure_point", "matmul_gflops_per_s", "available_bytes", "is_out_of_memory"]

#: Largest output (bytes) of the reference matrix multiply; larger shapes are timed on a part of it
#: (fewer of the B·H matrices), which leaves the rate per FLOP essentially unchanged.
MATMUL_MAX_BYTES = 256 * 2**20


def measure_point(module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, *, repeats: int, warmup: int,
                  device: str) -> dict[str, float | int]:
    """Time ``module(x)`` and its backward separately and measure the peak memory of one training step.

    ``x`` ``(B, n, width)`` requires grad; ``grad_out`` has the output's shape and is passed to
    ``backward``. Order: ``warmup`` untimed steps; one step under the memory measurement
    (:func:`maskattn.benchmarking.peak_memory_bytes`: everything allocated during forward + backward,
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


def available_bytes(device: str) -> int | None:
    """Memory available for new allocations on ``device`` (free GPU memory; the kernel's MemAvailable on
    Linux), or None when it cannot be read."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (CUDA ``OutOfMemoryError`` or a CPU allocator error)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    message = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        text in message for text in ("out of memory", "can't allocate memory", "not enough memory"))
