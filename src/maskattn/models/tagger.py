"""Sequence tagging (per-token labels, e.g. BIO chunks as in MTSA §4.2's SRL setup):
embeddings → context fusion → per-token MLP."""

from __future__ import annotations

import torch
import torch.nn as nn

from .classifier import SentenceEncoder
from .heads import MLP

__all__ = ["SequenceTagger"]


class SequenceTagger(nn.Module):
    """Sequence tagger (BIO): embeddings → context fusion → per-token MLP.

    ``forward(tokens, padding_mask)`` → tag logits ``(B, n, num_tags)`` (padded positions are
    ignored by the loss)."""

    def __init__(self, cfg, vocab_size: int, num_classes: int, *, pad_id: int = 0,
                 pretrained: torch.Tensor | None = None):
        super().__init__()
        self.encoder = SentenceEncoder(cfg, vocab_size, pad_id=pad_id, pretrained=pretrained, pool=False)
        d = self.encoder.out_dim
        self.head = MLP(d, cfg.mlp_hidden or d, num_classes, layers=cfg.mlp_layers, activation=cfg.activation,
                        dropout=cfg.dropout)

    def forward(self, tokens: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder.tokens(tokens, padding_mask))
