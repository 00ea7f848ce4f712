"""Learning curves of a grid (``maskattn grid plot``): per cell, the training loss and the dev metric against the
step — the mean over the cell's runs (seeds or folds) with a ± one standard deviation band — and every run's test
score marked at the step of the checkpoint it was tested from (``best_step``: the best dev evaluation). Cells are
named as ``maskattn grid table`` names them (runs whose configurations differ only in how a value is spelled —
``model.embed_scale: null`` or the 1.0 it means — are one cell: :func:`~maskattn.grid.table.resolved_records`).
A run's curve is its ``metrics.jsonl``; a finished run without one (or without rows) is named and left out, not an
error.

At a step only some runs reached (early stopping ends runs at different steps) the mean and band are over the
runs that reached it; a band needs two. Accuracy and F1 are shown in %.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ArgumentError, DataError
from .records import METRICS, RunRecord, collect_runs, read_run_metrics
from .table import PERCENT_METRICS, shown_value, table_rows

__all__ = ["CellCurves", "cell_curves", "plot_grid"]


@dataclass
class CellCurves:
    """One cell's curves: ``train`` and ``dev`` map a step to the runs' values there; ``tests`` the (best step,
    test value) of each run."""

    label: str
    runs: int
    train: dict[int, list[float]] = field(default_factory=dict)
    dev: dict[int, list[float]] = field(default_factory=dict)
    tests: list[tuple[int, float]] = field(default_factory=list)


def cell_curves(grids: Sequence[str | Path], metric: str | None = None) -> tuple[list[CellCurves], str, list[str]]:
    """The curves of every cell of ``grids`` (folders of runs), the dev metric drawn (default: the runs'
    ``train.metric``) and the runs left out, each as ``folder: why``."""
    records, _ = collect_runs(grids)
    _, rows = table_rows(records)
    metric = metric or records[0].summary.get("metric", "accuracy")
    skipped: list[str] = []
    cells = []
    for row in rows:
        curves = CellCurves(row.label, 0)
        for record in row.runs:
            rows_of_run = _rows(record, skipped)
            if not rows_of_run:
                continue
            curves.runs += 1
            for item in rows_of_run:
                if item["split"] == "train" and isinstance(item.get("loss"), (int, float)):
                    curves.train.setdefault(item["step"], []).append(float(item["loss"]))
                elif item["split"] == "dev" and isinstance(item.get(metric), (int, float)):
                    curves.dev.setdefault(item["step"], []).append(shown_value(metric, float(item[metric])))
            test = record.summary.get("test", {}).get(metric)
            step = record.summary.get("best_step") or record.summary.get("steps")
            if isinstance(test, (int, float)) and isinstance(step, int):
                curves.tests.append((step, shown_value(metric, float(test))))
        if curves.runs:
            cells.append(curves)
    if not cells:
        raise ArgumentError(f"no run of {', '.join(map(str, grids))} has a metrics log to draw: "
                            + "; ".join(skipped[:5]))
    if not any(c.dev for c in cells):
        raise ArgumentError(f"no run has dev rows of {metric!r}; the runs' metric is "
                            f"{records[0].summary.get('metric')!r}")
    return cells, metric, skipped


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


def plot_grid(grids: Sequence[str | Path], out: str | Path, *, metric: str | None = None, title: str | None = None,
              formats: tuple[str, ...] = ("png", "svg")) -> tuple[list[Path], list[str]]:
    """Draw the curves of ``grids`` (module docstring) into ``<out>.png`` and ``<out>.svg``; returns the files
    written and the runs left out (``folder: why``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "maskattn"  # the same SVG for the same curves

    cells, metric, skipped = cell_curves(grids, metric)
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
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for extension in formats:
        path = out.with_name(f"{out.name}.{extension}")
        fig.savefig(path, dpi=110, metadata={"Date": None} if extension == "svg" else None)
        written.append(path)
    plt.close(fig)
    return written, skipped
