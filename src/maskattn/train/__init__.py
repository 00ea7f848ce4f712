"""Training toolkit: configuration, trainer (schedules, clipping, AMP, weight averaging, evaluation, best
checkpoint, early stopping, exact resume, DDP, k-fold cross-validation) for classifiers and translation,
run folders held by one process, atomic checksummed safetensors checkpoints, metrics files that survive a
kill, the embedded default job. Using the trained checkpoints: :mod:`maskattn.inference`."""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ..lazy import lazy_exports

if _TYPE_CHECKING:  # what static tools see; at run time the names are imported on first use (maskattn/lazy.py)
    from ..checkpoint import FORMAT, Checkpoint, load_checkpoint, load_weights
    from . import config  # noqa: F401
    from .api import cross_validate, resume, train
    from .checkpoint import save_checkpoint
    from .config import OptimConfig, RunConfig, TrainConfig, from_dict, list_presets, load_config, preset_path
    from .default_job import DEFAULT_JOB, run_default_job
    from .logger import MetricsLogger, read_metrics
    from .run_folder import RunFolder
    from .trainer import Trainer

__all__ = [
    "train", "resume", "cross_validate",
    "FORMAT", "Checkpoint", "load_checkpoint", "save_checkpoint", "load_weights",
    "RunConfig", "OptimConfig", "TrainConfig", "from_dict", "load_config", "list_presets", "preset_path",
    "DEFAULT_JOB", "run_default_job", "MetricsLogger", "read_metrics", "RunFolder", "Trainer",
]


__getattr__, __dir__ = lazy_exports(__name__, {
    "..checkpoint": ("FORMAT", "Checkpoint", "load_checkpoint", "load_weights"),
    ".api": ("train", "resume", "cross_validate"), ".checkpoint": ("save_checkpoint",),
    ".config": ("RunConfig", "OptimConfig", "TrainConfig", "from_dict", "load_config", "list_presets", "preset_path",
                "LoopConfig"),  # LoopConfig warns: renamed TrainConfig
    ".default_job": ("DEFAULT_JOB", "run_default_job"), ".logger": ("MetricsLogger", "read_metrics"),
    ".run_folder": ("RunFolder",), ".trainer": ("Trainer",),
}, submodules=("config",))
