"""Tasks: what the :class:`~maskattn.train.Trainer` loop needs to know about a kind of model.

A task builds the data, the batch sampler and the model, computes the summed training loss of a batch,
evaluates a split, and says what a checkpoint must carry to feed the model text later. The loop itself
(optimiser, schedule, clipping, AMP, DDP, evaluation cadence, checkpoints, resume, metrics files) is shared.

* :class:`ClassificationTask` — sentence / pair classifiers and taggers (``model.type`` ``sentence``,
  ``pair``, ``tagger``): example batches of ``train.batch_size``, cross-entropy, accuracy / F1.
* :class:`PretrainedClassificationTask` — the same on a pretrained Hugging Face encoder (``model.pretrained``),
  the text encoded by that model's tokenizer.
* :class:`Seq2SeqTask` — ``model.type: seq2seq`` on line-aligned files, translation or summarization: joint
  subword model, batches of at most ``data.max_tokens`` tokens, label-smoothed cross-entropy per target token,
  dev loss / perplexity and sacreBLEU BLEU / chrF or ROUGE of greedy or beam decoding.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, cast

import torch
import torch.nn as nn

from ..checkpoint import Checkpoint
from ..data.batching import IGNORE_INDEX, BucketBatchSampler, collate
from ..data.config import SEQ2SEQ_FORMATS
from ..data.parallel import ParallelText, TokenBatchSampler, collate_pairs, encode_pairs, read_parallel_prefixes
from ..data.pipeline import PreparedData, prepare_data, prepare_pretrained_data
from ..data.pretrained import tokenizer_fingerprint
from ..data.subword import PAD_ID, SUBWORD_TYPES, SubwordModel
from ..data.vocab import LabelSet, Vocabulary
from ..errors import ArgumentError, CheckpointError, ConfigError
from ..inference import DecodingOptions, Translator, check_tokenizer, fixed_rows_of, subword_from_checkpoint
from ..device import check_memory
from ..metrics import (SEQ2SEQ_SCORES, check_references, input_limit, item_length, pretrained_input_limit,
                       scored_predictions, summed_loss)
from ..metrics.test_outputs import HYPOTHESES, PREDICTIONS, Prediction, hypotheses_bytes, predictions_bytes
from ..models.factory import build_model
from ..models.memory import estimate_before_building, model_memory_bytes
from ..models.seq2seq import Seq2Seq
from ..models.pretrained import PretrainedClassifier, encoder_max_tokens, load_pretrained_encoder
from .config import RunConfig

__all__ = ["Task", "ClassificationTask", "PretrainedClassificationTask", "Seq2SeqTask", "TranslationTask", "build_task",
           "Progress"]

#: a progress callback: ``(done, total)`` items of a long evaluation (decoding a split)
Progress = Callable[[int, int], None]

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

    def evaluate(self, model: nn.Module, split: str, progress: Progress | None = None) -> dict[str, float]:
        """Metrics of ``model`` on ``dev`` or ``test``; a long evaluation reports ``progress(done, total)``."""

    def has_split(self, split: str) -> bool:
        """Is there data for ``split``?"""

    def checkpoint_fields(self) -> dict:
        """Keyword arguments ``vocab``, ``labels``, ``extra`` of :func:`save_checkpoint`."""

    def data_summary(self) -> dict:
        """Facts about the prepared data for the run summary (may be empty)."""

    def item_outputs(self, split: str) -> tuple[str, bytes] | None:
        """The per-item outputs of the last evaluation of ``split`` — its file name in a run folder and content
        (:mod:`maskattn.metrics.test_outputs`) — or None before one."""


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


def coverage_note(coverage: dict) -> str:
    """One line on what the vectors file covered (:func:`~maskattn.data.vectors.vector_coverage`)."""
    fixed = coverage["fixed_eval_types"]
    added = (f"; {fixed} word types of the dev / test splits that training lacks take their vectors, fixed "
             "(data.vectors_extend)") if fixed else ""
    return (f"vectors {coverage['file']}: {coverage['types_covered']:,} of {coverage['vocab_types']:,} training vocabulary "
            f"types ({coverage['types_covered'] / max(1, coverage['vocab_types']):.1%}) and {coverage['token_share']:.1%} "
            f"of the {coverage['train_tokens']:,} training tokens have a pretrained vector (lookup: "
            f"{coverage['lookup']}){added}")


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
        if cfg.data.format in SEQ2SEQ_FORMATS:
            raise ArgumentError(f"data.format {cfg.data.format!r} is data of a seq2seq model; set model.type=seq2seq "
                                f"(model.type is {cfg.model.type!r})")
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
        self.fixed_rows = fixed_rows_of(checkpoint) if checkpoint else (
            self.data.vectors.fixed if self.data.vectors else 0)
        self.model = estimate_before_building(
            lambda: build_model(cfg.model, len(self.vocab), len(self.data.labels), pad_id=Vocabulary.pad_id,
                                pretrained=self.data.vectors, fixed_rows=self.fixed_rows),
            _check_classifier_memory(self.data.train, cfg.train.batch_size, device))
        self.notices = truncation_notices(self.data.truncated, limit,
                                          "data.max_len" if limit == cfg.data.max_len else "model.max_len")
        self.notes = [coverage_note(self.data.coverage)] if self.data.coverage else []
        self.predictions: dict[str, list[Prediction]] = {}  # of the last evaluation of each split

    def loss_terms(self, indices: list[int]) -> int:
        return collate([self.data.train[i] for i in indices]).count

    def throughput_units(self, indices: list[int]) -> int:
        return len(indices)

    def loss_sum(self, module: nn.Module, indices: list[int]) -> torch.Tensor:
        batch = collate([self.data.train[i] for i in indices]).to(self.device)
        return summed_loss(module(**batch.inputs), batch.targets, label_smoothing=self.label_smoothing)

    def evaluate(self, model: nn.Module, split: str, progress: Progress | None = None) -> dict[str, float]:
        metrics, self.predictions[split] = scored_predictions(model, getattr(self.data, split), self.data.labels,
                                                              batch_size=self.cfg.train.eval_batch_size,
                                                              device=self.device)
        return metrics

    def item_outputs(self, split: str) -> tuple[str, bytes] | None:
        return (PREDICTIONS, predictions_bytes(self.predictions[split])) if split in self.predictions else None

    def has_split(self, split: str) -> bool:
        return bool(getattr(self.data, split))

    def checkpoint_fields(self) -> dict:
        return {"vocab": self.vocab.to_list(), "labels": self.data.labels.itos,
                "extra": {"fixed_rows": self.fixed_rows} if self.fixed_rows else {}}

    def data_summary(self) -> dict:
        """What the vectors file covered (empty without ``data.vectors``)."""
        return {"vectors": self.data.coverage} if self.data.coverage else {}


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
        if cfg.data.vectors:
            raise ConfigError(f"data.vectors {cfg.data.vectors!r}: a pretrained encoder (model.pretrained) brings its "
                              "own embeddings; remove data.vectors")
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
        self.predictions = {}

    def checkpoint_fields(self) -> dict:
        return {"vocab": [], "labels": self.data.labels.itos,
                "extra": {"tokenizer_sha256": tokenizer_fingerprint(self.tokenizer)}}


def _fingerprint(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


class Seq2SeqTask:
    """A :class:`~maskattn.models.seq2seq.Seq2Seq` on line-aligned files: translation (``data.format: parallel``,
    scored by sacreBLEU BLEU and chrF) or summarization (``data.format: summarization``, article → summary,
    scored by ROUGE-1/2/L F1). Both sides share one subword model (and, with ``model.share_embeddings``, one
    embedding table); the train split may be several file pairs; the outputs are decoded as the ``train``
    section's decoding settings say (:meth:`DecodingOptions.from_config`)."""

    unit = "tokens"

    def __init__(self, cfg: RunConfig, device: torch.device, checkpoint: Checkpoint | None = None):
        data = cfg.data
        if data.format not in SEQ2SEQ_FORMATS:
            raise ArgumentError(f"model.type seq2seq reads line-aligned files: set data.format=parallel (translation) "
                                f"or data.format=summarization (got {data.format!r})")
        self.kind = data.format
        self.score, names = SEQ2SEQ_SCORES[data.format]
        self.metrics = (*names, "loss")
        if data.source != "files":
            raise ArgumentError(f"seq2seq models read files (data.source=files), got data.source={data.source!r}")
        if data.dir is None:
            raise ArgumentError("data.dir is not set; pass the dataset folder, e.g. --data ../shared/data/multi30k")
        if not Path(data.dir).is_dir():
            raise ArgumentError(f"data.dir {data.dir} is not a directory")
        if not data.train:
            raise ArgumentError("data.train (the train file prefix inside data.dir, e.g. 'train') is not set")
        if not data.dev:
            raise ArgumentError("a seq2seq run needs a dev split: set data.dev (file prefix, e.g. 'val')")
        if data.lowercase:
            raise ArgumentError("data.lowercase is not supported for seq2seq data (outputs are scored against the "
                                "reference files as they are); lower-case the files themselves if you need it")
        if data.vectors:
            raise ArgumentError("data.vectors is not supported for seq2seq models (their embeddings are over subwords)")
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
        src_lang, tgt_lang = data.suffixes
        if src_lang is None or tgt_lang is None:
            raise ConfigError(f"data.format parallel needs data.src_lang and data.tgt_lang (the file suffixes), got "
                              f"{src_lang!r} and {tgt_lang!r}")
        self.decoding = {split: DecodingOptions.from_config(vars(cfg.train), split) for split in ("dev", "test")}
        cap = cfg.model.max_len - 1  # the longest output the decoder's positions allow (BOS takes one)
        if cfg.model.positional != "none" and cfg.train.max_output_len is not None and cfg.train.max_output_len > cap:
            raise ConfigError(f"train.max_output_len {cfg.train.max_output_len} exceeds what the model can decode: "
                              f"{cap} tokens (model.max_len {cfg.model.max_len} minus the BOS position)")
        self.text: dict[str, ParallelText] = {}
        self.hypotheses: dict[str, list[str]] = {}  # the last decoding of each split (the trainer keeps test's)
        for split in ("train", "dev", "test"):
            prefix = getattr(data, split)
            if prefix:
                text = read_parallel_prefixes(data.dir, prefix, src_lang, tgt_lang).with_unknown(data.unk_tokens)
                if self.kind == "summarization" and split != "train":  # refused now, not after training
                    check_references(text.target, " + ".join(str(tgt) for _, tgt in text.files))
                self.text[split] = text
        train = self.text["train"]
        self.fingerprint = _fingerprint([path for pair in train.files for path in pair])
        if checkpoint is not None:
            if checkpoint.extra.get("train_sha256") != self.fingerprint:
                raise CheckpointError(f"the train files {train.describe()} differ from the ones checkpoint "
                                      f"{checkpoint.path} was trained on; resume with the same data")
            self.subword = subword_from_checkpoint(checkpoint)
        else:
            self.subword = SubwordModel.train(train.source + train.target, vocab_size=data.subword_vocab,
                                              model_type=data.subword, num_threads=max(1, torch.get_num_threads()),
                                              user_symbols=data.unk_tokens[:1], option="data.subword_vocab")
        self.encoded = {split: encode_pairs(text, self.subword, max_len=self.max_len, training=split == "train",
                                            overlong=data.overlong) for split, text in self.text.items()}
        self.train_items = self.encoded["train"].items
        if not self.train_items:
            raise ArgumentError(f"no training pairs left in {train.describe()} (empty, or every pair is longer than "
                                f"data.max_len {self.max_len})")
        self.notices = self._notices()
        self.sampler = TokenBatchSampler(self.train_items, data.max_tokens, seed=cfg.train.seed)
        self.model = estimate_before_building(lambda: build_model(cfg.model, len(self.subword), 0, pad_id=PAD_ID),
                                              _check_translation_memory(self.train_items, data.max_tokens, device))

    def _notices(self) -> list[str]:
        """Warnings about what encoding did to the train split (empty pairs skipped, long pairs cut or dropped)."""
        train, limit = self.encoded["train"], self.max_len - 1
        notices = []
        if train.skipped_empty:
            notices.append(f"{train.skipped_empty} training pair(s) with an empty source or target were skipped")
        if train.truncated:
            notices += truncation_notices({"train": train.truncated}, limit, "data.max_len, in subwords per side")
        if train.filtered:
            notices.append(f"{train.filtered} training pair(s) longer than {limit} subwords on a side were left out "
                           "(data.overlong=filter); set data.overlong=truncate to keep them cut, or raise data.max_len")
        return notices

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

    def evaluate(self, model: nn.Module, split: str, progress: Progress | None = None) -> dict[str, float]:
        """``loss`` (per target token) and ``ppl`` always; the scores of the task (``bleu`` and ``chrf``, or
        ``rouge1``, ``rouge2``, ``rougeL`` and their mean ``rouge``; on test with 95 % intervals) on the test split
        and when ``train.metric`` needs them, decoding as ``train`` says for dev (``eval_beam``) or test
        (``test_beam``). ``progress(done, total)`` follows the decoding."""
        loss = self.dev_loss(model, split)
        result = {"loss": loss, "ppl": math.exp(min(loss, 50.0))}
        if split == "test" or self.cfg.train.metric != "loss":
            text = self.text[split]
            translator = Translator(cast(Seq2Seq, model), self.subword, max_len=self.max_len, device=self.device,
                                    decoding=self.decoding["dev" if split == "dev" else "test"])
            hyps = translator.translate(text.source, batch_size=self.cfg.train.eval_batch_size, progress=progress)
            self.hypotheses[split] = list(hyps)
            scores = self.score(hyps, text.target, **({"bootstrap": 0} if self.kind == "summarization"
                                                       and split == "dev" else {}))
            result.update({key: value for key, value in scores.items() if isinstance(value, float)})
        return result

    def has_split(self, split: str) -> bool:
        return split in self.text

    def item_outputs(self, split: str) -> tuple[str, bytes] | None:
        return (HYPOTHESES, hypotheses_bytes(self.hypotheses[split])) if split in self.hypotheses else None

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


#: the name of :class:`Seq2SeqTask` before it served summarization too
TranslationTask = Seq2SeqTask


def build_task(cfg: RunConfig, device: torch.device, checkpoint: Checkpoint | None = None) -> Task:
    """The task of ``cfg.model``: translation or summarization for ``seq2seq``, classification on a pretrained
    encoder with ``model.pretrained``, classification otherwise."""
    if cfg.model.type == "seq2seq":
        return Seq2SeqTask(cfg, device, checkpoint)
    if cfg.model.pretrained is not None:
        return PretrainedClassificationTask(cfg, device, checkpoint)
    return ClassificationTask(cfg, device, checkpoint)
