"""``maskattn train``."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from ..errors import ArgumentError
from .app import DEVICE_HELP, app, interrupt_exits, sigterm_as_interrupt, user_errors


@app.command()
def train(
    config: Path = typer.Option(None, "--config", "-c", help="YAML run configuration (sections data, model, optim, train)"),
    preset: str = typer.Option(None, "--preset", "-p", help="a preset shipped with maskattn (see `maskattn list`)"),
    data: Path = typer.Option(None, "--data", help="dataset folder (sets data.dir)"),
    out: Path = typer.Option(None, "--out", "-o", help="run folder for checkpoints and metrics (train.out_dir)"),
    seed: int = typer.Option(None, "--seed", help="train.seed"),
    max_steps: int = typer.Option(None, "--max-steps", help="train.max_steps"),
    device: str = typer.Option(None, "--device", help=f"train.device: {DEVICE_HELP} (default auto)"),
    resume: Path = typer.Option(None, "--resume", help="continue the run of this last.safetensors checkpoint"),
    overrides: list[str] = typer.Option(None, "--set", "-s", metavar="SECTION.KEY=VALUE",
                                        help="override a config value (repeatable)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show the progress bar"),
    tensorboard: Path = typer.Option(None, "--tensorboard", help="write TensorBoard event files (loss, lr, gradient "
                                     "norm, dev / test metrics, throughput) into this folder (train.tensorboard; "
                                     "needs the tensorboard extra)"),
    all_folds: bool = typer.Option(False, "--all-folds", help="train every fold of data.cv_folds into "
                                   "<out>/fold<i> and report the mean ± std test metric (<out>/cv.json)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the run already in the run folder (what "
                                   "that run wrote, nothing else; deleted once this run holds the folder)"),
):
    """Train a model. With no arguments: the embedded default job (order task, MTSA vs multi-head).

    A run folder belongs to one process at a time, and a folder that holds a run is refused: continue that
    run with --resume <folder>/last.safetensors (alone, or added to the command that started it), replace it
    with --overwrite, or choose another --out."""
    from ..train import api, default_job
    from ..train.config import apply_overrides, load_config, preset_path
    from ..train.distributed import process_rank
    from ..train.trainer import Trainer

    flags = [f"{key}={value}" for key, value in (("data.dir", data), ("train.out_dir", out), ("train.seed", seed),
                                                  ("train.max_steps", max_steps), ("train.device", device),
                                                  ("train.tensorboard", tensorboard))
             if value is not None] + list(overrides or [])
    sigterm_as_interrupt()
    before = ("the finished folds are kept: run the same command again to continue" if all_folds
              else "before training started; nothing was trained")
    with user_errors(), interrupt_exits(before):
        if config and preset:
            raise ArgumentError("give either --config or --preset, not both")
        path = config or (preset_path(preset) if preset else None)
        if resume is not None:
            if all_folds:
                raise ArgumentError("--all-folds continues an interrupted cross-validation by itself: run the same "
                                 "command again, without --resume")
            if overwrite:
                raise ArgumentError("--overwrite starts a new run; --resume continues the run in the checkpoint's "
                                 "folder (give one or the other)")
            progress_flag = {} if progress else {"progress": False}
            extra = apply_overrides({}, flags)
            if path is not None or set(extra) - {"train"}:  # the command that started the run, with --resume added
                command = load_config(path, flags)
                summary = Trainer.resume(resume, train_overrides=progress_flag, command_config=command).fit()
            else:  # --resume alone, perhaps with train.* settings
                summary = api.resume(resume, train_overrides={**extra.get("train", {}), **progress_flag})
        elif config is None and preset is None and data is None and not overrides and seed is None and device is None \
                and not all_folds:
            default_job.run_default_job(str(out or "runs/default"), max_steps=max_steps, progress=progress,
                                        overwrite=overwrite)
            return
        else:
            cfg = load_config(path, flags + ([] if progress else ["train.progress=false"]))
            summary = (api.cross_validate(cfg, console=Console(), overwrite=overwrite) if all_folds
                       else api.train(cfg, overwrite=overwrite))
    if process_rank() == 0:  # every process of a data-parallel run has the summary; the first one prints it
        Console().print_json(json.dumps(summary))
