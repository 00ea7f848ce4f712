"""Working precision of the recomputing kernels under mixed precision.

Under ``torch.autocast`` (or with bfloat16 / float16 inputs) the kernels compute in float32 — the row
maxima, exponentials, log-sum-exps and gradient accumulations that keep attention finite for large inputs —
and return results in the inputs' dtype, as fused attention kernels do. Autocast is switched off inside
a kernel, so what it computes does not depend on the surrounding autocast state."""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

import torch

__all__ = ["working_dtype", "in_working_precision"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def working_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype a kernel computes in: the inputs' promoted dtype, raised to float32 from half precision."""
    dtype = reduce(torch.promote_types, (t.dtype for t in tensors))
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def in_working_precision(fn: Callable, *tensors: torch.Tensor, out_dtype: torch.dtype | None = None, **kwargs):
    """``fn(*tensors, **kwargs)`` with floating-point ``tensors`` cast to the working dtype and autocast off; a
    tensor result (or the first element of a tuple result) is cast back to ``out_dtype`` (default: the
    promoted dtype of the inputs)."""
    floats = [t for t in tensors if t is not None and t.is_floating_point()]
    work = working_dtype(*floats)
    out_dtype = out_dtype or reduce(torch.promote_types, (t.dtype for t in floats))
    cast = [t.to(work) if t is not None and t.is_floating_point() else t for t in tensors]
    with torch.autocast(floats[0].device.type, enabled=False):
        result = fn(*cast, **kwargs)
    if isinstance(result, tuple):
        return (result[0].to(out_dtype), *result[1:])
    return result.to(out_dtype)
