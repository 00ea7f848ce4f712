"""Tasks: what the :class:`~maskattn.train.Trainer` loop needs to know about a kind of model.

A task builds the data, the batch sampler and the model, computes the summed training loss of a batch,
evaluates a split, and says what a checkpoint must carry to feed the model text later. The loop itself
(optimiser, schedule, clipping, AMP, DDP, evaluation cadence, checkpoints, resume, metrics files) is shared.

* :class:`ClassificationTask` — sentence / pair classifiers and taggers (``model.type`` ``sentence``,
  ``pair``, ``tagger``): example batches of ``train.batch_size``, cross-entropy, accuracy / F1.
* :class:`PretrainedClassificationTask` — the same on a pretrained Hugging Face encoder (``model.pretrained``),
  the text encoded by that model's tokenizer.
* :class:`TranslationTask` — ``model.type: seq2seq`` on parallel text: joint subword model, batches of at
  most ``data.max_tokens`` tokens, label-smoothed cross-entropy per target token, dev loss / perplexity and
  sacreBLEU BLEU / chrF of greedy or beam decoding.
"""

from __future__ import annotations

import base64
import hashlib
import math
from pathlib import Path
from collections.abc import Callable
from typing import Protocol, cast

import torch
import torch.nn as nn

from ..checkpoint import Checkpoint
from ..data.batching import IGNORE_INDEX, BucketBatchSampler, collate
from ..data.parallel import (ParallelText, TokenBatchSampler, collate_pairs, encode_pairs, parallel_paths,
                             read_parallel)
from ..data.pipeline import PreparedData, prepare_data, prepare_pretrained_data
from ..data.pretrained import tokenizer_fingerprint
from ..data.subword import PAD_ID, SUBWORD_TYPES, SubwordModel
from ..data.vocab import LabelSet, Vocabulary
from ..errors import ArgumentError, CheckpointError, ConfigError
from ..inference import Translator, check_tokenizer, subword_from_checkpoint
from ..device import check_memory
from ..metrics import corpus_scores, evaluate, input_limit, item_length, pretrained_input_limit, summed_loss
from ..models.factory import build_model
from ..models.memory import estimate_before_building, model_memory_bytes
from ..models.seq2seq import Seq2Seq
from ..models.pretrained import PretrainedClassifier, encoder_max_tokens, load_pretrained_encoder
from .config import RunConfig

__all__ = ["Task", "ClassificationTask", "PretrainedClassificationTask", "TranslationTask", "build_task"]

TRANSLATION_LABEL_SMOOTHING = 0.1  # default ε for translation (Vaswani et al. 2017 §5.4)


class Task(Protocol):
    """The interface the trainer uses."""

    unit: str  # what throughput counts: "examples" or "tokens" (target tokens)
    model: nn.Module

    @property
    def metrics(self) -> tuple[str, ...]:
        """Dev metrics that ``train.metric`` may select."""

    @property
    def sampler(self) -> BucketBatchSampler | TokenBatchSampler:
        """The train split's batch sampler (its state goes into checkpoints)."""

    def loss_terms(self, indices: list[int]) -> int:
        """Number of loss terms in the batch (the normaliser of the mean loss)."""

    def throughput_units(self, indices: list[int]) -> int:
        """Examples / target tokens in the batch (for the ``*_per_s`` figures)."""

    def loss_sum(self, module: nn.Module, indices: list[int]) -> torch.Tensor:
        """Summed training loss of the train items ``indices`` (a scalar on the device)."""

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """Metrics of ``model`` on ``dev`` or ``test``."""

    def has_split(self, split: str) -> bool:
        """Is there data for ``split``?"""

    def checkpoint_fields(self) -> dict:
        """Keyword arguments ``vocab``, ``labels``, ``extra`` of :func:`save_checkpoint`."""

    def data_summary(self) -> dict:
        """Facts about the prepared data for the run summary (may be empty)."""


def _label_smoothing(cfg: RunConfig, default: float) -> float:
    eps = default if cfg.optim.label_smoothing is None else cfg.optim.label_smoothing
    if not 0.0 <= eps < 1.0:
        raise ArgumentError(f"optim.label_smoothing must be in [0, 1), got {eps!r}")
    return eps


def truncation_notices(truncated: dict[str, int], limit: int, source: str) -> list[str]:
    """One warning counting the examples of every split cut to ``limit`` tokens (``source``: where the limit
    comes from); none when nothing was cut."""
    if not truncated:
        return []
    counts = ", ".join(f"{count} {split}" for split, count in truncated.items())
    return [f"{sum(truncated.values())} example(s) longer than {limit} tokens ({counts}) were truncated to their first "
            f"{limit} tokens (the limit: {source}); set data.max_len to change it"]


def check_training_memory(model: nn.Module, batch: int, length: int, device: torch.device, *, what: str,
                          advice: str) -> None:
    """Refuse (:class:`~maskattn.errors.MemoryLimitError`) a run whose largest training step — ``batch``
    sequences of ``length`` (``what`` says where they come from) — is estimated with the model's weights, gradients
    and optimiser state (:func:`~maskattn.models.memory.model_memory_bytes`) above the memory budget. ``model`` is
    built on the ``meta`` device (:func:`~maskattn.models.memory.estimate_before_building`): this runs before the
    real model takes any memory."""
    estimate = model_memory_bytes(model, batch, length, training=True, parameters=True)
    check_memory(estimate, device=device, what=f"a training step on {what} with this model (its weights, gradients "
                 "and optimiser state included)", advice=advice)


def _check_classifier_memory(items: list[dict], batch_size: int, device: torch.device) -> Callable[[nn.Module], None]:
    """:func:`check_training_memory` of ``batch_size`` items as long as the longest train item."""
    length = max((item_length(item) for item in items), default=1)
    batch = max(1, min(batch_size, len(items)))
    return lambda model: check_training_memory(
        model, batch, length, device, what=f"{batch} sentences of {length} tokens (train.batch_size, the longest "
        "train sentence)", advice="lower data.max_len, train.batch_size or the model's size (model.d_model, layers)")


def _check_translation_memory(items: list[dict], max_tokens: int, device: torch.device
                              ) -> Callable[[nn.Module], None]:
    """:func:`check_training_memory` of the batch of the longest train pairs (``data.max_tokens`` padded tokens)."""
    length = max((max(len(item["src"]), len(item["tgt"])) for item in items), default=1)
    batch = max(1, max_tokens // length)
    return lambda model: check_training_memory(
        model, batch, length, device, what=f"{batch} pairs of {length} subwords (data.max_tokens, the longest train "
        "pair)", advice="lower data.max_len, data.max_tokens or the model's size (model.d_model, layers)")


class ClassificationTask:
    """Sentence / pair classification and tagging on the readers of :mod:`maskattn.data`."""

    unit = "examples"

    def __init__(self, cfg: RunConfig, device: torch.device, checkpoint: Checkpoint | None = None):
        self.metrics = ("accuracy", "f1", "loss") if cfg.model.type == "tagger" else ("accuracy", "loss")
        if cfg.data.format == "parallel":
            raise ArgumentError(f"data.format 'parallel' is translation data; set model.type=seq2seq (model.type is "
                             f"{cfg.model.type!r})")
        self.cfg, self.device = cfg, device
        self.label_smoothing = _label_smoothing(cfg, 0.0)
        vocab = Vocabulary(checkpoint.vocab) if checkpoint else None
        labels = LabelSet(checkpoint.labels) if checkpoint else None
        limit = input_limit(cfg.data, cfg.model)
        self.data: PreparedData = prepare_data(cfg.data, vocab=vocab, labels=labels,
                                               embed_dim=cfg.model.embed_dim or cfg.model.d_model,
                                               max_len=limit)
        assert self.data.vocab is not None  # prepare_data builds one (only a tokenizer's data has none)
        self.vocab: Vocabulary = self.data.vocab
        self.sampler = BucketBatchSampler(self.data.train, cfg.train.batch_size, seed=cfg.train.seed)
        self.model = estimate_before_building(
            lambda: build_model(cfg.model, len(self.vocab), len(self.data.labels), pad_id=Vocabulary.pad_id,
                                pretrained=self.data.vectors),
            _check_classifier_memory(self.data.train, cfg.train.batch_size, device))
        self.notices = truncation_notices(self.data.truncated, limit,
                                          "data.max_len" if limit == cfg.data.max_len else "model.max_len")

    def loss_terms(self, indices: list[int]) -> int:
        return collate([self.data.train[i] for i in indices]).count

    def throughput_units(self, indices: list[int]) -> int:
        return len(indices)

    def loss_sum(self, module: nn.Module, indices: list[int]) -> torch.Tensor:
        batch = collate([self.data.train[i] for i in indices]).to(self.device)
        return summed_loss(module(**batch.inputs), batch.targets, label_smoothing=self.label_smoothing)

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        return evaluate(model, getattr(self.data, split), self.data.labels, batch_size=self.cfg.train.eval_batch_size,
                        device=self.device)

    def has_split(self, split: str) -> bool:
        return bool(getattr(self.data, split))

    def checkpoint_fields(self) -> dict:
        return {"vocab": self.vocab.to_list(), "labels": self.data.labels.itos, "extra": {}}

    def data_summary(self) -> dict:
        return {}


class PretrainedClassificationTask(ClassificationTask):
    """Sentence / pair classification on a pretrained encoder (``model.pretrained``, with ``model.convert``):
    the files are read as for :class:`ClassificationTask` and encoded by the encoder's own tokenizer (a pair as
    the tokenizer's sentence pair, :mod:`maskattn.data.pretrained`); sequences are cut to ``data.max_len``
    tokens, or to what the encoder reads. A checkpoint carries no vocabulary but the tokenizer's fingerprint:
    resuming (or loading) it rebuilds the encoder from the same folder, replays the conversions and checks that
    the folder's tokenizer is the one it was trained with."""

    def __init__(self, cfg: RunConfig, device: torch.device, checkpoint: Checkpoint | None = None):
        self.metrics = ("accuracy", "loss")
        if cfg.data.format not in ("tsv", "trec", "trec_fine", "nli"):
            raise ConfigError(f"data.format {cfg.data.format!r} cannot feed a pretrained encoder (model.pretrained); "
                              "expected tsv, trec, trec_fine (sentences) or nli (pairs)")
        if (cfg.data.format == "nli") != (cfg.model.type == "pair"):
            raise ConfigError(f"model.type {cfg.model.type!r} does not match data.format {cfg.data.format!r}: "
                              "sentence pairs (nli) need model.type=pair, single sentences model.type=sentence")
        self.cfg, self.device = cfg, device
        self.label_smoothing = _label_smoothing(cfg, 0.0)
        encoder, self.tokenizer = load_pretrained_encoder(cfg.model, replay=checkpoint is not None)
        if checkpoint is not None:
            check_tokenizer(checkpoint, self.tokenizer)
        max_len = pretrained_input_limit(cfg.data, encoder_max_tokens(encoder, self.tokenizer))
        labels = LabelSet(checkpoint.labels) if checkpoint else None
        self.data: PreparedData = prepare_pretrained_data(cfg.data, self.tokenizer, max_len=max_len, labels=labels)
        self.sampler = BucketBatchSampler(self.data.train, cfg.train.batch_size, seed=cfg.train.seed)
        self.model = PretrainedClassifier.from_config(encoder, self.tokenizer, cfg.model, len(self.data.labels))
        self.notices = truncation_notices(self.data.truncated, max_len,
                                          "data.max_len" if cfg.data.max_len else "what the encoder reads")

    def checkpoint_fields(self) -> dict:
        return {"vocab": [], "labels": self.data.labels.itos,
                "extra": {"tokenizer_sha256": tokenizer_fingerprint(self.tokenizer)}}


def _fingerprint(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


class TranslationTask:
    """Translation with a :class:`~maskattn.models.seq2seq.Seq2Seq` on line-aligned parallel files."""

    unit = "tokens"
    metrics = ("bleu", "chrf", "loss")

    def __init__(self, cfg: RunConfig, device: torch.device, checkpoint: Checkpoint | None = None):
        data = cfg.data
        if data.format != "parallel":
            raise ArgumentError(f"model.type seq2seq reads parallel text: set data.format=parallel (got {data.format!r})")
        if data.source != "files":
            raise ArgumentError(f"translation reads files (data.source=files), got data.source={data.source!r}")
        if data.dir is None:
            raise ArgumentError("data.dir is not set; pass the dataset folder, e.g. --data ../shared/data/multi30k")
        if not Path(data.dir).is_dir():
            raise ArgumentError(f"data.dir {data.dir} is not a directory")
        if not data.train:
            raise ArgumentError("data.train (the train file prefix inside data.dir, e.g. 'train') is not set")
        if not data.dev:
            raise ArgumentError("translation needs a dev split: set data.dev (file prefix, e.g. 'val')")
        if data.lowercase:
            raise ArgumentError("data.lowercase is not supported for translation (BLEU is computed on cased text)")
        if data.subword not in SUBWORD_TYPES:
            raise ArgumentError(f"unknown data.subword {data.subword!r}; expected one of {', '.join(SUBWORD_TYPES)}")
        self.max_len = data.max_len or cfg.model.max_len
        if self.max_len > cfg.model.max_len:
            raise ArgumentError(f"data.max_len {data.max_len} exceeds model.max_len {cfg.model.max_len} (the longest "
                             "sequence the model's positions cover)")
        if self.max_len > data.max_tokens:
            raise ArgumentError(f"data.max_tokens {data.max_tokens} is smaller than one sequence of data.max_len "
                             f"{self.max_len}; raise data.max_tokens or lower data.max_len")
        self.cfg, self.device = cfg, device
        self.label_smoothing = _label_smoothing(cfg, TRANSLATION_LABEL_SMOOTHING)
        if data.src_lang is None or data.tgt_lang is None:
            raise ConfigError(f"translation needs data.src_lang and data.tgt_lang (the file suffixes), got "
                              f"{data.src_lang!r} and {data.tgt_lang!r}")
        self.text: dict[str, ParallelText] = {}
        for split in ("train", "dev", "test"):
            prefix = getattr(data, split)
            if prefix:
                self.text[split] = read_parallel(*parallel_paths(data.dir, prefix, data.src_lang, data.tgt_lang))
        train = self.text["train"]
        self.fingerprint = _fingerprint([train.src_path, train.tgt_path])
        if checkpoint is not None:
            if checkpoint.extra.get("train_sha256") != self.fingerprint:
                raise CheckpointError(f"the train files {train.src_path} / {train.tgt_path} differ from the ones "
                                      f"checkpoint {checkpoint.path} was trained on; resume with the same data")
            self.subword = subword_from_checkpoint(checkpoint)
        else:
            self.subword = SubwordModel.train(train.source + train.target, vocab_size=data.subword_vocab,
                                              model_type=data.subword, num_threads=max(1, torch.get_num_threads()))
        self.encoded = {split: encode_pairs(text, self.subword, max_len=self.max_len, training=split == "train",
                                            overlong=data.overlong) for split, text in self.text.items()}
        self.train_items = self.encoded["train"].items
        if not self.train_items:
            raise ArgumentError(f"no training pairs left in {train.src_path} / {train.tgt_path} (empty, or every pair is "
                             f"longer than data.max_len {self.max_len})")
        self.sampler = TokenBatchSampler(self.train_items, data.max_tokens, seed=cfg.train.seed)
        self.model = estimate_before_building(lambda: build_model(cfg.model, len(self.subword), 0, pad_id=PAD_ID),
                                              _check_translation_memory(self.train_items, data.max_tokens, device))

    def loss_terms(self, indices: list[int]) -> int:
        return sum(len(self.train_items[i]["tgt"]) - 1 for i in indices)

    throughput_units = loss_terms  # target tokens

    def loss_sum(self, module: nn.Module, indices: list[int]) -> torch.Tensor:
        batch = collate_pairs([self.train_items[i] for i in indices]).to(self.device)
        logits = module(batch.src, batch.tgt_in)  # (B, T, V)
        return summed_loss(logits, batch.tgt_out.masked_fill(batch.tgt_out == PAD_ID, IGNORE_INDEX),
                           label_smoothing=self.label_smoothing)

    @torch.no_grad()
    def dev_loss(self, model: nn.Module, split: str) -> float:
        """Cross-entropy (no smoothing) per target token on ``split``, teacher-forced."""
        items = self.encoded[split].items
        model.eval()
        total, tokens = 0.0, 0
        for indices in TokenBatchSampler(items, self.cfg.data.max_tokens, shuffle=False).batches():
            batch = collate_pairs([items[i] for i in indices]).to(self.device)
            logits = model(batch.src, batch.tgt_in)
            total += float(summed_loss(logits, batch.tgt_out.masked_fill(batch.tgt_out == PAD_ID, IGNORE_INDEX)))
            tokens += batch.ntokens
        return total / tokens

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """``loss`` (per target token) and ``ppl`` always; ``bleu`` and ``chrf`` on the test split and when
        ``train.metric`` needs them (decoding with ``eval_beam`` on dev, ``test_beam`` on test)."""
        train_config = self.cfg.train
        loss = self.dev_loss(model, split)
        result = {"loss": loss, "ppl": math.exp(min(loss, 50.0))}
        if split == "test" or train_config.metric != "loss":
            text = self.text[split]
            translator = Translator(cast(Seq2Seq, model), self.subword, max_len=self.max_len, device=self.device)
            hyps = translator.translate(text.source, beam=train_config.eval_beam if split == "dev" else train_config.test_beam,
                                        length_penalty=train_config.length_penalty, batch_size=train_config.eval_batch_size)
            scores = corpus_scores(hyps, text.target)
            result.update(bleu=scores["bleu"], chrf=scores["chrf"])
        return result

    def has_split(self, split: str) -> bool:
        return split in self.text

    def checkpoint_fields(self) -> dict:
        return {"vocab": self.subword.pieces(), "labels": [],
                "extra": {"subword_model": base64.b64encode(self.subword.proto).decode("ascii"),
                          "train_sha256": self.fingerprint}}

    def data_summary(self) -> dict:
        """Subword vocabulary size and what encoding did to the train split."""
        train = self.encoded["train"]
        return {"subword_vocab": len(self.subword), "train_pairs": len(train.items),
                "skipped_empty": train.skipped_empty, "filtered_overlong": train.filtered,
                "truncated_overlong": train.truncated}


def build_task(cfg: RunConfig, device: torch.device, checkpoint: Checkpoint | None = None) -> Task:
    """The task of ``cfg.model``: translation for ``seq2seq``, classification on a pretrained encoder with
    ``model.pretrained``, classification otherwise."""
    if cfg.model.type == "seq2seq":
        return TranslationTask(cfg, device, checkpoint)
    if cfg.model.pretrained is not None:
        return PretrainedClassificationTask(cfg, device, checkpoint)
    return ClassificationTask(cfg, device, checkpoint)
