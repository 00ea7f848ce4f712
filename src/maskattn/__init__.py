"""maskattn — mask-based self-attention for PyTorch: MTSA / Fast-DiSA, Mask Attention Networks and
Convolutional Self-Attention Networks on one attention engine."""

from . import backends, functional, masks
from .attention import (
    MTSA,
    DiSA,
    FastDiSA,
    Source2Token,
    AttentionCache,
    DynamicMaskAttention,
    MultiHeadAttention,
    StaticMaskAttention,
    attention_info,
    create_attention,
    list_attentions,
    register_attention,
)
from . import analysis
from .layers import MANLayer, MANLayerCache

__version__ = "0.1.0"

__all__ = [
    "backends",
    "functional",
    "masks",
    "MultiHeadAttention",
    "MTSA",
    "FastDiSA",
    "DiSA",
    "Source2Token",
    "AttentionCache",
    "DynamicMaskAttention",
    "StaticMaskAttention",
    "MANLayer",
    "MANLayerCache",
    "analysis",
    "attention_info",
    "create_attention",
    "list_attentions",
    "register_attention",
    "__version__",
]

from .attention import ConvSelfAttention
from .encoder import Encoder, csan_encoder

__all__ += ["ConvSelfAttention", "Encoder", "csan_encoder"]
