"""Encoder–decoder attention (Vaswani et al. 2017 §3.2.3): queries from the decoder, keys and values from the
encoder output. Not a self-attention, so not in the registry; layer chains use it as their ``cross``
sublayer."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..validation import check_probability
from ..functional.activations import activation as activation_fn, check_activation
from ..functional.dot_product import dot_product_attention
from .base import check_dims, merge_heads, split_heads

__all__ = ["CrossAttention"]


class CrossAttention(nn.Module):
    """Multi-head attention of ``x`` ``(B, T, d)`` over a memory ``(B, S, d)``. :meth:`memory_kv` projects the
    memory once per source, so incremental decoding reuses it at every step.

    ``activation``: ``F`` before the output projection, as MAN's Eq. 5 — None (Vaswani et al.; default) or a name of
    the activation table: the authors' MAN decoders compute their encoder–decoder attention with the same
    ``MultiheadAttention2`` as their encoder, so it applies ReLU (translation, ``multihead_attention2.py`` line 249)
    or GELU (summarization, ``summarization/model/multihead_attention2.py`` line 294). ``activation_dropout``:
    dropout after it (0; 0.1 in their summarization model, line 295)."""

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 bias: bool = True, activation: str | None = None, activation_dropout: float = 0.0):
        super().__init__()
        check_dims(d_model, num_heads)
        self.d_model, self.num_heads = d_model, num_heads
        self.dropout = check_probability(dropout, "dropout")
        self.backend = backend
        self.activation = check_activation(activation, "activation")
        self.activation_dropout = check_probability(activation_dropout, "activation_dropout")
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        for linear in (self.q_proj, self.kv_proj):
            nn.init.xavier_uniform_(linear.weight)
        if bias:
            for linear in (self.q_proj, self.kv_proj, self.out_proj):
                nn.init.zeros_(linear.bias)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``memory`` ``(B, S, d)``: two ``(B, H, S, d_h)`` tensors."""
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        return split_heads(k, self.num_heads), split_heads(v, self.num_heads)

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor],
                memory_padding: torch.Tensor | None) -> torch.Tensor:
        """``x`` ``(B, T, d)`` attends to the memory keys/values; ``memory_padding`` ``(B, S)``, True = padding.
        Rows whose source is all padding get 0."""
        q = split_heads(self.q_proj(x), self.num_heads)  # (B, H, T, d_h)
        k, v = memory_kv
        out = dot_product_attention(q, k, v, key_padding_mask=memory_padding, dropout_p=self.dropout,
                                    training=self.training, backend=self.backend)
        out = merge_heads(out)  # (B, T, d)
        if self.activation is not None:
            out = activation_fn(self.activation)(out)
        if self.training and self.activation_dropout > 0:
            out = F.dropout(out, self.activation_dropout, True)
        return self.out_proj(out)  # (B, T, d)
