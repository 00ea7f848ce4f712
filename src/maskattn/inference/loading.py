"""Rebuilding a trained model from its checkpoint alone: a classifier (:func:`load_model`) or a translator
(:func:`load_translator`), each from the checkpoint's own configuration, vocabulary (or subword model) and
weights."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import torch.nn as nn

from ..checkpoint import Checkpoint, load_checkpoint, load_weights
from ..configuration import from_dict
from ..data.config import DataConfig
from ..data.subword import SubwordModel
from ..data.vocab import LabelSet, Vocabulary
from ..errors import CheckpointError, ConfigError
from ..models.config import ModelConfig
from ..models.factory import build_model
from .classification import input_limit
from .device import resolve_device
from .translator import Translator

__all__ = ["ModelSettings", "LoadedModel", "load_model", "load_translator", "subword_from_checkpoint"]


@dataclass(frozen=True)
class ModelSettings:
    """The sections of a checkpoint's run configuration that say how to feed its model text: ``data``
    (tokenisation, lengths, format) and ``model`` (what was built)."""

    data: DataConfig
    model: ModelConfig


@dataclass
class LoadedModel:
    """A classifier (sentence, pair or tagger model) rebuilt from a checkpoint, with what is needed to feed it
    text."""

    model: nn.Module
    config: ModelSettings
    vocab: Vocabulary
    labels: LabelSet
    step: int

    @property
    def input_limit(self) -> int | None:
        """The most tokens of a sentence the model reads (:func:`~.classification.input_limit`)."""
        return input_limit(self.config.data, self.config.model)


def _read(path: str | Path | Checkpoint) -> Checkpoint:
    """``path`` read with :func:`load_checkpoint`, or the already read :class:`Checkpoint` itself."""
    return path if isinstance(path, Checkpoint) else load_checkpoint(path)


def _settings(ckpt: Checkpoint) -> ModelSettings:
    try:
        return ModelSettings(from_dict(DataConfig, ckpt.config.get("data"), "data"),
                             from_dict(ModelConfig, ckpt.config.get("model"), "model"))
    except ConfigError as exc:
        raise CheckpointError(f"checkpoint {ckpt.path} holds a configuration this version of maskattn rejects: "
                              f"{exc}") from None


def load_model(path: str | Path | Checkpoint, *, device: str = "cpu") -> LoadedModel:
    """Rebuild the classification model of a checkpoint (a file, or a :class:`Checkpoint` already read) from
    its own configuration and vocabulary, and load the weights. A translation checkpoint raises
    :class:`CheckpointError` pointing to :func:`load_translator`."""
    ckpt = _read(path)
    if ckpt.model_type == "seq2seq":
        raise CheckpointError(f"checkpoint {ckpt.path} holds a translation (seq2seq) model; use `maskattn translate` "
                              "or `maskattn eval --src FILE --ref FILE` (Python: load_translator)")
    settings = _settings(ckpt)
    vocab, labels = Vocabulary(ckpt.vocab), LabelSet(ckpt.labels)
    model = build_model(settings.model, len(vocab), len(labels), pad_id=Vocabulary.pad_id)
    load_weights(model, ckpt)
    return LoadedModel(model.to(resolve_device(device)).eval(), settings, vocab, labels, ckpt.step)


def subword_from_checkpoint(ckpt: Checkpoint) -> SubwordModel:
    """The subword model stored in a translation checkpoint."""
    encoded = ckpt.extra.get("subword_model")
    if not encoded:
        raise CheckpointError(f"checkpoint {ckpt.path} holds no subword model (not a translation checkpoint?)")
    return SubwordModel(base64.b64decode(encoded))


def load_translator(path: str | Path | Checkpoint, *, device: str = "cpu") -> Translator:
    """A :class:`Translator` from a translation checkpoint (a file, or a :class:`Checkpoint` already read): its
    own configuration, subword model and weights. Another kind of checkpoint raises :class:`CheckpointError`."""
    ckpt = _read(path)
    if ckpt.model_type != "seq2seq":
        raise CheckpointError(f"checkpoint {ckpt.path} holds a {ckpt.model_type!r} model, not a translation model "
                              "(model.type seq2seq); use `maskattn predict` or `maskattn eval --data FILE` for it")
    settings = _settings(ckpt)
    subword = subword_from_checkpoint(ckpt)
    model = build_model(settings.model, len(subword), 0)
    load_weights(model, ckpt)
    torch_device = resolve_device(device)
    return Translator(model.to(torch_device).eval(), subword,
                      max_len=settings.data.max_len or settings.model.max_len, device=torch_device)
