"""Sentence-pair classification for NLI (MTSA §4.1, after Bowman et al. 2016): two parameter-tied
sentence encoders give ``s_p`` and ``s_h``; ``[s_p; s_h; s_p − s_h; s_p ⊙ s_h]`` → MLP → 3 classes."""

from __future__ import annotations

import torch
import torch.nn as nn

from .classifier import SentenceEncoder
from .heads import MLP

__all__ = ["PairClassifier"]


class PairClassifier(nn.Module):
    """NLI pair classifier: tied sentence encoders, [s_p; s_h; s_p − s_h; s_p ⊙ s_h] → MLP.

    ``forward(premise, premise_mask, hypothesis, hypothesis_mask)`` → logits ``(B, num_classes)``. One :class:`SentenceEncoder` encodes both sentences (tied parameters)."""

    def __init__(self, cfg, vocab_size: int, num_classes: int, *, pad_id: int = 0,
                 pretrained: torch.Tensor | None = None):
        super().__init__()
        self.encoder = SentenceEncoder(cfg, vocab_size, pad_id=pad_id, pretrained=pretrained)
        d = self.encoder.out_dim
        self.head = MLP(4 * d, cfg.mlp_hidden or d, num_classes, layers=cfg.mlp_layers, activation=cfg.activation,
                        dropout=cfg.dropout)

    def forward(self, premise: torch.Tensor, premise_mask: torch.Tensor, hypothesis: torch.Tensor,
                hypothesis_mask: torch.Tensor) -> torch.Tensor:
        s_p = self.encoder(premise, premise_mask)  # (B, d)
        s_h = self.encoder(hypothesis, hypothesis_mask)  # (B, d)
        return self.head(torch.cat([s_p, s_h, s_p - s_h, s_p * s_h], dim=-1))  # (B, 4d) → (B, classes)
