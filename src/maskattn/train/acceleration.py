"""Mixed precision and ``torch.compile`` for training: what ``train.amp`` and ``train.compile`` turn on, the
checks that refuse what cannot work before the first step, and the report of a recompilation storm."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn

from .. import backends
from ..errors import ConfigError

__all__ = ["autocast_dtype", "check_trainable_backends", "compile_model", "RecompileMonitor", "RECOMPILE_WARNING"]

#: recompilations of the model after which training warns (once) that shapes or guards keep changing
RECOMPILE_WARNING = 4


def autocast_dtype(amp: bool | str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``train.amp`` on ``device`` (None = full precision): ``true`` → bfloat16 where the
    device supports it, else float16 (CUDA); ``"bf16"`` / ``"fp16"`` as named. float16 on the CPU is refused."""
    if amp is False:
        return None
    if amp is True:
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return torch.float16
        return torch.bfloat16
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError(f"train.amp=fp16 needs a CUDA device (float16 autocast with a gradient scaler); on "
                          f"{device.type} use train.amp=bf16 (or true), or train.amp=false")
    return torch.bfloat16 if amp == "bf16" else torch.float16


def check_trainable_backends(model: nn.Module, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Refuse, before training starts, attention modules set to a backend that cannot train on ``device`` in
    ``dtype`` (the compute dtype: the autocast dtype under mixed precision): the backend registry's reasons for a
    training call of the module's family (:func:`maskattn.backends.reasons`), with masks assumed to suit the
    backend (those are checked at the first call)."""
    for name, module in model.named_modules():
        backend, family = getattr(module, "backend", None), getattr(module, "family", None)
        if backend in (None, "auto") or family not in backends.FAMILIES:
            continue
        head_dim = module.d_model // max(1, module.num_heads) if hasattr(module, "d_model") else 64
        situation = backends.Situation(device.type, dtype, head_dims=(head_dim, head_dim), training=True,
                                       band=True, head_bands=True)
        reasons = backends.reasons(family, backend, situation)
        if reasons:
            raise ConfigError(f"{name or 'the model'} uses backend={backend!r}, which cannot train on {device.type} "
                              f"in {str(dtype).removeprefix('torch.')}: it {'; it '.join(reasons)}. Use "
                              f"model.backend=auto here, or train where it runs")


def compile_model(model: nn.Module) -> nn.Module:
    """``torch.compile`` with dynamic shapes: the first new sequence length makes the graph length-generic, so
    variable-length batches compile at most twice (tested). The state dict stays the model's own (checkpoints
    hold the uncompiled names)."""
    return cast(nn.Module, torch.compile(model, dynamic=None))  # an OptimizedModule


class RecompileMonitor:
    """Counts the recompilations dynamo records (its guard failures) since construction and returns a
    message — the count and the latest cause — once it passes :data:`RECOMPILE_WARNING`; at most once."""

    def __init__(self):
        from torch._dynamo.utils import guard_failures

        self._failures = guard_failures
        self._start = self._count()
        self.warned = False

    def _count(self) -> int:
        return sum(len(reasons) for reasons in self._failures.values())

    def check(self) -> str | None:
        count = self._count() - self._start
        if self.warned or count < RECOMPILE_WARNING:
            return None
        self.warned = True
        latest = next((reasons[-1] for reasons in reversed(list(self._failures.values())) if reasons), "unknown")
        return (f"torch.compile recompiled the model {count} times (latest cause: {str(latest).strip()}); each "
                "recompilation costs seconds — keep shapes and settings steady, or set train.compile=false")
