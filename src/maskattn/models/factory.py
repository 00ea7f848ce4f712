"""The one place where a :class:`~maskattn.models.config.ModelConfig` becomes modules: ``build_model(cfg,
vocab_size, num_classes)`` and the list of model types. The modules themselves take explicit arguments."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..errors import ConfigError
from .classifier import SentenceClassifier, SentenceEncoder
from .config import MODEL_TYPES, ModelConfig
from .embedding import PretrainedRows, TokenEmbedding
from .fusion import BASELINES, RecipeFusion, list_fusions
from .pair import PairClassifier
from .seq2seq import Seq2Seq
from .tagger import SequenceTagger

__all__ = ["build_model", "build_seq2seq", "build_sentence_encoder", "stack_options", "embedding_scale", "list_models",
           "MODELS"]

MODELS = {"sentence": SentenceClassifier, "pair": PairClassifier, "tagger": SequenceTagger, "seq2seq": Seq2Seq}
assert tuple(MODELS) == MODEL_TYPES


def list_models() -> dict[str, str]:
    """Model type → one-line description."""
    return {name: (cls.__doc__ or "").strip().split("\n")[0] for name, cls in MODELS.items()}


def stack_options(cfg: ModelConfig) -> dict:
    """The keywords a layer stack takes from the model section — for a classifier's recipe encoder and for both
    stacks of a Seq2Seq alike."""
    return dict(ffn_dim=cfg.ffn_dim, dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, norm=cfg.norm,
                backend=cfg.backend, positional=cfg.positional, max_len=cfg.max_len)


def embedding_scale(cfg: ModelConfig) -> float:
    """``cfg.embed_scale``, or by default ``√d_model`` before sinusoidal positions and 1 otherwise (a run configuration
    with pretrained vectors, ``data.vectors``, sets ``embed_scale`` 1: :class:`~maskattn.train.RunConfig`)."""
    if cfg.embed_scale is not None:
        return float(cfg.embed_scale)
    return math.sqrt(cfg.d_model) if cfg.positional == "sinusoidal" else 1.0


def _fusion(cfg: ModelConfig) -> nn.Module:
    """The context fusion: a baseline (``model.encoder_options``) or a layer-recipe encoder."""
    if isinstance(cfg.encoder, str) and cfg.encoder.strip() in BASELINES:
        try:
            return BASELINES[cfg.encoder.strip()](cfg.d_model, **cfg.encoder_options)
        except TypeError as exc:
            raise ConfigError(f"model.encoder_options {cfg.encoder_options} do not fit {cfg.encoder!r}: {exc}") \
                from None
    if cfg.encoder_options:
        raise ConfigError(f"model.encoder_options only apply to the baselines {list_fusions()}; for the recipe "
                          f"{cfg.encoder!r} write options inline, e.g. 'csan1d(window=5)'")
    return RecipeFusion(cfg.d_model, cfg.encoder, num_heads=cfg.num_heads, ffn=cfg.ffn, **stack_options(cfg))


def build_sentence_encoder(cfg: ModelConfig, vocab_size: int, *, pad_id: int = 0,
                           pretrained: torch.Tensor | PretrainedRows | None = None, fixed_rows: int | None = None,
                           pool: bool = True) -> SentenceEncoder:
    """Embeddings → context fusion → pooling (``pool``; taggers take the tokens) as the model section describes;
    ``pretrained`` / ``fixed_rows``: :class:`~maskattn.models.embedding.TokenEmbedding`'s."""
    if pool and cfg.pooling == "cls":
        raise ConfigError("model.pool 'cls' takes the first token, the [CLS] token of a pretrained encoder "
                          "(model.pretrained); maskattn's own encoders have none: use source2token, mean or max")
    embed = TokenEmbedding(vocab_size, cfg.d_model, embed_dim=cfg.embed_dim, pad_id=pad_id,
                           dropout=cfg.dropout if cfg.embed_dropout is None else cfg.embed_dropout,
                           pretrained=pretrained, fixed_rows=fixed_rows, freeze=cfg.freeze_embeddings,
                           scale=embedding_scale(cfg),
                           init=cfg.embed_init)
    return SentenceEncoder(embed, _fusion(cfg), cfg.pooling if pool else None)


def build_seq2seq(cfg: ModelConfig, vocab_size: int, *, pad_id: int = 0) -> Seq2Seq:
    """A :class:`Seq2Seq` over one joint vocabulary of ``vocab_size`` (source = target): layer recipes from
    ``cfg.architecture`` (depths ``encoder_layers`` / ``decoder_layers``) or from ``cfg.encoder`` / ``cfg.decoder``."""
    options = dict(d_model=cfg.d_model, num_heads=cfg.num_heads, share_embeddings=cfg.share_embeddings,
                   tie_output=cfg.tie_output, pad_id=pad_id, **stack_options(cfg))
    if cfg.architecture is not None:
        return Seq2Seq.from_architecture(cfg.architecture, vocab_size, vocab_size, encoder_layers=cfg.encoder_layers,
                                         decoder_layers=cfg.decoder_layers, **options)
    if cfg.decoder is None:
        raise ConfigError(f"model.type seq2seq needs model.architecture (one of {', '.join(Seq2Seq.ARCHITECTURES)}) "
                          "or the model.encoder and model.decoder layer recipes")
    if cfg.encoder_layers is not None or cfg.decoder_layers is not None:
        raise ConfigError("model.encoder_layers / model.decoder_layers resize an architecture; without "
                          "model.architecture write the depth in the recipes (e.g. model.encoder='mha x3')")
    return Seq2Seq(vocab_size, vocab_size, encoder=cfg.encoder, decoder=cfg.decoder, **options)


def build_model(cfg: ModelConfig, vocab_size: int, num_classes: int, *, pad_id: int = 0,
                pretrained: torch.Tensor | PretrainedRows | None = None, fixed_rows: int | None = None) -> nn.Module:
    """Build the model described by ``cfg`` for a vocabulary of ``vocab_size`` and ``num_classes``
    classes (tags; ignored by ``seq2seq``, whose output is the vocabulary); ``pretrained``: an optional
    ``(vocab_size, embed_dim)`` embedding matrix or :class:`~maskattn.models.embedding.PretrainedRows`
    (classifiers only); ``fixed_rows``: the untrained rows at the end of the vocabulary (default: those of
    ``pretrained``)."""
    if cfg.pretrained is not None:
        raise ConfigError(f"model.pretrained {cfg.pretrained!r}: a pretrained encoder brings its own tokenizer and "
                          "vocabulary; build it with maskattn.models.build_pretrained(cfg, num_classes)")
    if cfg.type == "seq2seq":
        if pretrained is not None or fixed_rows:
            raise ConfigError("pretrained vectors (data.vectors) are not supported for seq2seq models")
        return build_seq2seq(cfg, vocab_size, pad_id=pad_id)
    encoder = build_sentence_encoder(cfg, vocab_size, pad_id=pad_id, pretrained=pretrained, fixed_rows=fixed_rows,
                                     pool=cfg.type != "tagger")
    return MODELS[cfg.type](encoder, num_classes, mlp_hidden=cfg.mlp_hidden, mlp_layers=cfg.mlp_layers,
                            activation=cfg.activation, dropout=cfg.dropout)
