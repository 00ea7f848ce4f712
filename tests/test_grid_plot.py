"""``maskattn grid plot``: per cell the mean ± std curves over its runs, the test marked at the tested checkpoint,
PNG and SVG, cells named as ``grid table`` names them, a run without metrics named and skipped; non-finite dev values
and logs cut short named in notes; an existing figure replaced only with --overwrite, and never by a partial file."""

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
    cells, metric, skipped, notes = cell_curves([grid])
    assert metric == "accuracy" and [c.label for c in cells] == ["mtsa", "cnn"]
    mtsa = cells[0]
    assert mtsa.runs == 2 and mtsa.train == {10: [1.0, 1.2], 20: [0.8, 0.6]}
    assert mtsa.dev == {10: [60.0, 50.0], 20: [70.0, 80.0]}  # accuracy in %
    assert sorted(mtsa.tests) == [(10, 80.0), (20, 90.0)]  # each run's test at its best step
    assert any("cnn/seed1: no metrics.jsonl" in line for line in skipped)
    assert any("mtsa/seed2: no metrics.jsonl" in line for line in skipped) and notes == []
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


def test_non_finite_dev_values_keep_the_cells_curve_and_a_cut_log_is_named(tmp_path):
    grid = write_grid(tmp_path / "g", {"mtsa": {0: 0.9, 1: 0.8, 2: 0.85}})
    add_metrics(grid / "mtsa" / "seed0", [1.0, 0.8], [0.6, 0.7], 20)
    add_metrics(grid / "mtsa" / "seed1", [1.2, 0.6], [float("nan"), float("nan")], 20)  # diverged on dev
    add_metrics(grid / "mtsa" / "seed2", [1.1, 0.7], [0.5, 0.9], 20)
    summary = json.loads((grid / "mtsa" / "seed2" / "summary.json").read_text())
    (grid / "mtsa" / "seed2" / "summary.json").write_text(json.dumps({**summary, "steps": 60}))  # its log: to 20
    [cell], _, skipped, notes = cell_curves([grid])
    assert cell.runs == 3 and cell.dev == {10: [60.0, 50.0], 20: [70.0, 90.0]}  # NaN made each mean NaN: no curve
    assert skipped == [] and len(notes) == 2
    assert "mtsa/seed1: 2 dev accuracy value(s) not a finite number (NaN, infinite or null), left out" in notes[0]
    assert "mtsa/seed2: its metrics.jsonl ends at step 20, the run finished at step 60 (the log was cut short)" \
        in notes[1]
    result = CliRunner().invoke(app, ["grid", "plot", str(grid), "--out", str(tmp_path / "curves")])
    assert result.exit_code == 0 and "note: " in result.output and "cut short" in result.output


def test_an_existing_figure_needs_overwrite_and_a_full_disk_keeps_it(tmp_path):
    import os
    import subprocess
    import sys

    grid = write_grid(tmp_path / "g", {"mtsa": {0: 0.9, 1: 0.8}})
    add_metrics(grid / "mtsa" / "seed0", [1.0, 0.8], [0.6, 0.7], 20)
    out = tmp_path / "curves"
    assert CliRunner().invoke(app, ["grid", "plot", str(grid), "--out", str(out)]).exit_code == 0
    before = (out.with_suffix(".png").read_bytes(), out.with_suffix(".svg").read_bytes())
    again = CliRunner().invoke(app, ["grid", "plot", str(grid), "--out", str(out)])
    assert again.exit_code == 2 and f"--out {out}.png exists; pass --overwrite to replace it" in again.output
    assert len(again.output.strip().splitlines()) == 1
    assert CliRunner().invoke(app, ["grid", "plot", str(grid), "--out", str(out), "--overwrite"]).exit_code == 0
    # a full disk: no file may grow past 16 KiB (RLIMIT_FSIZE; EFBIG like ENOSPC), the figures are larger
    limit = "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); " \
            "resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384)); from maskattn.cli import app; " \
            "sys.argv = ['maskattn'] + sys.argv[1:]; app()"
    full = subprocess.run([sys.executable, "-c", limit, "grid", "plot", str(grid), "--out", str(out), "--overwrite",
                           "--title", "another title"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "500"})
    assert full.returncode == 2, full.stderr
    assert "while writing it (the previous curves.png, if any, is unchanged)" in full.stderr
    assert (out.with_suffix(".png").read_bytes(), out.with_suffix(".svg").read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "curves.svg", "g"]  # no temporary file
