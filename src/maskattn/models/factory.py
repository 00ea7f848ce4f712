"""``build_model(cfg, vocab_size, num_classes)`` and the list of model types."""

from __future__ import annotations

import torch
import torch.nn as nn

from .classifier import SentenceClassifier
from .config import MODEL_TYPES, ModelConfig
from .pair import PairClassifier
from .tagger import SequenceTagger

__all__ = ["build_model", "list_models", "MODELS"]

MODELS = {"sentence": SentenceClassifier, "pair": PairClassifier, "tagger": SequenceTagger}
assert tuple(MODELS) == MODEL_TYPES


def list_models() -> dict[str, str]:
    """Model type → one-line description."""
    return {name: (cls.__doc__ or "").strip().split("\n")[0] for name, cls in MODELS.items()}


def build_model(cfg: ModelConfig, vocab_size: int, num_classes: int, *, pad_id: int = 0,
                pretrained: torch.Tensor | None = None) -> nn.Module:
    """Build the model described by ``cfg`` for a vocabulary of ``vocab_size`` and ``num_classes``
    classes (tags); ``pretrained``: an optional ``(vocab_size, embed_dim)`` embedding matrix."""
    if cfg.type not in MODELS:
        raise ValueError(f"unknown model.type {cfg.type!r}; expected one of {', '.join(MODELS)}")
    return MODELS[cfg.type](cfg, vocab_size, num_classes, pad_id=pad_id, pretrained=pretrained)
