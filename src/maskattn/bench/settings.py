"""Benchmark settings, their validation, and the (mechanism, backend) candidates they select."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch
import torch.nn as nn

from ..errors import ArgumentError, ArgumentTypeError, warn_renamed
from ..validation import check_positive_int, describe
from ..attention import attention_info, create_attention, list_attentions
from .. import backends
from .baselines import BASELINES, list_baselines

__all__ = ["BenchSettings", "Candidate", "DTYPES", "DEVICES", "MODES", "QUICK", "SUITES", "parse_lengths",
           "parse_names",
           "valid_mechanisms", "all_backends", "resolve_devices", "select_candidates"]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
#: ``auto`` = the CPU, plus CUDA when present.
#: ``auto``: CUDA when available, else the CPU (the meaning ``auto`` has in every command); ``all``: the CPU, and
#: CUDA when available
DEVICES = ("auto", "cpu", "cuda", "all")
#: What one point measures: a training step (forward + backward) or inference (forward, no autograd).
MODES = ("train", "inference")
#: The ``--quick`` suite: a few lengths, a small model, two timed repeats.
QUICK = {"lengths": (32, 64, 128, 256), "batch": 4, "width": 64, "heads": 4, "repeats": 2, "warmup": 1}

#: Suites, named benchmark settings (``maskattn bench --suite NAME``): the measurements behind the README and docs tables,
#: each a paper's comparison. Any setting can still be overridden on the command line.
SUITES: dict[str, dict] = {
    "quick": QUICK,
    # MTSA Fig. 1: batch 64, d_model 300, 2 heads; MTSA against multi-head attention and Algorithm 1
    "mtsa": {"lengths": (64, 128, 256, 512, 1024), "batch": 64, "width": 300, "heads": 2, "repeats": 3,
             "mechanisms": ("mtsa", "mha", "torch_mha", "mtsa_algorithm1"), "backends": ("sdpa",)},
    # MAN: DMAN against SAN (multi-head attention) at d_model 512, 8 heads
    "man": {"lengths": (64, 128, 256, 512, 1024), "batch": 2, "width": 512, "heads": 8, "repeats": 5,
            "mechanisms": ("dman", "sman", "mha", "torch_mha"), "backends": ("sdpa", "banded")},
    # CSAN: the O(n·window) banded kernel against dense masked attention, window 11, d_model 512, 8 heads
    "csan": {"lengths": (1024, 2048, 4096, 8192), "batch": 1, "width": 512, "heads": 8, "repeats": 3,
             "mechanisms": ("csan1d", "csan2d", "mha"), "backends": ("banded", "sdpa")},
    # the GPU acceptance settings: bf16, d_model 512, 8 heads, batch 8, n = 512 … 16384
    "gpu": {"lengths": (512, 1024, 2048, 4096, 8192, 16384), "batch": 8, "width": 512, "heads": 8, "repeats": 5,
            "dtype": "bfloat16", "device": "cuda", "backends": ("triton", "sdpa", "flex", "banded"),
            "mechanisms": ("mha", "mtsa", "dman", "sman", "csan1d", "csan2d", "torch_mha", "sdpa_causal")},
}
#: Backend name recorded for the baselines (plain PyTorch modules, no backend switch).
BASELINE_BACKEND = "torch"


def valid_mechanisms() -> list[str]:
    """Every name ``--mechanisms`` accepts: the registered mechanisms, then the baselines."""
    return list_attentions() + list_baselines()


def all_backends() -> list[str]:
    """Every backend some registered mechanism offers."""
    return sorted({b for name in list_attentions() for b in attention_info(name).backends})


def _split(text, name: str) -> list[str]:
    if not isinstance(text, str):
        raise ArgumentTypeError(f"{name} must be a comma-separated string, got {describe(text)}")
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ArgumentError(f"{name} must be a comma-separated list with no empty entries, got {text!r}")
    return items


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"64,128,256"`` → ``(64, 128, 256)``; every entry must be a positive integer."""
    lengths = []
    for item in _split(text, "lengths"):
        try:
            value = int(item)
        except ValueError:
            raise ArgumentError(f"lengths must be positive integers separated by commas, got {item!r} in {text!r}") \
                from None
        if value < 1:
            raise ArgumentError(f"lengths must be positive integers (>= 1), got {value} in {text!r}")
        lengths.append(value)
    return tuple(lengths)


def parse_names(text: str, name: str) -> tuple[str, ...]:
    """``"mtsa, mha"`` → ``("mtsa", "mha")`` (validated later, against the registry)."""
    return tuple(_split(text, name))


def _check_subset(values, name: str, valid: list[str], listing: str) -> tuple[str, ...]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise ArgumentTypeError(f"{name} must be a sequence of names, got {describe(values)}")
    values = tuple(values)
    unknown = [v for v in values if v not in valid]
    if unknown:
        raise ArgumentError(f"unknown {name} {unknown}; {listing}")
    if not values:
        raise ArgumentError(f"{name} is empty; {listing}")
    return values


@dataclass(frozen=True)
class BenchSettings:
    """What ``maskattn bench`` measures. Construct with keyword arguments; invalid values raise
    ``ValueError`` / ``TypeError`` naming the setting.

    Attributes:
        lengths: sequence lengths n (positive ints).
        batch, width, heads: the input ``(batch, n, width)`` and the number of heads of every module.
        dtype: ``"float32"``, ``"float64"`` or ``"bfloat16"``.
        mechanisms: registered mechanisms and baselines to run; ``None`` = all of them.
        backends: backends to run the registered mechanisms on (baselines have none); ``None`` = every
            backend each mechanism offers that can run forward and backward on the device.
        repeats: timed forward runs and timed backward runs per point; warmup: untimed steps before.
        device: ``"auto"`` (CUDA when present, else the CPU), ``"cpu"``, ``"cuda"`` or ``"all"`` (the CPU, plus CUDA
            when present).
        mem_budget_gb: skip points whose estimated peak exceeds this (GiB); ``None`` = a fraction
            (:data:`maskattn.bench.runner.MEMORY_FRACTION`) of the memory available on each device.
        seed: seed of the parameters and inputs.
        mode: ``"train"`` (forward with autograd, then backward; peak memory of both) or ``"inference"``
            (forward under ``torch.no_grad()`` in evaluation mode; no backward).
        compile: run every module through ``torch.compile(fullgraph=True)``; the warm-up steps (at least one)
            compile it, so timings exclude compilation.
    """

    lengths: tuple[int, ...] = (64, 128, 256, 512, 1024)
    batch: int = 8
    width: int = 256
    heads: int = 4
    dtype: str = "float32"
    mechanisms: tuple[str, ...] | None = None
    backends: tuple[str, ...] | None = None
    repeats: int = 5
    warmup: int = 1
    device: str = "auto"
    mem_budget_gb: float | None = None
    seed: int = 0
    mode: str = "train"
    compile: bool = False

    def __post_init__(self):
        if isinstance(self.lengths, (str, int)) or not hasattr(self.lengths, "__iter__"):
            raise ArgumentTypeError(f"lengths must be a sequence of positive ints, got {describe(self.lengths)}")
        lengths = tuple(self.lengths)
        if not lengths:
            raise ArgumentError("lengths is empty; expected at least one sequence length")
        for n in lengths:
            check_positive_int(n, "each length")
        object.__setattr__(self, "lengths", lengths)
        for name in ("batch", "width", "heads", "repeats"):
            check_positive_int(getattr(self, name), name)
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int):
            raise ArgumentTypeError(f"warmup must be an int >= 0, got {describe(self.warmup)}")
        if self.warmup < 0:
            raise ArgumentError(f"warmup must be >= 0, got {self.warmup}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ArgumentTypeError(f"seed must be an int, got {describe(self.seed)}")
        if self.dtype not in DTYPES:
            raise ArgumentError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise ArgumentError(f"unknown device {self.device!r}; expected one of {', '.join(DEVICES)}")
        if self.mode not in MODES:
            raise ArgumentError(f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")
        if not isinstance(self.compile, bool):
            raise ArgumentTypeError(f"compile must be a bool, got {describe(self.compile)}")
        if self.compile and self.warmup < 1:
            raise ArgumentError("compile needs warmup >= 1: the first (untimed) step compiles the module")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ArgumentError("device 'cuda' was requested but torch.cuda.is_available() is False; use 'cpu' or 'auto'")
        budget = self.mem_budget_gb
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))):
            raise ArgumentTypeError(f"mem_budget_gb must be a number of GiB or None, got {describe(budget)}")
        if budget is not None and not budget > 0:
            raise ArgumentError(f"mem_budget_gb must be a positive number of GiB, got {budget}")
        if self.mechanisms is not None:
            object.__setattr__(self, "mechanisms", _check_subset(
                self.mechanisms, "mechanisms", valid_mechanisms(),
                f"registered mechanisms: {', '.join(list_attentions())}; baselines: {', '.join(list_baselines())}"))
        if self.backends is not None:
            object.__setattr__(self, "backends", _check_subset(
                self.backends, "backends", all_backends(), f"valid backends: {', '.join(all_backends())}"))

    @classmethod
    def suite(cls, name: str, **overrides) -> BenchSettings:
        """The named settings of :data:`SUITES`, with any setting overridden."""
        if not isinstance(name, str) or name not in SUITES:
            raise ArgumentError(f"unknown bench suite {name!r}; expected one of {', '.join(SUITES)}")
        return cls(**{**SUITES[name], **overrides})

    @classmethod
    def preset(cls, name: str, **overrides) -> BenchSettings:
        """Old name of :meth:`suite` (a "preset" is a ``maskattn train --preset`` file)."""
        warn_renamed("BenchSettings.preset", "BenchSettings.suite")
        return cls.suite(name, **overrides)

    @classmethod
    def quick(cls, **overrides) -> BenchSettings:
        """The ``--quick`` suite (:data:`QUICK`), with any setting overridden."""
        return cls.suite("quick", **overrides)

    def to_dict(self) -> dict:
        """The settings as JSON-ready values (tuples become lists)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: list(value) if isinstance(value, tuple) else value for name, value in values.items()}


@dataclass(frozen=True)
class Candidate:
    """One benchmarked module: a registered mechanism on one backend, or a baseline."""

    name: str
    backend: str
    kind: str  # "mechanism" | "baseline"
    description: str
    build: Callable[[], nn.Module] = field(repr=False)

    @property
    def label(self) -> str:
        return self.name if self.kind == "baseline" else f"{self.name}/{self.backend}"


def resolve_devices(device: str) -> list[str]:
    """The devices measured: ``all`` → ``["cpu"]`` plus ``"cuda"`` when present; ``auto`` → CUDA when present, else
    the CPU; otherwise the one device."""
    if device == "all":
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if device == "auto":
        return ["cuda" if torch.cuda.is_available() else "cpu"]
    return [device]


def select_candidates(settings: BenchSettings, device: str) -> tuple[list[Candidate], list[str]]:
    """The candidates ``settings`` select on ``device`` and notes on the pairs left out (and why)."""
    names = settings.mechanisms or tuple(valid_mechanisms())
    candidates, notes = [], []
    for name in names:
        if name in BASELINES:
            baseline = BASELINES[name]
            if settings.compile and baseline.uncompilable:
                notes.append(f"{device}: {name} not run with compile: {baseline.uncompilable}")
                continue
            candidates.append(Candidate(name, BASELINE_BACKEND, "baseline", baseline.description,
                                        functools.partial(baseline.build, settings.width, settings.heads)))
            continue
        info = attention_info(name)
        wanted = [b for b in info.backends if settings.backends is None or b in settings.backends]
        for backend in wanted:
            # without dropout; the mechanisms of the local family attend within a band, MTSA's heads are bands
            head_dim = settings.width // settings.heads
            situation = backends.Situation(torch.device(device).type, DTYPES[settings.dtype],
                                           head_dims=(head_dim, head_dim), training=settings.mode == "train",
                                           band=info.family == "local", head_bands=True)
            reasons = backends.reasons(info.family, backend, situation)
            if reasons:
                notes.append(f"{device}: {name}/{backend} not run: it {'; it '.join(reasons)}")
                continue
            candidates.append(Candidate(name, backend, "mechanism", info.description,
                                        functools.partial(create_attention, name, settings.width, settings.heads,
                                                          backend=backend)))
    if not candidates:
        raise ArgumentError(f"nothing to run on {device}: mechanisms {list(names)} with backends "
                         f"{list(settings.backends or all_backends())} leave no runnable pair"
                         + (f" ({'; '.join(notes)})" if notes else ""))
    return candidates, notes
