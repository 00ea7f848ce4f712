"""k-fold cross-validation as one job: every fold of ``data.cv_folds`` trained in ``<out_dir>/fold<i>``, then
the mean ± standard deviation of the test metric over folds (MTSA §4.3: "the accuracies for CR, MPQA and SUBJ
are the mean of 10-fold cross validation").

An interrupted job loses nothing: each fold is run to its end by :func:`~maskattn.train.resumable.run_to_end` (a
finished fold keeps its ``summary.json`` and is not trained again, a fold stopped half-way continues from its
``last.safetensors``, a fold folder holding a run of another configuration is an error), and ``cv.json`` is
rewritten atomically after every fold. The job holds ``<out_dir>`` (and each fold's trainer its fold folder,
:class:`~maskattn.train.run_folder.RunFolder`) for its whole length; ``overwrite`` deletes an earlier job's
folds and ``cv.json`` first, and a folder that holds a plain run is refused without it.
"""

from __future__ import annotations

import copy
import os
import statistics
from pathlib import Path

from rich.console import Console

from ..errors import ArgumentError, ConfigError
from .config import RunConfig
from .resumable import SUMMARY, check_same_run, read_summary, run_to_end, write_json
from .run_folder import RunFolder, refuse_inputs_inside

__all__ = ["cross_validate"]


def _fold_config(cfg: RunConfig, fold: int, fold_dir: Path) -> RunConfig:
    fold_cfg = copy.deepcopy(cfg)
    fold_cfg.data.fold = fold
    fold_cfg.train.out_dir = str(fold_dir)
    return fold_cfg


def cross_validate(cfg: RunConfig, *, console: Console | None = None, overwrite: bool = False) -> dict:
    """Train every fold of ``cfg.data.cv_folds`` (``cfg.data.fold`` is ignored) and return
    ``{"folds": [fold summaries], "metric": name, "mean": m, "std": s, "out_dir": ...}``, where ``mean`` and
    ``std`` (sample standard deviation) are over the folds' test ``metric``; also written to
    ``<out_dir>/cv.json``. An interrupted job continues (module docstring); ``overwrite`` starts it again.
    Raises ``ConfigError`` without ``data.cv_folds >= 2`` or under ``torchrun``, ``RunFolderError`` when another
    process holds ``<out_dir>`` or it holds a plain run."""
    folds = cfg.data.cv_folds
    if folds < 2:
        raise ConfigError(f"cross-validation needs data.cv_folds >= 2 (a dataset without a test split, such as the "
                          f"cr, mpqa and subj presets), got data.cv_folds={folds!r}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("all folds in one job is not supported under torchrun; launch one job per fold with "
                          "--set data.fold=<i>")
    out_dir = Path(cfg.train.out_dir)
    refuse_inputs_inside(out_dir, cfg.data.input_paths())
    with RunFolder(out_dir) as folder:
        names = tuple(f"fold{fold}" for fold in range(folds))
        folder.claim("cv.json", folders=names, record=False)
        if overwrite:
            folder.clear()
        elif any(entry.is_file() and entry.name != "cv.json" for entry in folder.run_entries()):
            folder.refuse_existing_run()  # a plain run, not an earlier cross-validation to continue
        folder.claim("cv.json", folders=names)
        return _run_folds(cfg, out_dir, console)


def _run_folds(cfg: RunConfig, out_dir: Path, console: Console | None) -> dict:
    folds, metric = cfg.data.cv_folds, cfg.train.metric
    summaries = []
    for fold in range(folds):
        fold_dir = out_dir / f"fold{fold}"
        fold_cfg = _fold_config(cfg, fold, fold_dir)
        check_same_run(fold_cfg, fold_dir)
        if console is not None:
            console.print(f"fold {fold + 1} of {folds}: finished earlier ({fold_dir / SUMMARY}), not trained again"
                          if read_summary(fold_dir, metric, what="fold") is not None
                          else f"fold {fold + 1} of {folds} → {fold_dir}")
        summary, _ = run_to_end(fold_cfg, console=console, what="fold")
        summaries.append({"fold": fold, **summary})
        result = _aggregate(summaries, metric, folds, out_dir)
        write_json(out_dir / "cv.json", result)
    return result


def _aggregate(summaries: list[dict], metric: str, folds: int, out_dir: Path) -> dict:
    missing = [s["fold"] for s in summaries if metric not in s.get("test", {})]
    if missing:
        raise ArgumentError(f"train.metric {metric!r} is not among the test metrics of fold(s) {missing}")
    values = [s["test"][metric] for s in summaries]
    return {"folds": summaries, "metric": metric, "completed": len(summaries), "cv_folds": folds,
            "mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "out_dir": str(out_dir)}
