"""Sentence classification: embeddings → context fusion → multi-dim source2token pooling → MLP
(MTSA §4.3)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .embedding import TokenEmbedding
from .fusion import build_fusion
from .heads import MLP, Pool

__all__ = ["SentenceEncoder", "SentenceClassifier"]


def embedding_scale(cfg) -> float:
    """``cfg.embed_scale``, or by default ``√d_model`` before sinusoidal positions and 1 otherwise."""
    if cfg.embed_scale is not None:
        return float(cfg.embed_scale)
    return math.sqrt(cfg.d_model) if cfg.positional == "sinusoidal" else 1.0


class SentenceEncoder(nn.Module):
    """``ids (B, n)`` + padding mask ``(B, n)`` (True = padding) → sentence embedding ``(B, out_dim)``."""

    def __init__(self, cfg, vocab_size: int, *, pad_id: int = 0, pretrained: torch.Tensor | None = None,
                 pool: bool = True):
        super().__init__()
        self.embed = TokenEmbedding(vocab_size, cfg.d_model, embed_dim=cfg.embed_dim, pad_id=pad_id,
                                    dropout=cfg.dropout, pretrained=pretrained, freeze=cfg.freeze_embeddings,
                                    scale=embedding_scale(cfg))
        self.fusion = build_fusion(cfg, cfg.d_model)
        self.pool = Pool(self.fusion.out_dim, cfg.pool) if pool else None  # taggers use the tokens only
        self.out_dim = self.fusion.out_dim

    def tokens(self, ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        """Context-aware token representations ``(B, n, out_dim)``."""
        return self.fusion(self.embed(ids), key_padding_mask=padding_mask)

    def forward(self, ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        return self.pool(self.tokens(ids, padding_mask), key_padding_mask=padding_mask)


class SentenceClassifier(nn.Module):
    """Sentence classifier: embeddings → context fusion → source2token pooling → MLP.

    ``forward(tokens, padding_mask)`` → class logits ``(B, num_classes)``."""

    def __init__(self, cfg, vocab_size: int, num_classes: int, *, pad_id: int = 0,
                 pretrained: torch.Tensor | None = None):
        super().__init__()
        self.encoder = SentenceEncoder(cfg, vocab_size, pad_id=pad_id, pretrained=pretrained)
        d = self.encoder.out_dim
        self.head = MLP(d, cfg.mlp_hidden or d, num_classes, layers=cfg.mlp_layers, activation=cfg.activation,
                        dropout=cfg.dropout)

    def forward(self, tokens: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(tokens, padding_mask))
