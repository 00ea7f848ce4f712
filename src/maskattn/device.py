"""The torch device a command, a run or a function asks for by name — one meaning everywhere: ``auto`` (CUDA
when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N`` (docs/design.md §4) — and the memory a batch may
take on it: :func:`attention_memory_bytes` estimates a batch's peak, :func:`memory_budget` is what may be spent
(a share of the memory available now, or ``MASKATTN_MEMORY_LIMIT``), :func:`check_memory` refuses a batch over it
before it is built (training, ``predict`` / ``eval`` and ``viz`` all ask it)."""

from __future__ import annotations

import os
import re

import torch

from .errors import ConfigError, MemoryLimitError

__all__ = ["resolve_device", "DEVICE_NAMES", "MEMORY_LIMIT_ENV", "MEMORY_FRACTION", "attention_memory_bytes",
           "available_memory_bytes", "memory_budget", "check_memory", "format_bytes"]

#: what a device option accepts (``cuda:N`` for any N)
DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N")


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``; an unknown name, or CUDA
    on a machine without it, raises :class:`ConfigError`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"unknown device {name!r}; expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} was asked for but CUDA is not available; use cpu")
    return torch.device(name)


#: environment variable that sets the memory budget by hand: bytes with an optional unit (``8G``, ``512MiB``), or
#: ``none`` for no check
MEMORY_LIMIT_ENV = "MASKATTN_MEMORY_LIMIT"

#: the share of the memory available when a batch is planned that it may take (the rest: the process, other jobs)
MEMORY_FRACTION = 0.8

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def format_bytes(count: float) -> str:
    """``count`` bytes as ``1.2 GiB`` / ``340 MiB`` / ``12 KiB`` / ``512 bytes`` (never "0 MiB" for a small
    budget)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}" if unit == "GiB" else f"{count / size:.0f} {unit}"
    return f"{count:.0f} bytes"


def attention_memory_bytes(batch: int, length: int, *, heads: int, layers: int, width: int, training: bool = False,
                           element_size: int = 4, score_features: int = 1) -> int:
    """An upper estimate of the peak memory of one forward (with ``training``: and backward) pass of ``layers``
    attention sublayers of ``heads`` heads and model width ``width`` over a ``(batch, length)`` input.

    The quadratic term is what kills a machine: the attention scores, ``batch × heads × length² × score_features``
    values of ``element_size`` bytes per sublayer (``score_features``: 1 for scalar attention; the per-head width
    for the explicit n×n×d maps of MTSA's reference math). Inference holds about four such tensors at a time
    (scores, weights, a temporary); training may keep two per sublayer for backward plus two for the one being
    differentiated. The linear term counts the activations (8 per layer in inference, 16 per layer in training,
    ``batch × length × width`` each). The fused kernels keep less than this; the estimate errs on the safe side."""
    scores = batch * heads * length * length * score_features * element_size
    activations = batch * length * width * element_size
    if training:
        return (2 * layers + 2) * scores + 16 * max(layers, 1) * activations
    return (4 if layers else 0) * scores + 8 * max(layers, 1) * activations


def available_memory_bytes(device: torch.device | str = "cpu") -> int | None:
    """Memory that can still be allocated on ``device``: CUDA's free memory, or on the CPU ``MemAvailable`` of
    ``/proc/meminfo`` (Linux), else the free physical pages of ``os.sysconf``; ``None`` when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def _parse_limit(text: str) -> int | None:
    """The value of ``MASKATTN_MEMORY_LIMIT``: bytes with an optional unit, or ``none`` / ``off`` (no check)."""
    value = text.strip().lower()
    if value in ("none", "off", "unlimited"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    if match is None or match.group(2) not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigError(f"{MEMORY_LIMIT_ENV}={text!r} is not a memory size; expected bytes with an optional unit "
                          "(e.g. 8G, 512MiB, 2000000000) or 'none' (no check)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def memory_budget(device: torch.device | str = "cpu") -> int | None:
    """The most bytes one batch may take on ``device``: ``MASKATTN_MEMORY_LIMIT`` when set (``none``: no limit),
    else :data:`MEMORY_FRACTION` of :func:`available_memory_bytes`; ``None`` when there is no limit or the
    available memory cannot be read."""
    text = os.environ.get(MEMORY_LIMIT_ENV)
    if text is not None and text.strip():
        return _parse_limit(text)
    available = available_memory_bytes(device)
    return None if available is None else int(available * MEMORY_FRACTION)


def check_memory(estimate: int, *, what: str, advice: str, device: torch.device | str = "cpu") -> None:
    """Refuse (:class:`~maskattn.errors.MemoryLimitError`) a batch whose ``estimate`` (from
    :func:`attention_memory_bytes`) exceeds :func:`memory_budget`: the message says ``what`` was planned, the
    estimate, the budget and ``advice`` (what to lower), and how to change the budget."""
    budget = memory_budget(device)
    if budget is None or estimate <= budget:
        return
    source = (f"{MEMORY_LIMIT_ENV}" if os.environ.get(MEMORY_LIMIT_ENV, "").strip()
              else f"{MEMORY_FRACTION:.0%} of the memory available now")
    raise MemoryLimitError(f"{what} would need about {format_bytes(estimate)}, more than the "
                           f"{format_bytes(budget)} budget ({source}); {advice}, or set {MEMORY_LIMIT_ENV} "
                           f"(e.g. {MEMORY_LIMIT_ENV}=64G, or 'none' to skip this check)")
