"""Sentence classification: embeddings → context fusion → multi-dim source2token pooling → MLP
(MTSA §4.3)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import ArgumentError
from ..attention import AttentionMaps
from ..layers import Encoder
from .heads import MLP, Pool

__all__ = ["SentenceEncoder", "EncoderClassifier", "SentenceClassifier"]


class SentenceEncoder(nn.Module):
    """``ids (B, n)`` + padding mask ``(B, n)`` (True = padding) → sentence embedding ``(B, out_dim)``: word
    embeddings → context fusion (a layer-recipe :class:`~maskattn.Encoder` or a baseline) → pooling (MTSA §4.3).

    Args:
        embed: the word embeddings, ``(B, n)`` ids → ``(B, n, d)``.
        fusion: the context fusion, ``fusion(x, key_padding_mask=…)`` with an ``out_dim``.
        pooling: ``source2token`` (MTSA Eq. 9 pooling), ``mean``, ``max`` or ``cls`` (:class:`~maskattn.models.heads.Pool`);
            None: no pooling (taggers read the tokens, :meth:`tokens`).
    """

    def __init__(self, embed: nn.Module, fusion: nn.Module, pooling: str | None = "source2token"):
        super().__init__()
        self.embed, self.fusion = embed, fusion
        self.out_dim: int = fusion.out_dim  # type: ignore[assignment]  # every fusion declares out_dim (models.fusion)
        self.pool = Pool(self.out_dim, pooling) if pooling is not None else None

    def tokens(self, ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        """Context-aware token representations ``(B, n, out_dim)``."""
        return self.fusion(self.embed(ids), key_padding_mask=padding_mask)

    def forward(self, ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        if self.pool is None:
            raise ArgumentError("this encoder has no pooling (pooling=None, a tagger's): read tokens() instead")
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
            raise ArgumentError(f"the context fusion {type(self.fusion).__name__} has no attention layers; attention maps "
                             "need a layer-recipe encoder such as 'mtsa' or 'dman>san>ffn x6'")
        embedded = self.embed(ids)
        layers = encoder.attention_maps(embedded, key_padding_mask=padding_mask)
        pool = None
        if self.pool is not None and self.pool.attention is not None:
            pool = self.pool.attention.weights(self.fusion(embedded, key_padding_mask=padding_mask), padding_mask)
        return layers, pool


class EncoderClassifier(nn.Module):
    """A :class:`SentenceEncoder` and an MLP head (``mlp_layers`` hidden layers of ``mlp_hidden``, default the
    encoder's width) over ``inputs_per_example`` encoder outputs side by side: the classifiers' common part."""

    inputs_per_example = 1

    def __init__(self, encoder: SentenceEncoder, num_classes: int, *, mlp_hidden: int | None = None,
                 mlp_layers: int = 1, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        self.encoder = encoder
        d: int = encoder.out_dim
        self.head = MLP(self.inputs_per_example * d, mlp_hidden or d, num_classes, layers=mlp_layers,
                        activation=activation, dropout=dropout)


class SentenceClassifier(EncoderClassifier):
    """Sentence classifier: embeddings → context fusion → source2token pooling → MLP.

    ``forward(tokens, padding_mask)`` → class logits ``(B, num_classes)``."""

    def forward(self, tokens: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(tokens, padding_mask))
