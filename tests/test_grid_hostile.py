"""A grid under hostile input (issue 42): every run folder strictly inside --out, every YAML through the one guarded
loader, sweeps counted before they are built, damaged run records as one error line, Ctrl-C / SIGTERM while a grid
is checked — and the smaller grid items (a key given twice, float ranges' names, which fixed setting differs, a
user's folder in a run's place, a single `maskattn train` run in a table, small counts in the table)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _train_helpers import write_sentiment
from maskattn.cli import app
from maskattn.errors import ConfigError, DataError
from maskattn.grid import spec as grid_module
from maskattn.grid.records import collect_runs
from maskattn.grid.spec import check_runs, define_grid, parse_seeds, split_values
from maskattn.grid.table import markdown_table

TINY = ["model.d_model=16", "model.num_heads=2", "model.ffn=false", "train.batch_size=16", "train.max_steps=6",
        "train.eval_every=3", "data.dev_fraction=0.25", "optim.name=adam", "train.num_threads=1"]


@pytest.fixture
def data(tmp_path):
    return write_sentiment(tmp_path, n_train=16, n_test=8)


def grid_cli(*args):
    return CliRunner().invoke(app, ["grid", *map(str, args)], catch_exceptions=False)


def one_line_error(result, *fragments: str) -> None:
    """Exit code 2, one `error:` line holding every fragment, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    flat = " ".join(result.output.split())
    for fragment in fragments:
        assert fragment in flat, result.output


# --- 1. every run folder strictly inside --out ---------------------------------------------------------------------

def inside(grid) -> bool:
    root = grid.folder.resolve()
    return all((grid.folder / run.name).resolve().is_relative_to(root) and (grid.folder / run.name).resolve() != root
               for run in grid.runs)


@pytest.mark.parametrize("variant", ["..={model.encoder: mha}", ".={model.encoder: mha}"])
def test_a_variant_named_dot_dot_is_refused(tmp_path, data, variant):
    with pytest.raises(ConfigError, match=r"variant .*name .*not '\.' or '\.\.'"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], variants=[variant])
    (tmp_path / "variants.yaml").write_text("'..': {model.encoder: mha}\n")
    with pytest.raises(ConfigError, match=r"variants file .*not '\.' or '\.\.'; got '\.\.'"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], variants_file=tmp_path / "variants.yaml")
    assert not (tmp_path / "g").exists()


def test_a_swept_value_never_names_a_folder_outside_the_grid(tmp_path, data):
    # YAML reads `1 #/../../../escape` as 1 (a comment): before, the run's folder was <grid>/seed1 #/../../../escape
    grid = define_grid(tmp_path / "a" / "g", overrides=[f"data.dir={data}", *TINY,
                                                        "train.seed=1 #/../../../escape,2"])
    assert inside(grid) and all("/" not in run.name for run in grid.runs)


def test_a_hand_edited_manifest_cannot_send_a_run_outside(tmp_path, data):
    grid = define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], seeds="0")
    grid.folder.mkdir()
    grid.save()
    manifest = json.loads((grid.folder / "grid.json").read_text())
    manifest["runs"][0]["name"] = "../escape/seed0"
    (grid.folder / "grid.json").write_text(json.dumps(manifest))
    result = grid_cli("run", "--out", grid.folder, "--dry-run")
    one_line_error(result, "grid run '../escape/seed0'", "is not inside the grid's folder")
    assert not (tmp_path / "escape").exists()


def test_a_link_or_a_users_folder_where_a_run_goes_is_refused_before_anything_is_written(tmp_path, data):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "encoder=mha").symlink_to(outside)
    with pytest.raises(ConfigError, match=r"encoder=mha/seed0': its folder .* is not inside the grid's folder"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY, "model.encoder=mtsa,mha"], seeds="0")
    (tmp_path / "g" / "encoder=mha").unlink()
    (tmp_path / "g" / "encoder=mha" / "seed0").mkdir(parents=True)
    (tmp_path / "g" / "encoder=mha" / "seed0" / "notes.txt").write_text("mine")
    result = grid_cli("run", "--out", tmp_path / "g", "--data", data, *[a for s in TINY for a in ("--set", s)],
                      "--set", "model.encoder=mtsa,mha", "--seeds", "0")
    one_line_error(result, "encoder=mha/seed0", "holds notes.txt, which no grid run wrote")
    assert sorted(p.name for p in (tmp_path / "g" / "encoder=mha" / "seed0").iterdir()) == ["notes.txt"]
    assert not (tmp_path / "g" / "grid.json").exists()


def test_a_run_folder_inside_another_runs_folder_is_refused(tmp_path, data):
    plain = define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], seeds="0")
    plain.folder.mkdir()
    plain.save()  # run seed0
    with pytest.raises(ConfigError, match=r"grid run seed0/seed0: its folder lies inside the folder of run seed0"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], seeds="0",
                    variants=["seed0={model.encoder: mha}"])


# --- 2. one guarded YAML loader ------------------------------------------------------------------------------------

LEVELS = [("a", "&a [x, x, x, x, x, x, x, x, x]")] + [(b, f"&{b} [{', '.join([f'*{a}'] * 9)}]")
                                                      for a, b in zip("abcdef", "bcdefg")]
BOMB = "".join(f"{name}: {value}\n" for name, value in LEVELS)  # 9**7 values once its aliases are expanded


def test_no_yaml_is_parsed_outside_the_guarded_loader():
    import maskattn

    source = Path(maskattn.__file__).resolve().parent
    offenders = [f"{path.relative_to(source)}:{number}" for path in source.rglob("*.py") if path.name != "sections.py"
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
                 if re.search(r"yaml\.(safe_)?(load|full_load|unsafe_load|load_all|safe_load_all)\(", line)]
    assert offenders == []


def test_an_alias_bomb_in_variants_is_refused_at_once(tmp_path, data):
    # 9**7 values once expanded: before, each variant's settings were expanded (json.dumps) into gigabytes
    (tmp_path / "variants.yaml").write_text(f"{BOMB}bomb:\n  model.encoder_options: {{k: *g}}\n")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"variants file .*variants.yaml: YAML with more than 100000 values"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], variants_file=tmp_path / "variants.yaml")
    inline = "v={" + ", ".join(f"{name}: {value}" for name, value in LEVELS) + ", model.encoder_options: {k: *g}}"
    with pytest.raises(ConfigError, match=r"variant 'v=.*: the settings: YAML with more than 100000 values"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], variants=[inline])
    assert time.perf_counter() - start < 2


def test_a_run_config_bomb_is_a_message_in_the_table(tmp_path):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(BOMB)
    (run / "summary.json").write_text(json.dumps({"metric": "accuracy", "test": {"accuracy": 0.5}}))
    with pytest.raises(DataError, match=r"config.yaml: YAML with more than 100000 values"):
        collect_runs([tmp_path / "runs"])


# --- 3. sweeps counted before they are built -----------------------------------------------------------------------

def test_a_huge_range_or_seed_range_is_counted_not_built():
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"a range of 1,000,000,000,000 runs, more than the 10,000 a grid may have"):
        split_values("range(0, 1000000000000)")
    with pytest.raises(ConfigError, match=r"a range of about 1e\+12 values"):
        split_values("range(0.0, 1.0, 0.000000000001)")
    with pytest.raises(ConfigError, match=r"--seeds '0-100000000': seeds for 100,000,001 runs.*"
                                          r"MASKATTN_GRID_MAX_RUNS=100000001"):
        parse_seeds("0-100000000")
    assert time.perf_counter() - start < 0.5  # before: minutes and gigabytes, or a MemoryError traceback
    assert grid_module.MAX_RUNS == 10_000 and len(parse_seeds("0-9999")) == 10_000


def test_the_product_of_the_sweeps_is_refused_with_the_count_before_any_run_exists(tmp_path, data, monkeypatch):
    monkeypatch.setattr(grid_module, "_runs", lambda *a: pytest.fail("runs built before they were counted"))
    with pytest.raises(ConfigError, match=r"the grid would have 2 variants × 200 values of optim.lr × 100 values of "
                                          r"train.seed = 40,000 runs, more than the 10,000"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}", "optim.lr=range(1, 201)"], seeds="0-99",
                    variants=["a={model.encoder: mtsa}", "b={model.encoder: mha}"])
    monkeypatch.setenv("MASKATTN_GRID_MAX_RUNS", "3")
    with pytest.raises(ConfigError, match=r"= 4 runs, more than the 3 a grid may have"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}", "optim.lr=0.1,0.2"], seeds="0-1")
    monkeypatch.undo()
    monkeypatch.setenv("MASKATTN_GRID_MAX_RUNS", "4")
    assert len(define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY, "optim.lr=0.1,0.2"],
                           seeds="0-1").runs) == 4


def test_a_large_sweep_says_how_far_its_check_has_come(tmp_path, data, monkeypatch):
    clock = iter(range(0, 10_000, 3))
    monkeypatch.setattr(grid_module.time, "monotonic", lambda: next(clock))
    said: list[str] = []
    define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY, "optim.lr=range(1, 6)"], say=said.append)
    assert said and said[0].startswith("checking the runs' configurations: 1 of 5 (")


# --- 5. damaged run records: one error line ------------------------------------------------------------------------

CONFIG = "data:\n  dir: d\ntrain:\n  seed: 0\n  metric: accuracy\n"
SUMMARY = {"metric": "accuracy", "best_dev": 0.5, "test": {"accuracy": 0.6}, "epochs": 1.0, "wall_s": 0.31,
           "parameters": {"without_embeddings": 12345, "total": 20000}}


def fake_run(folder: Path, config: str = CONFIG, summary: object = SUMMARY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(config)
    (folder / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return folder


@pytest.mark.parametrize("config, summary, message", [
    (CONFIG, json.dumps(SUMMARY)[:40], "summary.json: not JSON"),
    (CONFIG, "[1, 2]", "summary.json: expected a JSON object, got list"),
    (CONFIG, {**SUMMARY, "test": "0.6"}, "summary.json: entry 'test' must be an object of test metrics"),
    (CONFIG, {**SUMMARY, "test": {"accuracy": "high"}}, "summary.json: test 'accuracy' must be a finite number"),
    (CONFIG, json.dumps(SUMMARY).replace("0.6", "NaN"), "test metrics, each a finite number (or a text), got "
                                                        "{'accuracy': nan}"),
    (CONFIG, {**SUMMARY, "best_dev": "x"}, "entry 'best_dev' must be a finite number (or null), got 'x'"),
    (CONFIG, {**SUMMARY, "parameters": {"without_embeddings": 1.5}}, "entry 'parameters' must be an object of counts"),
    ("- a\n- b\n", SUMMARY, "config.yaml: expected a run configuration (a mapping of sections"),
    ("data: 3\n", SUMMARY, "config.yaml: expected a run configuration"),
    ("data: [\n", SUMMARY, "config.yaml:2: not valid YAML"),
])
def test_a_damaged_record_is_one_error_line_naming_file_and_entry(tmp_path, config, summary, message):
    fake_run(tmp_path / "g" / "cell" / "seed0", config, summary)
    one_line_error(grid_cli("table", tmp_path / "g"), message)


@pytest.mark.parametrize("name, text, message", [
    ("grid.json", "[1]", "grid.json is not a maskattn grid manifest"),
    ("grid.json", '{"format": "maskattn-grid/1", "runs": 3', "grid.json is not a maskattn grid manifest"),
    ("cost.json", '{"cells": [1]}', "cost.json: entry 'cells' must be an object of cells"),
    ("cost.json", '{"cells": {"": {"epoch_s": NaN}}}', "cost.json: cell '': epoch_s must be a finite number"),
])
def test_a_damaged_manifest_or_cost_file_is_one_error_line(tmp_path, data, name, text, message):
    grid = define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], seeds="0")
    grid.folder.mkdir()
    grid.save()
    fake_run(grid.folder / "seed0")
    (grid.folder / name).write_text(text)
    one_line_error(grid_cli("table", grid.folder), message)
    if name == "grid.json":
        one_line_error(grid_cli("cost", "--out", grid.folder), message)
        one_line_error(grid_cli("run", "--out", grid.folder, "--dry-run"), message)


def test_a_finished_single_run_is_in_the_table_and_small_counts_are_readable(tmp_path):
    single = tmp_path / "runs" / "single"
    single.mkdir(parents=True)
    (single / "config.yaml").write_text(CONFIG.replace("seed: 0", "seed: 1"))
    rows = [{"step": 3, "epoch": 0, "split": "train", "loss": 0.7, "examples_per_s": 300.0},
            {"step": 3, "epoch": 0, "split": "dev", "loss": 0.6, "accuracy": 0.75},
            {"step": 3, "epoch": 1, "split": "test", "loss": 0.6, "accuracy": 0.7, "elapsed_s": 0.42}]
    (single / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fake_run(tmp_path / "runs" / "grid-run")
    records, unfinished = collect_runs([tmp_path / "runs"])
    assert unfinished == [] and len(records) == 2  # before: the single run was "not finished"
    table = markdown_table(records)
    row = table.splitlines()[2]
    assert "| 2 | 60.0 / 70.0 |" in row and "| 75.0 ± 35.4 |" not in row
    assert "| 0.36 s | 12.3 K |" in row  # before: "0 s" and "0.01 M"


# --- 7. Ctrl-C / SIGTERM while a grid is checked --------------------------------------------------------------------

def test_sigterm_while_the_runs_are_checked_ends_with_the_message_and_writes_nothing(tmp_path, data, monkeypatch):
    previous = signal.getsignal(signal.SIGTERM)
    calls = []

    def check_paths(cfg, cwd):
        calls.append(cfg)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(grid_module, "_check_paths", check_paths)
    try:
        result = grid_cli("run", "--out", tmp_path / "g", "--data", data, *[a for s in TINY for a in ("--set", s)],
                          "--set", "optim.lr=range(1, 40)", "--dry-run")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 130, result.output
    assert "interrupted while the grid's runs were checked; nothing was written" in " ".join(result.output.split())
    assert len(calls) == 2 and not (tmp_path / "g").exists()


@pytest.mark.slow
def test_sigterm_stops_a_real_grid_check_at_once(tmp_path, data):
    command = [sys.executable, "-m", "maskattn.cli", "grid", "run", "--out", str(tmp_path / "g"), "--dry-run",
               "--data", str(data), *[a for s in TINY for a in ("--set", s)], "--set", "optim.lr=range(1, 9000)"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    line = process.stderr.readline()  # the first progress line: the check is under way
    assert "checking the runs' configurations" in line
    start = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    while "interrupted" not in (line := process.stderr.readline()) and line:
        pass
    assert "nothing was written" in line and time.perf_counter() - start < 2  # handled at once
    process.communicate(timeout=60)  # the interpreter's own shutdown (torch's) takes seconds on a loaded machine
    assert process.returncode == 130 and not (tmp_path / "g").exists()


# --- minor items ---------------------------------------------------------------------------------------------------

def test_a_fixed_key_given_twice_is_refused(tmp_path, data):
    with pytest.raises(ConfigError, match=r"optim.lr is given twice, '0.1' and '0.2'; give it once, or sweep both "
                                          r"values: optim.lr=0.1,0.2"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}", "optim.lr=0.1", "optim.lr=0.2"])
    with pytest.raises(ConfigError, match=r"data.dir is given twice.*\(--data sets data.dir\)"):
        grid_module.define_grid(tmp_path / "g", overrides=[f"data.dir={data}", f"data.dir={data}/x"])


def test_float_ranges_name_their_cells_by_the_value_meant():
    assert split_values("range(0.1, 0.4, 0.1)") == ["0.1", "0.2", "0.3"]  # not 0.30000000000000004
    assert split_values("range(1.0, 0.0, -0.25)") == ["1.0", "0.75", "0.5", "0.25"]


def test_a_grid_of_other_fixed_settings_names_the_settings_that_differ(tmp_path, data):
    grid = define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], seeds="0")
    grid.folder.mkdir()
    grid.save()
    with pytest.raises(ConfigError, match=r"other fixed settings \(it has model.d_model=16; this command gives "
                                          r"model.d_model=32\)"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}",
                                               *[s.replace("d_model=16", "d_model=32") for s in TINY]],
                    seeds="0")


def test_check_runs_builds_models_without_their_memory(tmp_path, data):
    settings = [s for s in TINY if not s.startswith(("model.d_model", "model.num_heads"))]
    grid = define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *settings, "model.d_model=65536",
                                                  "model.num_heads=2"], seeds="0")
    start = time.perf_counter()
    check_runs(grid)  # on the meta device: before, 65536-wide layers were allocated and initialised
    assert time.perf_counter() - start < 2


@pytest.mark.parametrize("text, shown", [("[1, 2]", "a JSON list, not an object"), ('"grid"', "a JSON str"),
                                         ('{"format": "maskattn-grid/1", "base": {}, "fixed": [], "cwd": ".", '
                                          '"runs": [{"name": 3, "cell": "a", "settings": {}, "replicate": {}, '
                                          '"overrides": []}]}', "name or cell is not a text")])
def test_every_reader_of_a_manifest_gets_the_same_error_for_one_of_another_shape(tmp_path, text, shown):
    """load_grid itself (what `grid run`, `grid status` and the worker read) refuses a manifest of another shape with
    a ConfigError naming the file, not an AttributeError from inside."""
    (tmp_path / "grid.json").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(shown)) as caught:
        grid_module.load_grid(tmp_path)
    assert str(tmp_path / "grid.json") in str(caught.value)
