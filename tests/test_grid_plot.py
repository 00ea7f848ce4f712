"""``maskattn grid plot``: per cell the mean ± std curves over its runs, the test marked at the tested checkpoint,
PNG and SVG, cells named as ``grid table`` names them, a run without metrics named and skipped."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from maskattn.cli import app
from maskattn.grid.plot import cell_curves

from test_grid_compare import write_grid

pytest.importorskip("matplotlib")


def add_metrics(folder, losses, devs, test_step):
    rows = [{"step": 10 * (i + 1), "epoch": 0, "split": "train", "loss": v} for i, v in enumerate(losses)]
    rows += [{"step": 10 * (i + 1), "epoch": 0, "split": "dev", "accuracy": v} for i, v in enumerate(devs)]
    rows.append({"step": test_step, "epoch": 0, "split": "test", "accuracy": 0.5})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "best_step": test_step}))


def test_curves_are_mean_and_std_over_a_cells_runs_and_a_run_without_metrics_is_named(tmp_path):
    grid = write_grid(tmp_path / "g", {"mtsa": {0: 0.9, 1: 0.8, 2: 0.85}, "cnn": {0: 0.7, 1: 0.75}})
    add_metrics(grid / "mtsa" / "seed0", [1.0, 0.8], [0.6, 0.7], 20)
    add_metrics(grid / "mtsa" / "seed1", [1.2, 0.6], [0.5, 0.8], 10)
    add_metrics(grid / "cnn" / "seed0", [1.1], [0.4], 10)  # cnn/seed1: no metrics.jsonl
    cells, metric, skipped = cell_curves([grid])
    assert metric == "accuracy" and [c.label for c in cells] == ["mtsa", "cnn"]
    mtsa = cells[0]
    assert mtsa.runs == 2 and mtsa.train == {10: [1.0, 1.2], 20: [0.8, 0.6]}
    assert mtsa.dev == {10: [60.0, 50.0], 20: [70.0, 80.0]}  # accuracy in %
    assert sorted(mtsa.tests) == [(10, 80.0), (20, 90.0)]  # each run's test at its best step
    assert any("cnn/seed1: no metrics.jsonl" in line for line in skipped)
    assert any("mtsa/seed2: no metrics.jsonl" in line for line in skipped)
    result = CliRunner().invoke(app, ["grid", "plot", str(grid), "--out", str(tmp_path / "plots" / "curves")])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "cnn/seed1: no metrics.jsonl" in result.output
    png, svg = tmp_path / "plots" / "curves.png", tmp_path / "plots" / "curves.svg"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and svg.read_text().lstrip().startswith("<?xml")
    assert "mtsa (2 runs)" in svg.read_text() and "cnn (1 run)" in svg.read_text()  # the legend


def test_a_grid_without_any_curve_is_one_line(tmp_path):
    grid = write_grid(tmp_path / "g", {"mtsa": {0: 0.9, 1: 0.8}})
    result = CliRunner().invoke(app, ["grid", "plot", str(grid)])
    assert result.exit_code == 2 and "has a metrics log to draw" in result.output
    assert len(result.output.strip().splitlines()) == 1
