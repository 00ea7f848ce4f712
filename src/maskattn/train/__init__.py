"""Training toolkit: configuration, trainer (schedules, clipping, AMP, weight averaging, evaluation, best
checkpoint, early stopping, exact resume, DDP, k-fold cross-validation) for classifiers and translation,
atomic safetensors checkpoints, metrics files, the embedded default job."""

from .api import (LoadedModel, cross_validate, evaluate_file, evaluate_translation, load_model, load_translator, predict,
                  resume, train)
from .checkpoint import FORMAT, Checkpoint, load_checkpoint, save_checkpoint
from .config import LoopConfig, OptimConfig, RunConfig, from_dict, list_presets, load_config, preset_path
from .default_job import DEFAULT_JOB, run_default_job
from .logger import MetricsLogger, read_metrics
from .trainer import Trainer, load_weights

__all__ = [
    "train", "resume", "cross_validate", "LoadedModel", "load_model", "evaluate_file", "predict", "load_translator",
    "evaluate_translation",
    "FORMAT", "Checkpoint", "load_checkpoint", "save_checkpoint",
    "RunConfig", "OptimConfig", "LoopConfig", "from_dict", "load_config", "list_presets", "preset_path",
    "DEFAULT_JOB", "run_default_job", "MetricsLogger", "read_metrics", "Trainer", "load_weights",
]
