"""Sentence-pair classification for NLI (MTSA §4.1, after Bowman et al. 2016): two parameter-tied
sentence encoders give ``s_p`` and ``s_h``; ``[s_p; s_h; s_p − s_h; s_p ⊙ s_h]`` → MLP → 3 classes."""

from __future__ import annotations

import torch

from .classifier import EncoderClassifier

__all__ = ["PairClassifier"]


class PairClassifier(EncoderClassifier):
    """NLI pair classifier: tied sentence encoders, [s_p; s_h; s_p − s_h; s_p ⊙ s_h] → MLP.

    ``forward(premise, premise_mask, hypothesis, hypothesis_mask)`` → logits ``(B, num_classes)``. One :class:`SentenceEncoder` encodes both sentences (tied parameters)."""

    inputs_per_example = 4  # [s_p; s_h; s_p − s_h; s_p ⊙ s_h]

    def forward(self, premise: torch.Tensor, premise_mask: torch.Tensor, hypothesis: torch.Tensor,
                hypothesis_mask: torch.Tensor) -> torch.Tensor:
        s_p = self.encoder(premise, premise_mask)  # (B, d)
        s_h = self.encoder(hypothesis, hypothesis_mask)  # (B, d)
        return self.head(torch.cat([s_p, s_h, s_p - s_h, s_p * s_h], dim=-1))  # (B, 4d) → (B, classes)
