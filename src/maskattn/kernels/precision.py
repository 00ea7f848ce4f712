"""Working precision of the recomputing kernels under mixed precision.

Under ``torch.autocast`` (or with bfloat16 / float16 inputs) the kernels compute in float32 — the row
maxima, exponentials, log-sum-exps and gradient accumulations that keep attention finite for large inputs —
and return results in the inputs' dtype, as fused attention kernels do. Autocast is switched off inside
a kernel, so what it computes does not depend on the surrounding autocast state.

float32 matrix products: :func:`tf32_matmul` reads whether PyTorch allows TF32 for them — from the precision API of
torch >= 2.9 (``torch.backends.cuda.matmul.fp32_precision``, which inherits ``torch.backends.fp32_precision``) where
it exists, since reading the legacy ``allow_tf32`` raises once a program has used that API; :func:`tf32_matmul_set`
sets it the same way (docs/design.md §3, "Numerics")."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import reduce

import torch

__all__ = ["working_dtype", "in_working_precision", "tf32_matmul", "tf32_matmul_set"]

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


def _new_api() -> bool:
    """Whether this torch has the precision API of torch >= 2.9 (``fp32_precision``)."""
    try:
        torch.backends.cuda.matmul.fp32_precision  # noqa: B018 (an attribute read that may raise)
    except AttributeError:
        return False
    return True


def tf32_matmul() -> bool:
    """Whether float32 matrix products may use TF32 (the ``tl.dot`` precision of the Triton kernels for float32).

    torch >= 2.9: ``torch.backends.cuda.matmul.fp32_precision`` (``"tf32"`` / ``"ieee"``; ``"none"`` inherits
    ``torch.backends.fp32_precision``, and where both are ``"none"`` the legacy flag decides, which can then be read).
    Older torch: ``torch.backends.cuda.matmul.allow_tf32``. Reading ``allow_tf32`` after the new API set TF32 raises
    a ``RuntimeError`` (a mix of the legacy and new APIs), so the new API is read first."""
    matmul = torch.backends.cuda.matmul
    if _new_api():
        precision = matmul.fp32_precision  # the getter resolves "none" to the parent's setting
        if precision == "none":
            precision = getattr(torch.backends, "fp32_precision", "none")
        if precision != "none":
            return precision == "tf32"
        try:
            return bool(matmul.allow_tf32)
        except RuntimeError:  # a mix of the APIs torch refuses to read: IEEE, the safe choice
            return False
    return bool(matmul.allow_tf32)


@contextlib.contextmanager
def tf32_matmul_set(enabled: bool):
    """Inside: float32 matrix products may (``enabled``) or may not use TF32 — set with the API that
    :func:`tf32_matmul` reads (torch >= 2.9: ``fp32_precision``), restored on exit."""
    matmul = torch.backends.cuda.matmul
    if _new_api():
        previous = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = previous
        return
    previous_flag = matmul.allow_tf32
    matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        matmul.allow_tf32 = previous_flag
