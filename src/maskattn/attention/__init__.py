"""Attention modules, one file per mechanism, and their registry."""

from .registry import AttentionInfo, attention_info, create_attention, list_attentions, register_attention
from .multihead import MultiHeadAttention
from .man import AttentionCache, DynamicMaskAttention, StaticMaskAttention

__all__ = [
    "AttentionInfo",
    "attention_info",
    "create_attention",
    "list_attentions",
    "register_attention",
    "MultiHeadAttention",
    "AttentionCache",
    "DynamicMaskAttention",
    "StaticMaskAttention",
]
from .csan import ConvSelfAttention

__all__ += ["ConvSelfAttention"]
