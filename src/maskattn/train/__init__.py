"""Training toolkit: configuration, trainer (schedules, clipping, AMP, weight averaging, evaluation, best
checkpoint, early stopping, exact resume, DDP, k-fold cross-validation) for classifiers and translation,
run folders held by one process, atomic checksummed safetensors checkpoints, metrics files that survive a
kill, the embedded default job. Using the trained checkpoints: :mod:`maskattn.inference`."""

from ..checkpoint import FORMAT, Checkpoint, load_checkpoint, load_weights
from .api import cross_validate, resume, train
from .checkpoint import save_checkpoint
from . import config
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


def __getattr__(name: str):
    if name == "LoopConfig":
        return config.LoopConfig  # warns: renamed TrainConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
