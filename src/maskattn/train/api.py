"""The toolkit's training entry points: train a configuration, continue an interrupted run, train every fold
of a cross-validation. Using a trained checkpoint (loading, prediction, evaluation, translation) is
:mod:`maskattn.inference`."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .config import RunConfig
from .crossval import cross_validate
from .trainer import Trainer

__all__ = ["train", "resume", "cross_validate"]


def train(cfg: RunConfig, *, console: Console | None = None, overwrite: bool = False) -> dict:
    """Train ``cfg`` and return the summary of :meth:`Trainer.fit`; ``overwrite`` replaces a run already in
    ``train.out_dir`` (otherwise that is a :class:`~maskattn.errors.RunFolderError`)."""
    return Trainer(cfg, console=console, overwrite=overwrite).fit()


def resume(path: str | Path, *, train_overrides: dict | None = None, console: Console | None = None) -> dict:
    """Continue the run saved in the resumable checkpoint ``path`` (its ``last.safetensors``), in its folder."""
    return Trainer.resume(path, train_overrides=train_overrides, console=console).fit()
