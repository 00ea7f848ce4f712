"""Attention modules, one file per mechanism, and their registry."""

from .registry import AttentionInfo, attention_info, create_attention, list_attentions, register_attention
from .multihead import MultiHeadAttention
from .mtsa import MTSA
from .fast_disa import FastDiSA
from .disa import DiSA
from .source2token import Source2Token
from .man import AttentionCache, DynamicMaskAttention, StaticMaskAttention
from .csan import ConvSelfAttention

__all__ = [
    "AttentionInfo", "attention_info", "create_attention", "list_attentions", "register_attention",
    "MultiHeadAttention", "MTSA", "FastDiSA", "DiSA", "Source2Token",
    "AttentionCache", "DynamicMaskAttention", "StaticMaskAttention", "ConvSelfAttention",
]
