"""Run configuration: four sections (``data``, ``model``, ``optim``, ``train``) as dataclasses, loaded
from YAML, overridden by ``section.key=value`` flags, validated strictly (an unknown key fails with the
list of valid keys, a value outside its section's ``RULES`` with the allowed range; :mod:`maskattn.sections`),
and saved in full inside every checkpoint."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..sections import (Rule, at_least, check_section, from_dict, in_range, one_of, optional, pair, parse_yaml, positive,
                        shown)
from ..data.config import DataConfig
from ..data.text import read_text
from ..errors import ConfigError, warn_renamed
from ..inference.decoding import LENGTH_PENALTIES, DecodingOptions
from ..metrics import SEQ2SEQ_SCORES
from ..models.config import ModelConfig
from .optim import DECAY_TARGETS, OPTIMIZERS, SCHEDULES


__all__ = ["OptimConfig", "TrainConfig", "RunConfig", "from_dict", "load_config", "apply_overrides",
           "PRESETS_DIR", "list_presets", "preset_path", "METRICS"]

# train.metric; each task computes some of them (seq2seq: those of its data.format, SEQ2SEQ_SCORES)
METRICS = ("accuracy", "f1", "loss", *(name for _, names in SEQ2SEQ_SCORES.values() for name in names))

PRESETS_DIR = Path(__file__).resolve().parents[1] / "configs"  # shipped inside the package


@dataclass
class OptimConfig:
    """Optimiser and schedule. ``name``: ``adam``, ``adamw``, ``adadelta`` (MTSA: lr 0.5), ``sgd``;
    ``weight_decay``: L2 penalty (coupled for adam/adadelta/sgd, decoupled for adamw), applied to every
    parameter (``weight_decay_on: all``), to every parameter but the word embedding tables (``except_embeddings``)
    or to weight matrices only (``matrices``: no biases, LayerNorm gains
    or other vectors); ``layer_decay`` ``d``: layer-wise learning rates for a pretrained encoder, ``lr · d^k``
    for the layer ``k`` below the classifier head (1 = off); ``schedule``:
    ``constant``, ``warmup`` (linear warm-up then constant), ``linear`` (linear warm-up, then linear decay to 0
    at the run's last step), ``inverse_sqrt`` (warm-up then 1/√step),
    ``plateau`` (× ``plateau_factor`` after ``plateau_patience`` evaluations without improvement);
    ``clip_norm``: gradient-norm clipping (0 = off); ``label_smoothing``: ε of the label-smoothed
    cross-entropy training loss (``None``: 0.1 for translation, 0 for classification)."""

    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    weight_decay_on: str = "all"
    layer_decay: float = 1.0
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    momentum: float = 0.0
    rho: float = 0.9
    schedule: str = "constant"
    warmup_steps: int = 0
    plateau_factor: float = 0.5
    plateau_patience: int = 2
    min_lr: float = 0.0
    clip_norm: float = 0.0
    label_smoothing: float | None = None

    RULES: ClassVar[dict[str, Rule]] = {
        "name": one_of(*OPTIMIZERS),
        "lr": at_least(0, integer=False),
        "weight_decay": at_least(0, integer=False),
        "weight_decay_on": one_of(*DECAY_TARGETS),
        "layer_decay": in_range(0, 1, low_open=True, high_open=False),
        "betas": pair(in_range(0, 1)),
        "eps": positive(),
        "momentum": at_least(0, integer=False),
        "rho": in_range(0, 1, high_open=False),
        "schedule": one_of(*SCHEDULES),
        "warmup_steps": at_least(0),
        "plateau_factor": in_range(0, 1, low_open=True),
        "plateau_patience": at_least(0),
        "min_lr": at_least(0, integer=False),
        "clip_norm": at_least(0, integer=False),
        "label_smoothing": optional(in_range(0, 1)),
    }

    def __post_init__(self):
        check_section(self, "optim", self.RULES)


@dataclass
class TrainConfig:
    """The training loop. ``max_steps`` / ``max_epochs``: stop at whichever comes first (0 = no limit
    for that one); ``eval_every``: steps between dev evaluations and checkpoints (0 = once per epoch);
    ``patience``: stop after this many evaluations without a better ``metric`` (0 = never); ``amp``:
    mixed precision — ``false``, ``bf16``, ``fp16`` (CUDA only, with a gradient scaler) or ``true`` (bf16 where
    the device supports it, else fp16) — parameters stay float32; ``compile``: train through
    ``torch.compile`` (dynamic shapes; a recompilation storm is reported); ``device``: ``auto``, ``cpu``, ``cuda``.
    ``metric``: ``accuracy``, ``f1`` (taggers), ``loss``; for translation ``bleu``, ``chrf``, for summarization
    ``rouge`` (the mean of ROUGE-1, -2 and -L F1), ``rouge1``, ``rouge2``, ``rougeL`` (greedy or ``eval_beam``
    decoding of the dev set) or ``loss`` (dev cross-entropy per target token, much faster).
    ``ema_decay``: evaluate, keep as ``best`` and test an exponential moving average of the weights (Polyak
    averaging, ``ema ← decay · ema + (1 − decay) · θ`` after every step; 0 = off; ``last`` keeps both).
    Decoding (seq2seq; :class:`~maskattn.inference.DecodingOptions`, saved with the run and used by its
    checkpoints' ``maskattn generate`` / ``eval``): ``eval_beam`` / ``test_beam`` (beam sizes for dev and for the
    final test scores; 1 = greedy), ``length_penalty`` α and ``length_penalty_kind`` (``gnmt``: ``((5 + |Y|) / 6)^α``,
    ``fairseq``: ``|Y|^α``), ``min_output_len`` / ``max_output_len`` (output tokens before EOS; null: ``1.2 ·
    source + 10``) and ``no_repeat_ngram_size`` (3: no repeated trigram in a hypothesis; 0 = off).
    ``tensorboard``: a folder for TensorBoard event files (loss, learning rate, gradient norm, dev and test
    metrics, throughput; needs the ``tensorboard`` extra); null = none. It does not change what the run computes."""

    seed: int = 0
    batch_size: int = 64
    eval_batch_size: int = 256
    max_steps: int = 1000
    max_epochs: int = 0
    eval_every: int = 0
    patience: int = 0
    metric: str = "accuracy"
    device: str = "auto"
    amp: bool | str = False
    compile: bool = False
    num_threads: int = 0
    out_dir: str = "runs/run"
    progress: bool = True
    log_every: int = 10
    keep_last: bool = True
    ema_decay: float = 0.0
    eval_beam: int = 1
    test_beam: int = DecodingOptions.beam
    length_penalty: float = DecodingOptions.length_penalty
    length_penalty_kind: str = DecodingOptions.length_penalty_kind
    min_output_len: int = DecodingOptions.min_len
    max_output_len: int | None = DecodingOptions.max_len
    no_repeat_ngram_size: int = DecodingOptions.no_repeat_ngram_size
    tensorboard: str | None = None

    RULES: ClassVar[dict[str, Rule]] = {
        "seed": at_least(0),
        "batch_size": at_least(1),
        "eval_batch_size": at_least(1),
        "max_steps": at_least(0),
        "max_epochs": at_least(0),
        "eval_every": at_least(0),
        "patience": at_least(0),
        "metric": one_of(*METRICS),
        "device": Rule(lambda v: isinstance(v, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", v) is not None,
                       "auto, cpu, cuda or cuda:N"),
        "amp": Rule(lambda v: isinstance(v, bool) or v in ("bf16", "fp16"), "true, false, bf16 or fp16"),
        "num_threads": at_least(0),  # at most the CPUs the process may use: checked where it is set (Trainer)
        "out_dir": Rule(lambda v: isinstance(v, str) and bool(v.strip()), "a folder name"),
        "log_every": at_least(1),
        "ema_decay": in_range(0, 1),
        "eval_beam": at_least(1),
        "test_beam": at_least(1),
        "length_penalty": at_least(0, integer=False),
        "length_penalty_kind": one_of(*LENGTH_PENALTIES),
        "min_output_len": at_least(0),
        "max_output_len": optional(at_least(0)),
        "no_repeat_ngram_size": at_least(0),
        "tensorboard": optional(Rule(lambda v: isinstance(v, str) and bool(v.strip()), "a folder name")),
    }

    def __post_init__(self):
        check_section(self, "train", self.RULES)
        if self.max_output_len is not None and self.max_output_len < self.min_output_len:
            raise ConfigError(f"train.min_output_len {self.min_output_len} is larger than train.max_output_len "
                              f"{self.max_output_len}")


@dataclass
class RunConfig:
    """A whole run: ``data``, ``model``, ``optim``, ``train`` (see each section's class)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self):
        if self.data.vectors and self.model.embed_scale is None:
            # pretrained vectors keep the scale they were trained to (GloVe: components of std ~0.4-0.7, as the
            # sinusoids' ~0.7); the default √d_model lifts the model's own ±0.05 vectors to the positions'
            # amplitude and would multiply GloVe's ×17 at d_model 300. Written into the run's config, so its
            # checkpoints rebuild with it.
            self.model.embed_scale = 1.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def apply_overrides(config: dict, overrides: list[str] | None) -> dict:
    """Apply ``section.key=value`` overrides (values parsed as YAML) to a config dict, in place."""
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must be written section.key=value, e.g. optim.lr=0.5")
        path, value = item.split("=", 1)
        keys = path.strip().split(".")
        target = config
        for key in keys[:-1]:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                raise ConfigError(f"override {item!r}: {key!r} is not a config section")
        target[keys[-1]] = parse_yaml(value, f"override {shown(item)}")
    return config


def list_presets() -> list[str]:
    """Preset names (the YAML files shipped in ``maskattn/configs/``)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")) if PRESETS_DIR.is_dir() else []


def preset_path(name: str) -> Path:
    """The YAML file of the preset ``name`` shipped in ``maskattn/configs/``; an unknown name raises
    :class:`~maskattn.errors.ConfigError` with the list of presets."""
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(list_presets()) or '(none found)'}")
    return path


#: the largest config file read (the shipped ones are a few KiB)
MAX_CONFIG_BYTES = 1 << 20


def _read_yaml(path: Path) -> dict:
    if path.is_file() and path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is {path.stat().st_size} bytes, more than the {MAX_CONFIG_BYTES} a "
                          "run configuration may hold; is it the right file?")
    data = parse_yaml(read_text(path, "config file"), str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections (data, model, optim, train)")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                base: dict | None = None) -> RunConfig:
    """``base`` dict ← YAML file ``path`` ← ``overrides``, validated into a :class:`RunConfig`."""
    data = _deep_merge(base or {}, _read_yaml(Path(path)) if path else {})
    return from_dict(RunConfig, apply_overrides(data, overrides))


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def __getattr__(name: str):
    if name == "LoopConfig":  # the `train` section's class before it was named after its section
        warn_renamed("maskattn.train.LoopConfig", "TrainConfig")
        return TrainConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
