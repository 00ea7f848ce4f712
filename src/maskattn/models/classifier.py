"""Sentence classification: embeddings → context fusion → multi-dim source2token pooling → MLP
(MTSA §4.3)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..validation import check_probability
from ..attention import AttentionMaps
from ..layers import Encoder
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
        embed_dropout = cfg.dropout if cfg.embed_dropout is None else cfg.embed_dropout
        self.embed = TokenEmbedding(vocab_size, cfg.d_model, embed_dim=cfg.embed_dim, pad_id=pad_id,
                                    dropout=check_probability(embed_dropout, "model.embed_dropout"),
                                    pretrained=pretrained, freeze=cfg.freeze_embeddings, scale=embedding_scale(cfg),
                                    init=cfg.embed_init)
        self.fusion = build_fusion(cfg, cfg.d_model)
        if pool and cfg.pooling == "cls":
            raise ConfigError("model.pool 'cls' takes the first token, the [CLS] token of a pretrained encoder "
                              "(model.pretrained); maskattn's own encoders have none: use source2token, mean or max")
        self.pool = Pool(self.fusion.out_dim, cfg.pooling) if pool else None  # taggers use the tokens only
        self.out_dim = self.fusion.out_dim

    def tokens(self, ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        """Context-aware token representations ``(B, n, out_dim)``."""
        return self.fusion(self.embed(ids), key_padding_mask=padding_mask)

    def forward(self, ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        return self.pool(self.tokens(ids, padding_mask), key_padding_mask=padding_mask)

    def attention_maps(self, ids: torch.Tensor,
                       padding_mask: torch.Tensor) -> tuple[list[dict[str, AttentionMaps]], torch.Tensor | None]:
        """The attention maps of a forward pass over ``ids`` (for plots and analysis):

        * per encoder layer, bottom first, ``{"<position>:<name>": AttentionMaps}`` —
          :meth:`maskattn.Encoder.attention_maps`;
        * the multi-dim source2token pooling weights ``(B, n, out_dim)`` (MTSA Eq. 9 pooling), or ``None``
          when the sentence is pooled otherwise (or not at all, for taggers).

        Raises ``ValueError`` when the context fusion is a baseline (Bi-LSTM, CNN, …) without attention layers.
        """
        encoder = getattr(self.fusion, "encoder", None)
        if not isinstance(encoder, Encoder):
            raise ValueError(f"the context fusion {type(self.fusion).__name__} has no attention layers; attention maps "
                             "need a layer-recipe encoder such as 'mtsa' or 'dman>san>ffn x6'")
        embedded = self.embed(ids)
        layers = encoder.attention_maps(embedded, key_padding_mask=padding_mask)
        pool = None
        if self.pool is not None and self.pool.attention is not None:
            pool = self.pool.attention.weights(self.fusion(embedded, key_padding_mask=padding_mask), padding_mask)
        return layers, pool


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
