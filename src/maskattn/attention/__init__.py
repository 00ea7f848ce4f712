"""Attention modules, one file per mechanism, and their registry."""

from .registry import AttentionInfo, attention_info, create_attention, list_attentions, register_attention
from .multihead import MultiHeadAttention

__all__ = [
    "AttentionInfo",
    "attention_info",
    "create_attention",
    "list_attentions",
    "register_attention",
    "MultiHeadAttention",
]
