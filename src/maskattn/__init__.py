"""maskattn — mask-based self-attention for PyTorch: MTSA / Fast-DiSA, Mask Attention Networks and
Convolutional Self-Attention Networks on one attention engine (docs/design.md).

Layout: :mod:`maskattn.masks` (mask predicates) → :mod:`maskattn.kernels` (autograd kernels) →
:mod:`maskattn.functional` (the math per mechanism, dispatched by :mod:`maskattn.backends`) →
:mod:`maskattn.attention` (modules, registry) → :mod:`maskattn.layers` (layer chain, stacks) →
:mod:`maskattn.models` → :mod:`maskattn.metrics` (loss, evaluation, metrics) → :mod:`maskattn.train` /
:mod:`maskattn.inference`; plus ``data``, ``analysis``, ``bench``, ``viz``.
"""

import os as _os
from importlib import metadata as _metadata

# OpenMP threads that wait for work by spinning collapse when another process shares the cores: PyTorch's libgomp
# threads spin up to GOMP_SPINCOUNT (300,000 by default) before sleeping, and on 2 cores beside one busy process
# `maskattn train --preset trec` ran at 74-85 examples/s instead of ~1,400. A spin of 1,000 keeps 775-781 there and
# costs ~20 % on an idle machine (issue 23; docs/training.md "Threads"). It must be set before torch loads OpenMP, so
# it takes effect when maskattn is imported first (every `maskattn` command); OMP_WAIT_POLICY or GOMP_SPINCOUNT set
# by the user win.
if not _os.environ.get("OMP_WAIT_POLICY") and not _os.environ.get("GOMP_SPINCOUNT"):
    _os.environ["GOMP_SPINCOUNT"] = "1000"

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

if _TYPE_CHECKING:  # what static tools (mypy, the API reference) see; at run time `__getattr__` below loads them
    from . import analysis, attention, backends, functional, layers, masks  # noqa: F401
    from .attention import *  # noqa: F403 — the modules and the registry
    from .layers import ChainLayer, Decoder, Encoder, LayerCache, LayerSettings, MANLayer, csan_encoder  # noqa: F401

try:  # one source of the version: the package metadata (pyproject.toml)
    __version__ = _metadata.version("maskattn")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

_SUBMODULES = ("analysis", "attention", "backends", "functional", "layers", "masks")
_LAYERS = ("ChainLayer", "LayerSettings", "LayerCache", "Encoder", "Decoder", "csan_encoder", "MANLayer")


def _public() -> list[str]:
    attention = _importlib.import_module(".attention", __name__)
    return [*_SUBMODULES[:1], *_SUBMODULES[2:], *attention.__all__, *_LAYERS, "__version__"]


def __getattr__(name: str):
    """The package's API loaded on first use (PEP 562): ``import maskattn`` alone does not import torch, so that
    every ``maskattn`` command starts without it (``maskattn --help`` in ~0.5 s instead of ~2 s of imports)."""
    if name in _SUBMODULES:
        return _importlib.import_module(f".{name}", __name__)
    if name in _LAYERS:
        return getattr(_importlib.import_module(".layers", __name__), name)
    if name == "__all__":
        return _public()
    if not name.startswith("__"):
        attention = _importlib.import_module(".attention", __name__)
        if name in attention.__all__:
            return getattr(attention, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_public()})
