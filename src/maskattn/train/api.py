"""The toolkit's entry points: train a configuration, load a trained model, evaluate it on a labelled
file, predict labels for raw text."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch.nn as nn
from rich.console import Console

from ..data.batching import encode_examples
from ..data.examples import PairExample, TextExample
from ..data.readers import READERS, tokenize
from ..data.vocab import LabelSet, Vocabulary
from ..models.factory import build_model
from .checkpoint import load_checkpoint
from .config import RunConfig, from_dict
from .evaluation import evaluate, predict_ids
from .trainer import Trainer, load_weights, resolve_device

__all__ = ["train", "resume", "LoadedModel", "load_model", "evaluate_file", "predict"]


def train(cfg: RunConfig, *, console: Console | None = None) -> dict:
    """Train ``cfg`` and return the summary of :meth:`Trainer.fit`."""
    return Trainer(cfg, console=console).fit()


def resume(path: str | Path, *, train_overrides: dict | None = None, console: Console | None = None) -> dict:
    """Continue the run saved in the resumable checkpoint ``path`` (its ``last.safetensors``)."""
    return Trainer.resume(path, train_overrides=train_overrides, console=console).fit()


@dataclass
class LoadedModel:
    """A model rebuilt from a checkpoint, with what is needed to feed it text."""

    model: nn.Module
    config: RunConfig
    vocab: Vocabulary
    labels: LabelSet
    step: int


def load_model(path: str | Path, *, device: str = "cpu") -> LoadedModel:
    """Rebuild the model of a checkpoint from its own configuration and vocabulary, and load the weights."""
    ckpt = load_checkpoint(path)
    cfg = from_dict(RunConfig, ckpt.config)
    vocab, labels = Vocabulary(ckpt.vocab), LabelSet(ckpt.labels)
    model = build_model(cfg.model, len(vocab), len(labels), pad_id=Vocabulary.pad_id)
    load_weights(model, ckpt)
    return LoadedModel(model.to(resolve_device(device)).eval(), cfg, vocab, labels, ckpt.step)


def evaluate_file(path: str | Path, data_file: str | Path, *, format: str | None = None, batch_size: int = 256,
                  device: str = "cpu") -> dict[str, float]:
    """Metrics of a checkpoint on a labelled file (``format`` defaults to the checkpoint's data format)."""
    loaded = load_model(path, device=device)
    fmt = format or loaded.config.data.format
    if fmt not in READERS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(READERS)}")
    examples = READERS[fmt](data_file, labels=loaded.labels.itos, lowercase=loaded.config.data.lowercase)
    items = encode_examples(examples, loaded.vocab, loaded.labels, max_len=loaded.config.data.max_len)
    return evaluate(loaded.model, items, loaded.labels, batch_size=batch_size, device=resolve_device(device))


def predict(path: str | Path | LoadedModel, texts: list[str], *, batch_size: int = 256,
            device: str = "cpu") -> list:
    """Labels for raw sentences (whitespace-tokenised as in training): one label per sentence, or one tag
    per token for a tagger. Pair models take ``"premise ||| hypothesis"`` strings."""
    loaded = path if isinstance(path, LoadedModel) else load_model(path, device=device)
    cfg = loaded.config
    if not texts:
        return []
    examples = []
    for i, text in enumerate(texts):
        if cfg.model.type == "pair":
            if "|||" not in text:
                raise ValueError(f"input {i + 1}: a pair model needs 'premise ||| hypothesis', got {text[:60]!r}")
            premise, hypothesis = text.split("|||", 1)
            examples.append(PairExample(tokenize(premise, lowercase=cfg.data.lowercase),
                                        tokenize(hypothesis, lowercase=cfg.data.lowercase), ""))
        else:
            examples.append(TextExample(tokenize(text, lowercase=cfg.data.lowercase), ""))
        if len(examples[-1]) == 0 or (cfg.model.type == "pair" and not all((examples[-1].premise,
                                                                             examples[-1].hypothesis))):
            raise ValueError(f"input {i + 1} is empty")
    items = encode_examples(examples, loaded.vocab, None, max_len=cfg.data.max_len)
    ids = predict_ids(loaded.model, items, batch_size=batch_size, device=resolve_device(device))
    return [loaded.labels.decode(p) if isinstance(p, list) else loaded.labels.itos[p] for p in ids]

