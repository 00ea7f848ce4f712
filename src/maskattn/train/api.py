"""The toolkit's entry points: train a configuration (or every fold of a cross-validation), load a trained
model, evaluate it on a labelled file, predict labels for raw text; for translation checkpoints load a
:class:`Translator` and score a source file against a reference file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch.nn as nn
from rich.console import Console

from ..data.batching import encode_examples
from ..data.examples import PairExample, TextExample
from ..data.readers import READERS, tokenize
from ..data.vocab import LabelSet, Vocabulary
from ..data.parallel import read_parallel
from ..models.factory import build_model
from ..translation import Translator, corpus_scores
from .checkpoint import Checkpoint, load_checkpoint
from .config import RunConfig, from_dict
from .crossval import cross_validate
from .evaluation import evaluate, predict_ids
from .tasks import subword_from_checkpoint
from .trainer import Trainer, load_weights, resolve_device

__all__ = ["train", "resume", "cross_validate", "LoadedModel", "load_model", "evaluate_file", "predict",
           "load_translator", "evaluate_translation"]


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


def _read_checkpoint(path: str | Path | Checkpoint) -> Checkpoint:
    """``path`` read with :func:`load_checkpoint`, or the already read :class:`Checkpoint` itself."""
    return path if isinstance(path, Checkpoint) else load_checkpoint(path)


def load_model(path: str | Path | Checkpoint, *, device: str = "cpu") -> LoadedModel:
    """Rebuild the (classification) model of a checkpoint (a file, or a :class:`Checkpoint` already read)
    from its own configuration and vocabulary, and load the weights. A translation checkpoint raises
    ``ValueError`` pointing to :func:`load_translator`."""
    ckpt = _read_checkpoint(path)
    if ckpt.model_type == "seq2seq":
        raise ValueError(f"checkpoint {ckpt.path} holds a translation (seq2seq) model; use `maskattn translate` or "
                         "`maskattn eval --src FILE --ref FILE` (Python: load_translator)")
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



def _translation_checkpoint(path: str | Path | Checkpoint) -> Checkpoint:
    ckpt = _read_checkpoint(path)
    if ckpt.model_type != "seq2seq":
        raise ValueError(f"checkpoint {ckpt.path} holds a {ckpt.model_type!r} model, not a translation model "
                         "(model.type seq2seq); use `maskattn predict` or `maskattn eval --data FILE` for it")
    return ckpt


def load_translator(path: str | Path | Checkpoint, *, device: str = "cpu") -> Translator:
    """A :class:`~maskattn.translation.Translator` from a translation checkpoint (a file, or a
    :class:`Checkpoint` already read): its own configuration, subword model and weights."""
    ckpt = _translation_checkpoint(path)
    cfg = from_dict(RunConfig, ckpt.config)
    subword = subword_from_checkpoint(ckpt)
    model = build_model(cfg.model, len(subword), 0)
    load_weights(model, ckpt)
    torch_device = resolve_device(device)
    return Translator(model.to(torch_device).eval(), subword, max_len=cfg.data.max_len or cfg.model.max_len,
                      device=torch_device)


def evaluate_translation(path: str | Path | Translator, src_file: str | Path, ref_file: str | Path, *,
                         beam: int = 5, length_penalty: float = 0.6, batch_size: int = 64, device: str = "cpu",
                         on_truncate=None) -> dict:
    """Translate ``src_file`` line by line and score it against ``ref_file`` (line-aligned; different line
    counts raise ``ValueError``): sacreBLEU BLEU and chrF with their signatures."""
    translator = path if isinstance(path, Translator) else load_translator(path, device=device)
    text = read_parallel(src_file, ref_file)
    hypotheses = translator.translate(text.source, beam=beam, length_penalty=length_penalty, batch_size=batch_size,
                                      on_truncate=on_truncate)
    return corpus_scores(hypotheses, text.target)
