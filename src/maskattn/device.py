"""The torch device a command, a run or a function asks for by name — one meaning everywhere: ``auto`` (CUDA
when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N`` (docs/design.md §4)."""

from __future__ import annotations

import torch

from .errors import ConfigError

__all__ = ["resolve_device", "DEVICE_NAMES"]

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
