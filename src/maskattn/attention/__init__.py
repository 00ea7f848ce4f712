"""Attention modules, one file per mechanism, and their registry (conventions: :mod:`.base`)."""

from .base import AttentionCache, AttentionMaps, SelfAttention
from .registry import (AttentionInfo, attention_info, backend_limits_table, backend_table, backend_table_rows,
                       create_attention, list_attentions, register_attention)
from .multihead import MultiHeadAttention
from .cross import CrossAttention
from .mtsa import MTSA
from .fast_disa import FastDiSA
from .disa import DiSA
from .source2token import Source2Token
from .man import DynamicMaskAttention, StaticMaskAttention
from .csan import ConvSelfAttention

__all__ = [
    "AttentionInfo", "attention_info", "create_attention", "list_attentions", "register_attention",
    "backend_table", "backend_table_rows", "backend_limits_table",
    "SelfAttention", "AttentionMaps", "AttentionCache",
    "MultiHeadAttention", "CrossAttention", "MTSA", "FastDiSA", "DiSA", "Source2Token",
    "DynamicMaskAttention", "StaticMaskAttention", "ConvSelfAttention",
]
