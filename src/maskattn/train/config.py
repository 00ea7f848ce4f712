"""Run configuration: four sections (``data``, ``model``, ``optim``, ``train``) as dataclasses, loaded
from YAML, overridden by ``section.key=value`` flags, validated strictly (an unknown key fails with the
list of valid keys), and saved in full inside every checkpoint."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from ..data.config import DataConfig
from ..models.config import ModelConfig

__all__ = ["OptimConfig", "LoopConfig", "RunConfig", "from_dict", "load_config", "apply_overrides",
           "PRESETS_DIR", "list_presets", "preset_path"]

PRESETS_DIR = Path(__file__).resolve().parents[1] / "configs"  # shipped inside the package


@dataclass
class OptimConfig:
    """Optimiser and schedule. ``name``: ``adam``, ``adamw``, ``adadelta`` (MTSA: lr 0.5), ``sgd``;
    ``weight_decay``: L2 penalty (coupled for adam/adadelta/sgd, decoupled for adamw); ``schedule``:
    ``constant``, ``warmup`` (linear warm-up then constant), ``inverse_sqrt`` (warm-up then 1/√step),
    ``plateau`` (× ``plateau_factor`` after ``plateau_patience`` evaluations without improvement);
    ``clip_norm``: gradient-norm clipping (0 = off); ``label_smoothing``: ε of the label-smoothed
    cross-entropy training loss (``None``: 0.1 for translation, 0 for classification)."""

    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
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


@dataclass
class LoopConfig:
    """The training loop. ``max_steps`` / ``max_epochs``: stop at whichever comes first (0 = no limit
    for that one); ``eval_every``: steps between dev evaluations and checkpoints (0 = once per epoch);
    ``patience``: stop after this many evaluations without a better ``metric`` (0 = never); ``amp``:
    mixed precision (bfloat16/float16 autocast on CUDA only); ``device``: ``auto``, ``cpu``, ``cuda``.
    ``metric``: ``accuracy``, ``f1`` (taggers), ``loss``; for translation ``bleu``, ``chrf`` (greedy or
    ``eval_beam`` decoding of the dev set) or ``loss`` (dev cross-entropy per target token, much faster).
    ``ema_decay``: evaluate, keep as ``best`` and test an exponential moving average of the weights (Polyak
    averaging, ``ema ← decay · ema + (1 − decay) · θ`` after every step; 0 = off; ``last`` keeps both).
    Translation only: ``eval_beam`` / ``test_beam`` (beam sizes for dev and for the final test scores; 1 =
    greedy) and ``length_penalty`` (of beam search)."""

    seed: int = 0
    batch_size: int = 64
    eval_batch_size: int = 256
    max_steps: int = 1000
    max_epochs: int = 0
    eval_every: int = 0
    patience: int = 0
    metric: str = "accuracy"
    device: str = "auto"
    amp: bool = False
    num_threads: int = 0
    out_dir: str = "runs/run"
    progress: bool = True
    log_every: int = 10
    keep_last: bool = True
    ema_decay: float = 0.0
    eval_beam: int = 1
    test_beam: int = 5
    length_penalty: float = 0.6


@dataclass
class RunConfig:
    """A whole run: ``data``, ``model``, ``optim``, ``train`` (see each section's class)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _accepts(tp, value) -> bool:
    """Does ``value`` (from YAML) fit the annotation ``tp``?"""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(t, value) for t in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    base = origin or tp
    return isinstance(value, base)


def from_dict(cls, data: dict | None, where: str = ""):
    """Build dataclass ``cls`` from a dict; unknown keys and wrongly typed values raise ``ValueError``
    naming the key and listing the valid ones."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(f"config section {where or cls.__name__!r} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ValueError(f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; valid keys"
                         f"{' of ' + where if where else ''}: {', '.join(valid)}")
    kwargs = {}
    for key, value in data.items():
        tp = hints[key]
        name = f"{where}.{key}" if where else key
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value, name)
        else:
            value = _number_from_text(tp, value)
            if not _accepts(tp, value):
                raise ValueError(f"config key {name} must be {_type_name(tp)}, got {value!r}")
            kwargs[key] = float(value) if tp is float else value
    return cls(**kwargs)


def _number_from_text(tp, value):
    """YAML 1.1 reads ``1e-6`` (no dot) as a string; for a float-typed key take it as the number it spells."""
    if isinstance(value, str) and _accepts(tp, 0.5) and not _accepts(tp, value):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def apply_overrides(config: dict, overrides: list[str] | None) -> dict:
    """Apply ``section.key=value`` overrides (values parsed as YAML) to a config dict, in place."""
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"override {item!r} must be written section.key=value, e.g. optim.lr=0.5")
        path, value = item.split("=", 1)
        keys = path.strip().split(".")
        target = config
        for key in keys[:-1]:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                raise ValueError(f"override {item!r}: {key!r} is not a config section")
        target[keys[-1]] = yaml.safe_load(value)
    return config


def list_presets() -> list[str]:
    """Preset names (the YAML files shipped in ``maskattn/configs/``)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")) if PRESETS_DIR.is_dir() else []


def preset_path(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(list_presets()) or '(none found)'}")
    return path


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of sections (data, model, optim, train)")
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
