"""The committed grids of benchmarks/results: running one again trains nothing (``grid run --dry-run`` reports 0
runs to train), every record's files agree with each other (summary.json, metrics.jsonl, metrics.csv, train.log,
test.pred.jsonl, and the run manifest .run-files.json lists them), and they keep their paths relative (to the repository or the data root), so a fresh clone with the data beside it
re-runs them. Reads the records only: no data, no training (the configurations are checked against the data
folder only where ../shared/data is there)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from maskattn.cli import app
from maskattn.metrics.test_outputs import PREDICTIONS, read_predictions
from maskattn.grid.spec import load_grid
from maskattn.train.run_folder import MANIFEST_NAME, RUN_FILES

from _train_helpers import flat

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
GRIDS = sorted(path.parent for path in RESULTS.rglob("grid.json"))
#: records that lack a file, and why (docs/results.md says so too)
NO_TRAIN_LOG = {
    # added in 5454a40 without it: the run was not started by `maskattn grid run` (which opens train.log for the
    # run's process) but by a grid worker started by hand, whose output went to a terminal
    "snli_table1/mtsa/seed2",
}


def _runs():
    for grid in GRIDS:
        for run in load_grid(grid).runs:
            folder = grid / run.name
            if (folder / "summary.json").is_file():
                yield pytest.param(grid, folder, id=str(folder.relative_to(RESULTS)))


@pytest.mark.parametrize("grid", GRIDS, ids=[str(g.relative_to(RESULTS)) for g in GRIDS])
def test_a_committed_grid_runs_again_as_a_no_op(grid):
    result = CliRunner().invoke(app, ["grid", "run", "--out", str(grid), "--dry-run"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((grid / "grid.json").read_text())
    # every committed grid is whole (a grid that takes several sessions commits each run's record once it finishes,
    # and none of an unfinished run), so a clean checkout has nothing to train or continue
    assert all((grid / run["name"] / "summary.json").is_file() for run in manifest["runs"])
    assert f"{len(manifest['runs'])} runs; 0 to train (0 new, 0 to continue)" in flat(result.output)
    assert "0 refused" in flat(result.output)


@pytest.mark.parametrize("grid", GRIDS, ids=[str(g.relative_to(RESULTS)) for g in GRIDS])
def test_a_committed_grid_keeps_relative_paths(grid):
    manifest = json.loads((grid / "grid.json").read_text())
    assert not Path(manifest["cwd"]).is_absolute() and (grid / manifest["cwd"]).resolve() == REPO
    assert not any(Path(item.split("=", 1)[1]).is_absolute() for item in manifest["fixed"] if "=" in item)


@pytest.mark.parametrize("grid", [g for g in GRIDS if (REPO.parent / "shared" / "data").is_dir()] or
                         [pytest.param(None, marks=pytest.mark.skip(reason="../shared/data is not here: the runs' "
                                                                    "configurations are checked against it"))])
def test_a_committed_grids_configurations_are_valid_with_the_data(grid):
    from maskattn.grid.spec import check_runs

    check_runs(load_grid(grid))


def _number(text: str):
    return None if text == "" else float(text)


@pytest.mark.parametrize("grid, folder", list(_runs()))
def test_a_records_files_agree(grid, folder):
    summary = json.loads((folder / "summary.json").read_text())
    config = yaml.safe_load((folder / "config.yaml").read_text())
    # paths: relative, and the run's folder is where the record lies
    cwd = load_grid(grid).cwd
    for key in ("dir", "vectors"):
        assert not (config["data"].get(key) and Path(config["data"][key]).is_absolute()), key
    assert (Path(cwd) / config["train"]["out_dir"]).resolve() == folder.resolve()
    assert summary["out_dir"] == config["train"]["out_dir"]
    # metrics.jsonl: the test row is the summary's test, at the tested checkpoint's step; the best dev is its best
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    test = [row for row in rows if row["split"] == "test"]
    assert len(test) == 1 and rows[-1] is test[0]
    assert {k: v for k, v in test[0].items() if k in summary["test"]} == summary["test"]
    assert test[0]["step"] == (summary["best_step"] or summary["steps"])
    metric = summary["metric"]
    dev = [row for row in rows if row["split"] == "dev"]
    best = (min if metric == "loss" else max)(dev, key=lambda row: row[metric])
    assert best[metric] == summary["best_dev"] and best["step"] == summary["best_step"]
    assert max(row["step"] for row in rows) == summary["steps"]
    # the run's manifest lists every run file there (test.pred.jsonl written later by `maskattn eval --predictions`
    # too: a file a manifest does not list is not the run's, so --overwrite would leave it and a rerun refuse it)
    if (folder / MANIFEST_NAME).is_file():
        listed = set(json.loads((folder / MANIFEST_NAME).read_text())["files"])
        assert {name for name in RUN_FILES if (folder / name).is_file()} <= listed, folder
    # test.pred.jsonl (a classifier's predictions, for paired tests): they rescore to the test accuracy recorded
    if (folder / PREDICTIONS).is_file():
        predictions = read_predictions(folder / PREDICTIONS)
        right = sum(p.prediction == p.label for p in predictions)
        assert right / len(predictions) == pytest.approx(summary["test"]["accuracy"], abs=1e-12)
    # metrics.csv: the same rows
    with (folder / "metrics.csv").open(newline="") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(rows)
    for row, line in zip(rows, table):
        assert (int(line["step"]), line["split"]) == (row["step"], row["split"])
        for key, value in line.items():
            if key in row and key not in ("step", "split") and isinstance(row[key], (int, float)):
                assert math.isclose(_number(value), row[key], rel_tol=1e-12), (key, line)
    # train.log: what the run's process printed ends with the summary
    log = folder / "train.log"
    if str(folder.relative_to(RESULTS)) in NO_TRAIN_LOG:
        assert not log.exists()
        return
    printed = [line for line in log.read_text().splitlines() if line.startswith("{")]
    assert printed and json.loads(printed[-1]) == summary


def test_a_copied_grid_continues_and_a_value_equals_the_value_it_resolves_to(tmp_path):
    import shutil

    from maskattn.errors import ConfigError
    from maskattn.train.config import load_config
    from maskattn.train.resumable import check_same_run

    copy = tmp_path / "elsewhere" / "trec"
    shutil.copytree(RESULTS / "table5_vectors" / "trec", copy)
    (copy / "mtsa" / "seed3" / "summary.json").unlink()  # an unfinished run of the copy
    result = CliRunner().invoke(app, ["grid", "run", "--out", str(copy), "--dry-run"])
    assert "20 runs; 1 to train (0 new, 1 to continue), 19 finished, 0 refused" in flat(result.output), result.output
    # the record says model.embed_scale: null; with data.vectors the run means 1.0: the same run
    saved = yaml.safe_load((copy / "mtsa" / "seed0" / "config.yaml").read_text())
    assert saved["model"]["embed_scale"] is None and saved["data"]["vectors"]
    grid = load_grid(copy)
    run = next(r for r in grid.runs if r.name == "mtsa/seed0")
    check_same_run(grid.config(run, ["model.embed_scale=1.0", "train.tensorboard=tb"]), copy / "mtsa" / "seed0")
    with pytest.raises(ConfigError, match=r"holds a run of another configuration \(differs in model.embed_scale\)"):
        check_same_run(grid.config(run, ["model.embed_scale=2.0"]), copy / "mtsa" / "seed0")
    assert load_config(None, ["data.vectors=v.txt"]).model.embed_scale == 1.0
