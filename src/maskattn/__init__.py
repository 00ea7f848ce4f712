"""maskattn — mask-based self-attention for PyTorch: MTSA / Fast-DiSA, Mask Attention Networks and
Convolutional Self-Attention Networks on one attention engine (docs/design.md).

Layout: :mod:`maskattn.masks` (mask predicates) → :mod:`maskattn.kernels` (autograd kernels) →
:mod:`maskattn.functional` (the math per mechanism, dispatched by :mod:`maskattn.backends`) →
:mod:`maskattn.attention` (modules, registry) → :mod:`maskattn.layers` (layer chain, stacks) →
:mod:`maskattn.models` → :mod:`maskattn.metrics` (loss, evaluation, metrics) → :mod:`maskattn.train` /
:mod:`maskattn.inference`; plus ``data``, ``analysis``, ``bench``, ``viz``.
"""

from . import analysis, attention, backends, functional, layers, masks
from .attention import *  # noqa: F403 — the modules and the registry
from .layers import ChainLayer, Decoder, Encoder, LayerCache, LayerSettings, MANLayer, csan_encoder

__version__ = "0.1.0"

__all__ = ["analysis", "backends", "functional", "layers", "masks", *attention.__all__,
           "ChainLayer", "LayerSettings", "LayerCache", "Encoder", "Decoder", "csan_encoder", "MANLayer",
           "__version__"]
