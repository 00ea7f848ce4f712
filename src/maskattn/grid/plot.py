"""Learning curves of a grid (``maskattn grid plot``): per cell, the training loss and the dev metric against the
step — the mean over the cell's runs (seeds or folds) with a ± one standard deviation band — and every run's test
score marked at the step of the checkpoint it was tested from (``best_step``: the best dev evaluation). Cells are
named as ``maskattn grid table`` names them (runs whose configurations differ only in how a value is spelled —
``model.embed_scale: null`` or the 1.0 it means — are one cell: :func:`~maskattn.grid.table.resolved_records`).
A run's curve is its ``metrics.jsonl``; a finished run without one (or without rows) is named and left out, not an
error. What is drawn with a caveat is said in a note: a run's dev values that are not finite (NaN) are left out of
its cell's curve (they made the whole mean NaN: the curve vanished while the legend counted the run), and a
finished run whose log ends before the step it finished at (a truncated log) is drawn as far as it goes.

At a step only some runs reached (early stopping ends runs at different steps) the mean and band are over the
runs that reached it; a band needs two. Accuracy and F1 are shown in %. The figures are written atomically
(:func:`maskattn.files.atomic_savefig`: a full disk keeps the previous ``curves.png``), and an existing one is
replaced only with ``overwrite`` (``--overwrite``), checked before anything is read
(:func:`maskattn.files.check_outputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ArgumentError, DataError
from ..files import atomic_savefig, check_outputs
from .records import METRICS, RunRecord, collect_runs, finite, read_run_metrics
from .table import PERCENT_METRICS, shown_value, table_rows

__all__ = ["CellCurves", "cell_curves", "plot_grid", "output_paths"]


@dataclass
class CellCurves:
    """One cell's curves: ``train`` and ``dev`` map a step to the runs' values there; ``tests`` the (best step,
    test value) of each run."""

    label: str
    runs: int
    train: dict[int, list[float]] = field(default_factory=dict)
    dev: dict[int, list[float]] = field(default_factory=dict)
    tests: list[tuple[int, float]] = field(default_factory=list)


def cell_curves(grids: Sequence[str | Path],
                metric: str | None = None) -> tuple[list[CellCurves], str, list[str], list[str]]:
    """The curves of every cell of ``grids`` (folders of runs), the dev metric drawn (default: the runs'
    ``train.metric``), the runs left out and the notes on runs drawn with a caveat (module docstring), each as
    ``folder: why``."""
    records, _ = collect_runs(grids)
    _, rows = table_rows(records)
    metric = metric or records[0].summary.get("metric", "accuracy")
    skipped: list[str] = []
    notes: list[str] = []
    cells = []
    for row in rows:
        curves = CellCurves(row.label, 0)
        for record in row.runs:
            rows_of_run = _rows(record, skipped)
            if not rows_of_run:
                continue
            curves.runs += 1
            not_finite = 0
            for item in rows_of_run:
                if item["split"] == "train" and finite(item.get("loss")):
                    curves.train.setdefault(item["step"], []).append(float(item["loss"]))
                elif item["split"] == "dev" and metric in item:
                    if finite(item[metric]):
                        curves.dev.setdefault(item["step"], []).append(shown_value(metric, float(item[metric])))
                    else:
                        not_finite += 1
            if not_finite:
                notes.append(f"{record.folder}: {not_finite} dev {metric} value(s) not a finite number (NaN, infinite or null), "
                             "left out of its cell's curve")
            ended, logged = record.summary.get("steps"), max(item["step"] for item in rows_of_run)
            if isinstance(ended, int) and logged < ended:
                notes.append(f"{record.folder}: its {METRICS} ends at step {logged:,}, the run finished at step "
                             f"{ended:,} (the log was cut short): its curves stop at {logged:,}")
            test = record.summary.get("test", {}).get(metric)
            step = record.summary.get("best_step") or record.summary.get("steps")
            if finite(test) and isinstance(step, int):
                curves.tests.append((step, shown_value(metric, float(test))))
        if curves.runs:
            cells.append(curves)
    if not cells:
        raise ArgumentError(f"no run of {', '.join(map(str, grids))} has a metrics log to draw: "
                            + "; ".join(skipped[:5]))
    if not any(c.dev for c in cells):
        raise ArgumentError(f"no run has dev rows of {metric!r}; the runs' metric is "
                            f"{records[0].summary.get('metric')!r}")
    return cells, metric, skipped, notes


def _rows(record: RunRecord, skipped: list[str]) -> list[dict]:
    if not (record.folder / METRICS).is_file():
        skipped.append(f"{record.folder}: no metrics.jsonl")
        return []
    try:
        rows = read_run_metrics(record.folder)
    except DataError as exc:
        skipped.append(f"{record.folder}: {exc}")
        return []
    if not rows:
        skipped.append(f"{record.folder}: metrics.jsonl holds no rows")
    return rows


def _band(points: dict[int, list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    steps = np.array(sorted(points))
    means = np.array([np.mean(points[s]) for s in steps])
    stds = np.array([np.std(points[s], ddof=1) if len(points[s]) > 1 else 0.0 for s in steps])
    return steps, means, stds


def output_paths(out: str | Path, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """The files :func:`plot_grid` writes for ``out``: ``<out>.png`` and ``<out>.svg``."""
    out = Path(out)
    return [out.with_name(f"{out.name}.{extension}") for extension in formats]


def plot_grid(grids: Sequence[str | Path], out: str | Path, *, metric: str | None = None, title: str | None = None,
              formats: tuple[str, ...] = ("png", "svg"),
              overwrite: bool = False) -> tuple[list[Path], list[str], list[str]]:
    """Draw the curves of ``grids`` (module docstring) into ``<out>.png`` and ``<out>.svg``, atomically; an existing
    file is refused unless ``overwrite`` (before anything is read). Returns the files written, the runs left out and
    the notes on runs drawn with a caveat (``folder: why``)."""
    paths = output_paths(out, formats)
    for path in paths:
        check_outputs({"--out": path}, overwrite=overwrite)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "maskattn"  # the same SVG for the same curves

    cells, metric, skipped, notes = cell_curves(grids, metric)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    unit = " (%)" if metric in PERCENT_METRICS else ""
    for number, cell in enumerate(cells):
        color = colors[number % len(colors)]
        label = f"{cell.label} ({cell.runs} run{'s' if cell.runs != 1 else ''})"
        if cell.train:
            steps, means, stds = _band(cell.train)
            left.plot(steps, means, color=color, lw=1.2, label=label)
            left.fill_between(steps, means - stds, means + stds, color=color, alpha=0.2, lw=0)
        if cell.dev:
            steps, means, stds = _band(cell.dev)
            right.plot(steps, means, color=color, lw=1.4, marker=".", ms=3, label=label)
            right.fill_between(steps, means - stds, means + stds, color=color, alpha=0.2, lw=0)
        if cell.tests:
            xs, ys = zip(*cell.tests)
            right.scatter(xs, ys, color=color, marker="*", s=70, edgecolors="black", linewidths=0.5, zorder=3)
    left.set(xlabel="step", ylabel="training loss (mean over the logging window)", title="training loss")
    right.set(xlabel="step", ylabel=f"dev {metric}{unit}", title=f"dev {metric}; ★ test at the tested checkpoint")
    for axis in (left, right):
        axis.grid(alpha=0.3)
    right.legend(fontsize=8, loc="best")
    fig.suptitle(title or ", ".join(map(str, grids)) + ": mean ± std over the runs of each cell", fontsize=10)
    fig.tight_layout()
    try:
        for path in paths:
            atomic_savefig(fig, path, dpi=110, metadata={"Date": None} if path.suffix == ".svg" else None)
    finally:
        plt.close(fig)
    return paths, skipped, notes
