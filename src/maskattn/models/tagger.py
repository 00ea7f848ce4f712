"""Sequence tagging (per-token labels, e.g. BIO chunks as in MTSA §4.2's SRL setup):
embeddings → context fusion → per-token MLP."""

from __future__ import annotations

import torch

from .classifier import EncoderClassifier

__all__ = ["SequenceTagger"]


class SequenceTagger(EncoderClassifier):
    """Sequence tagger (BIO): embeddings → context fusion → per-token MLP.

    ``forward(tokens, padding_mask)`` → tag logits ``(B, n, num_tags)`` (padded positions are
    ignored by the loss)."""

    def forward(self, tokens: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder.tokens(tokens, padding_mask))
