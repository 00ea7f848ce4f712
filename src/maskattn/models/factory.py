"""``build_model(cfg, vocab_size, num_classes)`` and the list of model types."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import ConfigError
from .classifier import SentenceClassifier
from .config import MODEL_TYPES, ModelConfig
from .pair import PairClassifier
from .seq2seq import Seq2Seq
from .tagger import SequenceTagger

__all__ = ["build_model", "build_seq2seq", "list_models", "MODELS"]

MODELS = {"sentence": SentenceClassifier, "pair": PairClassifier, "tagger": SequenceTagger, "seq2seq": Seq2Seq}
assert tuple(MODELS) == MODEL_TYPES


def list_models() -> dict[str, str]:
    """Model type → one-line description."""
    return {name: (cls.__doc__ or "").strip().split("\n")[0] for name, cls in MODELS.items()}


def build_seq2seq(cfg: ModelConfig, vocab_size: int, *, pad_id: int = 0) -> Seq2Seq:
    """A :class:`Seq2Seq` over one joint vocabulary of ``vocab_size`` (source = target): layer recipes from
    ``cfg.preset`` (depths ``encoder_layers`` / ``decoder_layers``) or from ``cfg.encoder`` / ``cfg.decoder``."""
    options = dict(d_model=cfg.d_model, num_heads=cfg.num_heads, ffn_dim=cfg.ffn_dim, dropout=cfg.dropout,
                   attention_dropout=cfg.attention_dropout, norm=cfg.norm, positional=cfg.positional,
                   max_len=cfg.max_len, share_embeddings=cfg.share_embeddings, tie_output=cfg.tie_output,
                   pad_id=pad_id, backend=cfg.backend)
    if cfg.preset is not None:
        return Seq2Seq.from_preset(cfg.preset, vocab_size, vocab_size, encoder_layers=cfg.encoder_layers,
                                   decoder_layers=cfg.decoder_layers, **options)
    if cfg.decoder is None:
        raise ValueError(f"model.type seq2seq needs model.preset (one of {', '.join(Seq2Seq.PRESETS)}) or the "
                         "model.encoder and model.decoder layer recipes")
    if cfg.encoder_layers is not None or cfg.decoder_layers is not None:
        raise ValueError("model.encoder_layers / model.decoder_layers resize a preset; without model.preset write "
                         "the depth in the recipes (e.g. model.encoder='mha x3')")
    return Seq2Seq(vocab_size, vocab_size, encoder=cfg.encoder, decoder=cfg.decoder, **options)


def build_model(cfg: ModelConfig, vocab_size: int, num_classes: int, *, pad_id: int = 0,
                pretrained: torch.Tensor | None = None) -> nn.Module:
    """Build the model described by ``cfg`` for a vocabulary of ``vocab_size`` and ``num_classes``
    classes (tags; ignored by ``seq2seq``, whose output is the vocabulary); ``pretrained``: an optional
    ``(vocab_size, embed_dim)`` embedding matrix (classifiers only)."""
    if cfg.type not in MODELS:
        raise ValueError(f"unknown model.type {cfg.type!r}; expected one of {', '.join(MODELS)}")
    if cfg.pretrained is not None:
        raise ConfigError(f"model.pretrained {cfg.pretrained!r}: a pretrained encoder brings its own tokenizer and "
                          "vocabulary; build it with maskattn.models.build_pretrained(cfg, num_classes)")
    if cfg.type == "seq2seq":
        if pretrained is not None:
            raise ValueError("pretrained vectors (data.vectors) are not supported for seq2seq models")
        return build_seq2seq(cfg, vocab_size, pad_id=pad_id)
    return MODELS[cfg.type](cfg, vocab_size, num_classes, pad_id=pad_id, pretrained=pretrained)
