"""Argument checks shared by the public functions: errors name the argument, what it got and what it
expected, and are raised before any computation starts.

Checks run once, where data enters the library (docs/design.md §4): the public functions and module methods a
user calls are entry points (:func:`entry_point`), and their checks run only when :func:`checking` — in the outermost entry
point on the call stack. A layer that calls its sublayers, or a module that calls its functional core, has
checked what it passes on, so the inner calls trust it and skip their checks.
"""

from __future__ import annotations

import functools
import threading

import torch
from .errors import ArgumentError, ArgumentTypeError

#: entry points on this thread's call stack (a thread that starts later reads the default through ``getattr``)
_calls = threading.local()
_calls.depth = 0


def entry_point(fn):
    """Decorator: ``fn`` (a public function, or an ``nn.Module`` method) is where a user's data enters; inside
    it, :func:`checking` says whether this is the outermost entry point (the user's own call).

    While ``torch.compile`` traces, the count is left alone and every check runs: checks are Python-level
    (shapes, dtypes, devices) and run once, at tracing, so they cost a compiled graph nothing — and a
    compiled frame must not mutate the count, whose restoring ``finally`` Dynamo does not always replay.

    Every wrapper gets a code object of its own: Dynamo caches compiled frames per code object and guards the
    wrapped ``fn``, so one shared wrapper code would recompile once per decorated function (every module class's
    ``forward``) and fail past ``torch._dynamo.config.recompile_limit`` (8) mechanisms in one process."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        depth = getattr(_calls, "depth", 0)
        _calls.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _calls.depth = depth

    wrapper.__code__ = wrapper.__code__.replace(co_name=fn.__name__)  # a new code object (docstring)
    return wrapper


def checking() -> bool:
    """Whether argument checks run here: True in the outermost :func:`entry_point` (and outside any, and while
    ``torch.compile`` traces), False in one called by another entry point, which validated what it passes on."""
    return torch.compiler.is_compiling() or getattr(_calls, "depth", 0) <= 1


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {x!r}" if isinstance(x, (int, float, str, bool)) else type(x).__name__


def check_tensor(x, name: str, ndim: int, layout: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor of shape {layout}, got {describe(x)}")
    if x.dim() != ndim:
        raise ArgumentError(f"{name} must have {ndim} dimensions {layout}, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ArgumentTypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def check_same_float(tensors: dict[str, torch.Tensor]) -> None:
    items = list(tensors.items())
    name0, t0 = items[0]
    for name, t in items[1:]:
        if t.dtype != t0.dtype:
            raise ArgumentTypeError(f"{name} has dtype {t.dtype} but {name0} has dtype {t0.dtype}; expected one dtype")
        if t.device != t0.device:
            raise ArgumentError(f"{name} is on {t.device} but {name0} is on {t0.device}; expected one device")


def broadcastable(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    for s, t in zip(reversed(shape), reversed(target)):
        if s != 1 and s != t:
            return False
    return True


def check_attn_mask(mask, name: str, target: tuple[int, int, int, int]) -> torch.Tensor:
    """A bool mask broadcastable to ``target`` = (B, H, n, m), returned as a 4-D view."""
    if not isinstance(mask, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a bool tensor broadcastable to {target} (True = attend), got {describe(mask)}")
    if mask.dtype != torch.bool:
        raise ArgumentTypeError(f"{name} must have dtype torch.bool (True = attend), got {mask.dtype}; "
                        "convert a float mask with `mask > 0` or pass an additive bias where supported")
    if not broadcastable(tuple(mask.shape), target):
        raise ArgumentError(f"{name} has shape {tuple(mask.shape)}, which does not broadcast to "
                         f"(batch, heads, queries, keys) = {target}")
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask


def check_key_padding_mask(kpm, name: str, batch: int, length: int, context) -> torch.Tensor | None:
    """``kpm`` checked as a ``(batch, length)`` bool mask (True = padding), or None. ``context`` — what the
    shape is compared with, for the message — is a string or a function returning one: a function keeps
    symbolic sizes (under torch.compile) from being turned into text, which would fix them to one value."""
    if kpm is None:
        return None
    if not isinstance(kpm, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a bool tensor of shape ({batch}, {length}) with True = padding, "
                        f"got {describe(kpm)}")
    if kpm.dtype != torch.bool:
        raise ArgumentTypeError(f"{name} must have dtype torch.bool (True = padding), got {kpm.dtype}")
    if tuple(kpm.shape) != (batch, length):
        context = context() if callable(context) else context
        raise ArgumentError(f"{name} has shape {tuple(kpm.shape)} but {context}; expected ({batch}, {length})")
    return kpm


def check_choice(value, name: str, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ArgumentError(f"unknown {name} {value!r}; expected one of {', '.join(repr(c) for c in choices)}")
    return value


def check_probability(p, name: str) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise ArgumentTypeError(f"{name} must be a float in [0, 1), got {describe(p)}")
    if not 0.0 <= float(p) < 1.0:
        raise ArgumentError(f"{name} must be in [0, 1), got {p}")
    return float(p)


def check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a bool, got {describe(value)}")
    return value


def check_int_at_least(value, name: str, minimum: int) -> int:
    """An int (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int >= {minimum}, got {describe(value)}")
    if value < minimum:
        raise ArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_nonnegative_int(value, name: str) -> int:
    return check_int_at_least(value, name, 0)


def check_positive_int(value, name: str) -> int:
    return check_int_at_least(value, name, 1)


def check_qkv(q, k, v, *, self_attention: bool = False, **extra: torch.Tensor) -> tuple[int, int, int, int]:
    """Check attention inputs q (B, H, n, d_k), k (B, H, m, d_k), v (B, H, m, d_v) — plus any ``extra``
    tensors that must share v's shape — and return (B, H, n, m). ``self_attention`` requires m == n."""
    check_tensor(q, "q", 4, "(batch, heads, queries, d_k)")
    check_tensor(k, "k", 4, "(batch, heads, keys, d_k)")
    check_tensor(v, "v", 4, "(batch, heads, keys, d_v)")
    for name, t in extra.items():
        check_tensor(t, name, 4, "(batch, heads, keys, d_v)")
    check_same_float({"q": q, "k": k, "v": v, **extra})
    B, H, n, d_k = q.shape
    if k.shape[:2] != (B, H) or k.shape[-1] != d_k:
        raise ArgumentError(f"k has shape {tuple(k.shape)} but q is {tuple(q.shape)}; expected (batch={B}, "
                         f"heads={H}, keys, d_k={d_k})")
    m = k.shape[2]
    if self_attention and m != n:
        raise ArgumentError(f"k has shape {tuple(k.shape)} but q is {tuple(q.shape)}; self-attention expects "
                         f"as many keys as queries ({n})")
    if v.shape[:3] != (B, H, m):
        raise ArgumentError(f"v has shape {tuple(v.shape)} but k is {tuple(k.shape)}; expected (batch={B}, "
                         f"heads={H}, keys={m}, d_v)")
    for name, t in extra.items():
        if t.shape != v.shape:
            raise ArgumentError(f"{name} has shape {tuple(t.shape)} but v is {tuple(v.shape)}; expected the same shape")
    return B, H, n, m
