"""Rebuilding a trained model from its checkpoint: a classifier (:func:`load_model`) or a translator
(:func:`load_translator`), each from the checkpoint's own configuration, vocabulary (or subword model) and
weights. A classifier on a pretrained encoder (``model.pretrained``) is rebuilt from that model folder and its
tokenizer, with the recorded conversions replayed, before the checkpoint's weights are loaded."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast
from pathlib import Path

import torch.nn as nn

from ..checkpoint import Checkpoint, load_checkpoint, load_weights
from ..sections import from_dict
from ..data.batching import encode_examples
from ..data.config import DataConfig
from ..data.examples import Example
from ..data.pretrained import encode_with_tokenizer, tokenizer_fingerprint
from ..data.subword import SubwordModel
from ..data.vocab import LabelSet, Vocabulary
from ..errors import CheckpointError, ConfigError
from ..metrics import input_limit, pretrained_input_limit
from ..models.config import ModelConfig
from ..models.factory import build_model
from ..models.seq2seq import Seq2Seq
from ..models.pretrained import PretrainedClassifier, build_pretrained
from ..device import resolve_device
from .decoding import DecodingOptions
from .translator import Translator

__all__ = ["ModelSettings", "LoadedModel", "load_model", "load_translator", "subword_from_checkpoint", "fixed_rows_of",
           "check_tokenizer"]


@dataclass(frozen=True)
class ModelSettings:
    """The sections of a checkpoint's run configuration that say how to feed its model text: ``data``
    (tokenisation, lengths, format) and ``model`` (what was built)."""

    data: DataConfig
    model: ModelConfig


@dataclass
class LoadedModel:
    """A classifier (sentence, pair or tagger model) rebuilt from a checkpoint, with what is needed to feed it
    text: its vocabulary, or the tokenizer of its pretrained encoder (then ``vocab`` is None)."""

    model: nn.Module
    config: ModelSettings
    vocab: Vocabulary | None
    labels: LabelSet
    step: int
    tokenizer: object = None

    @property
    def input_limit(self) -> int:
        """The most tokens of a sentence the model reads (:func:`maskattn.metrics.input_limit`; for a pretrained
        encoder :func:`maskattn.metrics.pretrained_input_limit`, in its tokenizer's tokens)."""
        if isinstance(self.model, PretrainedClassifier):  # the model of a checkpoint with a tokenizer
            return pretrained_input_limit(self.config.data, self.model.max_tokens)
        return input_limit(self.config.data, self.config.model)

    def encode(self, examples: Sequence[Example], labels: LabelSet | None = None) -> tuple[list[dict], list[int]]:
        """The model's input items for ``examples`` (with ``labels``: their label ids too), cut to
        :attr:`input_limit`, and the positions in ``examples`` of those that were cut."""
        limit = self.input_limit
        if self.tokenizer is not None:
            encoded = encode_with_tokenizer(examples, self.tokenizer, labels, max_len=limit)
            return encoded.items, encoded.truncated
        if self.vocab is None:
            raise CheckpointError("this checkpoint holds neither a vocabulary nor a tokenizer")
        truncated = [i for i, e in enumerate(examples) if len(e) > limit]
        return encode_examples(examples, self.vocab, labels, max_len=limit), truncated


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
        raise CheckpointError(f"checkpoint {ckpt.path} holds a seq2seq (translation or summarization) model; use "
                              "`maskattn generate` (or its other name, `maskattn translate`) or `maskattn eval --src FILE "
                              "--ref FILE` (Python: load_translator)")
    settings = _settings(ckpt)
    labels = LabelSet(ckpt.labels)
    if settings.model.pretrained is not None:
        model, tokenizer = build_pretrained(settings.model, len(labels), replay=True)
        check_tokenizer(ckpt, tokenizer)
        vocab = None
    else:
        vocab, tokenizer = Vocabulary(ckpt.vocab), None
        model = build_model(settings.model, len(vocab), len(labels), pad_id=Vocabulary.pad_id,
                            fixed_rows=fixed_rows_of(ckpt))
    load_weights(model, ckpt)
    return LoadedModel(model.to(resolve_device(device)).eval(), settings, vocab, labels, ckpt.step, tokenizer)


def check_tokenizer(ckpt: Checkpoint, tokenizer) -> None:
    """The tokenizer of the checkpoint's ``model.pretrained`` folder must be the one it was trained with (its
    fingerprint, :func:`~maskattn.data.pretrained.tokenizer_fingerprint`), else :class:`CheckpointError`."""
    if ckpt.extra.get("tokenizer_sha256") != tokenizer_fingerprint(tokenizer):
        raise CheckpointError(f"checkpoint {ckpt.path} was trained with another tokenizer than the one in "
                              f"model.pretrained {ckpt.config['model']['pretrained']!r} now; use the model folder "
                              "it was trained with")


def fixed_rows_of(ckpt: Checkpoint) -> int:
    """How many rows at the end of a classifier checkpoint's vocabulary are fixed word vectors (words of the
    evaluation data that only the vectors file knew, ``data.vectors_extend``); 0 for checkpoints without."""
    rows = ckpt.extra.get("fixed_rows", 0)
    if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows < len(ckpt.vocab):
        raise CheckpointError(f"checkpoint {ckpt.path} records {rows!r} fixed vocabulary rows for a vocabulary of "
                              f"{len(ckpt.vocab)}; the file is not one maskattn wrote")
    return rows


def subword_from_checkpoint(ckpt: Checkpoint) -> SubwordModel:
    """The subword model stored in a translation checkpoint."""
    encoded = ckpt.extra.get("subword_model")
    if not encoded:
        raise CheckpointError(f"checkpoint {ckpt.path} holds no subword model (not a translation checkpoint?)")
    return SubwordModel(base64.b64decode(encoded))


def load_translator(path: str | Path | Checkpoint, *, device: str = "cpu") -> Translator:
    """A :class:`Translator` from a seq2seq (translation or summarization) checkpoint (a file, or a
    :class:`Checkpoint` already read): its own configuration, subword model, weights, unknown-word spellings and
    decoding settings (those of its run's test decoding, :meth:`DecodingOptions.from_config`). Another kind of
    checkpoint raises :class:`CheckpointError`."""
    ckpt = _read(path)
    if ckpt.model_type != "seq2seq":
        raise CheckpointError(f"checkpoint {ckpt.path} holds a {ckpt.model_type!r} model, not a translation model "
                              "(model.type seq2seq); use `maskattn predict` or `maskattn eval --data FILE` for it")
    settings = _settings(ckpt)
    subword = subword_from_checkpoint(ckpt)
    model = cast(Seq2Seq, build_model(settings.model, len(subword), 0))  # model.type seq2seq
    load_weights(model, ckpt)
    torch_device = resolve_device(device)
    try:
        decoding = DecodingOptions.from_config(ckpt.config.get("train") or {})
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {ckpt.path} holds decoding settings this version of maskattn rejects: "
                              f"{exc}") from None
    return Translator(model.to(torch_device).eval(), subword, max_len=settings.data.max_len or settings.model.max_len,
                      device=torch_device, decoding=decoding, unk_tokens=settings.data.unk_tokens,
                      task=settings.data.format)
