"""Where the Triton kernels can run, and the tile sizes they run with — without importing Triton.

Triton compiles the kernels for CUDA devices. Its interpreter (``TRITON_INTERPRET=1`` in the environment
before the kernels are first used) runs the same kernels on CPU tensors with NumPy; the test suite and CI
use it to check every kernel against the float64 references on machines without a GPU. The interpreter is
for tests: ``backend="auto"`` never chooses it (docs/design.md §2).

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so the choice is made once, when the first
kernel module is imported (:func:`load`), and :func:`interpreted` reports that choice afterwards.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from dataclasses import dataclass

import torch

__all__ = ["installed", "missing_reason", "interpreted", "not_interpreted", "load", "device_reason", "dtype_reason",
           "head_dim_reason", "call_reasons", "kernel_dtype", "Tiles", "tiles", "MAX_HEAD_DIM", "next_power_of_2", "cdiv",
           "stride_args", "accumulator", "launch_constants", "placeholder", "device_table"]

#: the widest head (query/key or value features) the kernels take: tiles keep a row of each in registers
MAX_HEAD_DIM = 256
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


def interpreted() -> bool:
    """Whether the kernels run (or, once loaded, will run) under Triton's CPU interpreter."""
    if _describing:
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


def next_power_of_2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


@dataclass(frozen=True)
class Tiles:
    """One launch configuration: ``block_m`` query rows × ``block_n`` keys per tile, ``warps`` and ``stages``
    (software pipelining) of the compiled kernel."""

    block_m: int
    block_n: int
    warps: int
    stages: int


def tiles(head_dim: int, device: str) -> Tiles:
    """The tile sizes for a head of ``head_dim`` features (the wider of the key and value heads).

    Under the interpreter the tiles are small, so that test lengths such as 37 or 70 cross several tiles and
    the masking at tile edges is exercised. On CUDA the sizes follow FlashAttention-2's Triton kernels for the
    head width; they have not been tuned on a GPU yet (docs/gpu.md)."""
    if device != "cuda" or interpreted():
        return Tiles(16, 16, 1, 1)
    if head_dim <= 64:
        return Tiles(64, 64, 4, 3)
    if head_dim <= 128:
        return Tiles(64, 64, 4, 2)
    return Tiles(32, 32, 4, 1)


def stride_args(*tensors: torch.Tensor) -> list[int]:
    """The strides of 4-D tensors, flattened in order (the kernels index (b, h, position, feature))."""
    return [s for t in tensors for s in t.stride()]


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels take their inputs in: the inputs' own, except bfloat16 under the interpreter, whose
    ``tl.dot`` on bfloat16 is wrong (NumPy has no bfloat16): there the wrappers cast to float32 and cast the
    result back, so the CPU tests still run the bfloat16 plumbing (autocast, dtypes of outputs and gradients)."""
    return torch.float32 if dtype == torch.bfloat16 and interpreted() else dtype


def call_reasons(device: str, dtype: torch.dtype, head_dims: dict[str, int]) -> list[str]:
    """The reasons every kernel shares: :func:`device_reason`, :func:`dtype_reason`, :func:`head_dim_reason`."""
    return [r for r in (device_reason(device), dtype_reason(dtype, device), head_dim_reason(**head_dims)) if r]


def cdiv(a: int, b: int) -> int:
    """``⌈a / b⌉`` (the number of tiles)."""
    return -(-a // b)


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The kernels' accumulator dtype for inputs of ``dtype``: float64 for float64, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def launch_constants(q: torch.Tensor, v: torch.Tensor) -> dict:
    """The compile-time constants every kernel takes for queries ``q`` and values ``v``: ``PRECISION`` of
    ``tl.dot`` (float32 operands: IEEE unless ``torch.backends.cuda.matmul.allow_tf32``; ignored for half
    precision), ``ACC`` (the accumulator type), ``FAST`` (the hardware sigmoid: CUDA, half precision, no
    interpreter) and the padded head widths ``BLOCK_DK``, ``BLOCK_DV`` (powers of two, at least 16)."""
    half = q.dtype in (torch.float16, torch.bfloat16)
    precision = "tf32" if half or (q.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32) else "ieee"
    return dict(PRECISION=precision,
                ACC=load("jit_helpers").accumulator_type(str(accumulator(q.dtype)).removeprefix("torch.")),
                FAST=q.device.type == "cuda" and not interpreted() and half,
                BLOCK_DK=max(16, next_power_of_2(q.shape[-1])), BLOCK_DV=max(16, next_power_of_2(v.shape[-1])))


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
