"""maskattn — mask-based self-attention for PyTorch: MTSA / Fast-DiSA, Mask Attention Networks and
Convolutional Self-Attention Networks on one attention engine."""

from . import analysis, attention, backends, functional, masks
from .attention import *  # noqa: F403 — the modules and the registry
from .encoder import Encoder, csan_encoder
from .layers import MANLayer, MANLayerCache

__version__ = "0.1.0"

__all__ = ["analysis", "backends", "functional", "masks", *attention.__all__,
           "Encoder", "csan_encoder", "MANLayer", "MANLayerCache", "__version__"]
