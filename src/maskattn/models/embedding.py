"""Word embeddings: uniform ``[-init, init]`` initialisation (``init`` 0.05 as MTSA Appendix B; Kim 2014:
0.25), optional pretrained rows, padding row fixed at zero, an optional scale (``√d_model`` before sinusoidal
positions, as in Vaswani et al. 2017 §3.4 — otherwise the unit-amplitude positions drown the ±0.05 word
vectors), dropout, and a projection when the embedding width differs from the model's."""

from __future__ import annotations

import torch
import torch.nn as nn
from ..errors import ArgumentError

__all__ = ["TokenEmbedding"]


class TokenEmbedding(nn.Module):
    """``ids (B, n)`` → ``(B, n, d_model)``."""

    def __init__(self, vocab_size: int, d_model: int, *, embed_dim: int | None = None, pad_id: int = 0,
                 dropout: float = 0.0, pretrained: torch.Tensor | None = None, freeze: bool = False,
                 scale: float = 1.0, init: float = 0.05):
        super().__init__()
        if isinstance(init, bool) or not isinstance(init, (int, float)) or not init > 0:
            raise ArgumentError(f"model.embed_init must be a positive number (the bound of the uniform initialisation), "
                             f"got {init!r}")
        self.scale = scale
        embed_dim = embed_dim or d_model
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        nn.init.uniform_(self.embedding.weight, -init, init)
        if pretrained is not None:
            if tuple(pretrained.shape) != (vocab_size, embed_dim):
                raise ArgumentError(f"pretrained vectors have shape {tuple(pretrained.shape)}; expected "
                                 f"(vocab size {vocab_size}, embed_dim {embed_dim})")
            self.embedding.weight.data.copy_(pretrained)
        with torch.no_grad():
            self.embedding.weight[pad_id].zero_()
        self.embedding.weight.requires_grad_(not freeze)
        self.proj = nn.Linear(embed_dim, d_model) if embed_dim != d_model else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids)  # (B, n, embed_dim)
        x = self.dropout(x * self.scale if self.scale != 1.0 else x)
        return x if self.proj is None else self.proj(x)
