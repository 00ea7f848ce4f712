"""``maskattn grid``: Hydra-style sweeps × seeds as one job — every run in its own folder, checked before any
starts, several at a time, resumable; the Markdown table of the run folders; the efficiency of the cells."""

from __future__ import annotations

import fcntl
import json
import statistics
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from _train_helpers import fit_killed_before_step, write_sentiment
from maskattn.cli import app
from maskattn.errors import ArgumentError, ConfigError
from maskattn.train import Trainer
from maskattn.grid.records import collect_runs
from maskattn.grid.scheduler import run_grid
from maskattn.grid.spec import define_grid, parse_seeds, split_values
from maskattn.grid.table import markdown_table
from maskattn.grid.worker import DONE_EXIT, run_one

TINY = ["model.d_model=16", "model.num_heads=2", "model.ffn=false", "train.batch_size=16", "train.max_steps=6",
        "train.eval_every=3", "train.log_every=1", "data.dev_fraction=0.25", "optim.name=adam", "optim.lr=0.01",
        "train.num_threads=1"]


def test_values_split_as_hydra_multirun():
    assert split_values("mtsa") == ["mtsa"]
    assert split_values("mtsa,mha, bilstm") == ["mtsa", "mha", "bilstm"]
    assert split_values("'csan2d x3, mha x3',mtsa") == ["'csan2d x3, mha x3'", "mtsa"]
    assert split_values("[0.9, 0.98],[0.9, 0.999]") == ["[0.9, 0.98]", "[0.9, 0.999]"]
    assert split_values("mtsa(window=5, heads=[a, b]),mha") == ["mtsa(window=5, heads=[a, b])", "mha"]
    assert split_values("range(0,3)") == ["0", "1", "2"]
    assert split_values("range(0.5, 1.1, 0.25)") == ["0.5", "0.75", "1.0"]
    for bad, message in (("a,,b", "empty value"), ("[1, 2", "unbalanced brackets"), ("'a,b", "unbalanced quote"),
                         ("range(3,0)", "range is empty"), ("range(a,b)", "expected range")):
        with pytest.raises(ConfigError, match=message):
            split_values(bad)
    assert parse_seeds("0-2,7,1") == [0, 1, 2, 7] and parse_seeds("range(3,5)") == [3, 4]
    with pytest.raises(ConfigError, match="expected seeds such as 0-4"):
        parse_seeds("2-0")


def test_runs_are_variants_times_values_times_seeds(tmp_path):
    data = write_sentiment(tmp_path)
    grid = define_grid(tmp_path / "grid", overrides=[f"data.dir={data}", *TINY, "optim.lr=0.01,0.001"],
                       variants=["mtsa={model.encoder: mtsa}", "mha={model.encoder: mha, model.positional: sinusoidal}"],
                       seeds="0-1")
    names = [run.name for run in grid.runs]
    assert names == ["mtsa,lr=0.01/seed0", "mtsa,lr=0.001/seed0", "mha,lr=0.01/seed0", "mha,lr=0.001/seed0",
                     "mtsa,lr=0.01/seed1", "mtsa,lr=0.001/seed1", "mha,lr=0.01/seed1", "mha,lr=0.001/seed1"]
    mha = grid.config(grid.runs[3])
    assert (mha.model.encoder, mha.model.positional, mha.optim.lr, mha.train.seed) == ("mha", "sinusoidal", 0.001, 0)
    assert mha.train.out_dir == str(tmp_path / "grid" / "mha,lr=0.001" / "seed0")
    assert not (tmp_path / "grid").exists()  # defining writes nothing


def test_variants_come_from_a_file_too(tmp_path):
    data = write_sentiment(tmp_path)
    path = tmp_path / "models.yaml"
    path.write_text("mtsa: {model.encoder: mtsa}\nbilstm: {model.encoder: bilstm, model.encoder_options: {hidden: 8}}\n")
    every = define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], variants_file=path)
    assert [r.name for r in every.runs] == ["mtsa/run", "bilstm/run"]
    assert every.config(every.runs[1]).model.encoder_options == {"hidden": 8}
    picked = define_grid(tmp_path / "g", overrides=[f"data.dir={data}", *TINY], variants_file=path,
                         variants=["bilstm", "mha={model.encoder: mha}"])
    assert [r.cell for r in picked.runs] == ["bilstm", "mha"]
    with pytest.raises(ConfigError, match=r"variant 'gru'.*or one of the variants of .*models.yaml: mtsa, bilstm"):
        define_grid(tmp_path / "g", overrides=[f"data.dir={data}"], variants_file=path, variants=["gru"])
    shipped = define_grid(tmp_path / "g", preset="trec", overrides=[f"data.dir={data}"],
                          variants_file=Path(__file__).resolve().parents[1] / "benchmarks" / "grids"
                          / "sentence_models.yaml")
    assert {r.cell for r in shipped.runs} >= {"mtsa", "mha", "cnn_rand", "cnn_static", "cnn_nonstatic"}


@pytest.mark.parametrize("override, message", [
    ("model.encoderr=mtsa,mha", r"grid run encoderr=mtsa/run .*unknown config key\(s\) model.encoderr"),
    ("model.d_model=16,abc", r"grid run d_model=abc/run .*model.d_model must be int, got 'abc'"),
    ("model.dropout=0.1,1.5", r"model.dropout must be in \[0, 1\), got 1.5"),
    ("model.encoder=mtsa,nosuch", r"grid run encoder=nosuch/run .*unknown sublayer 'nosuch'"),
    ("data.vectors=missing.txt", r"data.vectors missing.txt is not a file"),
    ("train.out_dir=x", r"each run of a grid has its own folder"),
])
def test_a_bad_setting_refuses_the_grid_before_any_run(tmp_path, override, message):
    data = write_sentiment(tmp_path)
    with pytest.raises(ConfigError, match=message):
        define_grid(tmp_path / "grid", overrides=[f"data.dir={data}", *TINY, override], cwd=tmp_path)
    assert not (tmp_path / "grid").exists()


def run_cli(*args):
    return CliRunner().invoke(app, ["grid", *map(str, args)], catch_exceptions=False)


def test_an_interrupted_run_resumes_exactly_and_a_finished_one_is_kept(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    grid = define_grid(tmp_path / "grid", overrides=[f"data.dir={data}", *TINY], seeds="0")
    grid.folder.mkdir()
    grid.save()
    fit_killed_before_step(monkeypatch, grid.config(grid.runs[0]), 5)
    assert run_one(grid.folder, "seed0", 1) == 0  # what a grid process runs for the run, here in-process
    metrics = [json.loads(line) for line in (grid.folder / "seed0" / "metrics.jsonl").open()]
    assert [r["step"] for r in metrics if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]  # continued, not restarted
    reference = Trainer(grid.config(grid.runs[0], [f"train.out_dir={tmp_path / 'reference'}"])).fit()
    summary = json.loads((grid.folder / "seed0" / "summary.json").read_text())
    assert summary["test"] == reference["test"] and summary["steps"] == 6
    assert yaml.safe_load((grid.folder / "seed0" / "config.yaml").read_text())["train"]["num_threads"] == 1
    best = (grid.folder / "seed0" / "best.safetensors").stat().st_mtime_ns
    record = (grid.folder / "seed0" / "worker.json").read_bytes()
    assert run_one(grid.folder, "seed0", 1) == DONE_EXIT  # finished: not trained again, nothing recorded
    assert (grid.folder / "seed0" / "best.safetensors").stat().st_mtime_ns == best
    assert (grid.folder / "seed0" / "worker.json").read_bytes() == record


def test_a_run_another_grid_process_finished_meanwhile_is_not_reported_finished_twice(tmp_path):
    """Two grid run on one folder: a run the other process finished after this one planned it is "finished by
    another process", not "finished now" — no worker started for it, nothing appended to its log (both processes
    reported it finished and appended the summary to train.log twice)."""
    from maskattn.train.resumable import write_json

    data = write_sentiment(tmp_path)
    grid = define_grid(tmp_path / "grid", overrides=[f"data.dir={data}", *TINY], seeds="0-1")
    lines: list[str] = []

    def say(line: str) -> None:  # once the grid is planned, "another process" finishes seed1
        lines.append(line)
        if len(lines) == 1:
            (grid.folder / "seed1").mkdir(parents=True)
            write_json(grid.folder / "seed1" / "summary.json", {"metric": "accuracy", "test": {"accuracy": 0.5}})

    outcome = run_grid(grid, jobs=1, threads=1, say=say)
    assert outcome["finished"] == ["seed0"] and outcome["done"] == ["seed1"], lines
    assert "seed1: finished by another process meanwhile" in lines
    assert not (grid.folder / "seed1" / "train.log").exists()


@pytest.mark.slow
def test_a_grid_runs_resumes_grows_and_makes_its_table(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    out = tmp_path / "grid"
    sets = [a for item in TINY for a in ("--set", item)]
    common = ["--out", out, "--data", data, *sets, "--set", "model.encoder=mtsa,mha", "--seeds", "0-1"]
    grid = define_grid(out, overrides=[f"data.dir={data}", *TINY, "model.encoder=mtsa,mha"], seeds="0-1")
    fit_killed_before_step(monkeypatch, grid.config(grid.runs[1]), 5)  # encoder=mha/seed0, before the grid starts
    result = run_cli("run", *common, "--jobs", "2", "--threads", "1")
    assert result.exit_code == 0, result.output
    assert "4 runs, 0 finished earlier, 4 to run, 2 at a time with 1 thread(s) each" in result.output
    resumed = [json.loads(line) for line in (out / "encoder=mha" / "seed0" / "metrics.jsonl").open()]
    assert [r["step"] for r in resumed if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    again = run_cli("run", "--out", out)  # the grid alone: everything finished
    assert "4 finished earlier, 0 to run" in again.output
    grown = run_cli("run", *common[:-1], "0-2")
    assert "6 runs, 4 finished earlier, 2 to run" in grown.output and (out / "encoder=mtsa" / "seed2").is_dir()

    table = run_cli("table", out)
    assert table.exit_code == 0, table.output
    lines = [line for line in table.output.splitlines() if line.startswith("| encoder=")]
    assert [line.split(" | ")[0] for line in lines] == ["| encoder=mtsa", "| encoder=mha"]  # the grid's order
    mtsa = [100 * json.loads((out / "encoder=mtsa" / f"seed{s}" / "summary.json").read_text())["test"]["accuracy"]
            for s in range(3)]
    cells = lines[0].split(" | ")
    assert cells[1] == "3" and cells[2] == " / ".join(f"{v:.1f}" for v in mtsa)
    assert cells[3] == f"{statistics.mean(mtsa):.1f} ± {statistics.stdev(mtsa):.1f}"


def test_a_run_held_by_another_process_is_left_to_it(tmp_path):
    data = write_sentiment(tmp_path)
    grid = define_grid(tmp_path / "grid", overrides=[f"data.dir={data}", *TINY], seeds="0")
    folder = tmp_path / "grid" / "seed0"
    folder.mkdir(parents=True)
    with open(folder / ".grid-worker", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        outcome = run_grid(grid, say=lambda line: None)
    assert outcome["busy"] == ["seed0"] and not (folder / "summary.json").exists()


def test_a_failed_run_is_reported_and_the_others_go_on(tmp_path):
    data = write_sentiment(tmp_path)
    (data / "broken").mkdir()
    (data / "broken" / "train.tsv").write_text("no tab here\n")
    grid = define_grid(tmp_path / "grid", overrides=[*TINY, f"data.dir={data / 'broken'},{data}"], seeds="0")
    lines = []
    outcome = run_grid(grid, jobs=2, threads=1, say=lines.append)
    assert outcome["failed"] == [grid.runs[0].name] and outcome["finished"] == [grid.runs[1].name]
    assert any("failed (exit status 2): error:" in line and "train.tsv:1: expected 'label<TAB>text'" in line
               for line in lines)


def test_a_table_of_different_presets_is_refused(tmp_path):
    data = write_sentiment(tmp_path)
    for preset in ("sst5", "trec"):
        grid = define_grid(tmp_path / preset, preset=preset, seeds="0",
                           overrides=[f"data.dir={data}", "data.format=tsv", "data.train=train.tsv",
                                      "data.test=test.tsv", "data.dev=null", *TINY])
        Trainer(grid.config(grid.runs[0])).fit()
        (tmp_path / preset / "seed0" / "summary.json").write_text(json.dumps({"metric": "accuracy", "best_dev": 0.5,
                                                                               "test": {"accuracy": 0.5}}))
        grid.folder.mkdir(exist_ok=True)
        grid.save()
    records, _ = collect_runs([tmp_path / "sst5"])
    assert "| (base) | 1 | 50.0 |" in markdown_table(records)
    with pytest.raises(ValueError, match=r"2 different presets or data sets.*sst5.*preset sst5.*trec.*preset trec"):
        collect_runs([tmp_path / "sst5", tmp_path / "trec"])


def test_cost_measures_every_cell(tmp_path):
    data = write_sentiment(tmp_path)
    out = tmp_path / "grid"
    result = run_cli("cost", "--out", out, "--data", data, *[a for item in TINY for a in ("--set", item)],
                     "--set", "model.encoder=mtsa,bilstm", "--steps", "2", "--rounds", "2", "--warmup", "1",
                     "--memory-batch", "4", "--memory-length", "8")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "cost.json").read_text())
    assert sorted(report["cells"]) == ["encoder=bilstm", "encoder=mtsa"]
    for cell in report["cells"].values():
        assert len(cell["step_s"]) == 2 and cell["epoch_s"] == pytest.approx(
            statistics.median(cell["step_s"]) * cell["batches_per_epoch"])
        assert cell["peak_memory_bytes"] > 0 and cell["inference_s"] > 0
        assert cell["parameters"]["without_embeddings"] < cell["parameters"]["total"]
    assert "| encoder=mtsa |" in result.output and "peak memory" in result.output


def test_the_table_names_the_throughput_unit_of_the_task(tmp_path):
    """A seq2seq run reports target tokens/s, a classifier examples/s: the column says which it shows."""
    from maskattn.grid.records import RunRecord

    def record(seed, **speed):
        summary = {"metric": "rouge", "best_dev": 20.0, "test": {"rouge": 16.0 + seed}, "epochs": 4.8, **speed}
        return RunRecord(tmp_path / f"seed{seed}", {"train.seed": seed}, summary)

    table = markdown_table([record(0, tokens_per_s=600.0), record(1, tokens_per_s=620.0)])
    assert "| train tokens/s |" in table and "| 610 |" in table and "examples/s" not in table
    table = markdown_table([record(0, examples_per_s=300.0)])
    assert "| train examples/s |" in table and "| 300 |" in table


def test_the_table_shows_several_test_metrics_and_refuses_one_no_run_has(tmp_path):
    """ROUGE-1/2/L of a summarization grid side by side: each metric its per-run and mean ± std columns."""
    from maskattn.grid.records import RunRecord

    def record(seed, r1, r2):
        summary = {"metric": "rouge", "best_dev": 20.0, "test": {"rouge1": r1, "rouge2": r2}, "epochs": 2.0}
        return RunRecord(tmp_path / f"seed{seed}", {"train.seed": seed}, summary)

    records = [record(0, 22.5, 7.0), record(1, 23.5, 7.5)]
    table = markdown_table(records, metric="rouge1, rouge2")
    header, rule, row = table.splitlines()[:3]
    assert "| test rouge1, per run | test rouge1 | test rouge2, per run | test rouge2 | best dev rouge |" in header
    assert rule.count("|") == header.count("|")
    assert "| 22.50 / 23.50 | 23.00 ± 0.71 | 7.00 / 7.50 | 7.25 ± 0.35 | 20.00 ± 0.00 |" in row
    assert markdown_table(records, metric=["rouge2"]).splitlines()[2] == row.replace(
        "| 22.50 / 23.50 | 23.00 ± 0.71 ", "")
    with pytest.raises(ArgumentError, match="--metric rougeL: no run was tested on it; the runs' test metrics "
                                            "are rouge1, rouge2"):
        markdown_table(records, metric="rouge1,rougeL")


def test_the_per_run_legend_follows_the_order_of_the_values(tmp_path):
    """Seeds 0-11 are listed 0, 1, 2, ..., 11 (not 0, 1, 10, 11, 2 as text sorts), the legend says so in a range,
    a fold is named only in cross-validation, and a row with fewer runs says which it has."""
    from maskattn.grid.records import RunRecord

    def record(encoder, seed, fold=None):
        config = {"model.encoder": encoder, "train.seed": seed}
        if fold is not None:
            config.update({"data.fold": fold, "data.cv_folds": 10})
        summary = {"metric": "accuracy", "best_dev": 0.5, "test": {"accuracy": (seed + (fold or 0)) / 100},
                   "epochs": 1.0}
        return RunRecord(tmp_path / f"{encoder}{seed}-{fold}", config, summary)

    records = [record("mtsa", seed) for seed in (11, 2, 0, 10, 1, *range(3, 10))] + [record("mha", 0),
                                                                                     record("mha", 2)]
    lines = markdown_table(records).splitlines()
    assert lines[2].startswith("| model.encoder=mtsa | 12 | " + " / ".join(f"{s:.1f}" for s in range(12)) + " |")
    assert lines[3].startswith("| model.encoder=mha | 2 | 0.0 / 2.0 |")
    assert lines[-1] == ("Per run: seeds 0–11 (model.encoder=mha: seeds 0, 2), in that order; mean ± sample "
                         "standard deviation over the runs of a row.")
    folds = markdown_table([record("mtsa", 0, fold) for fold in (9, 0, 3, 1, 2, 4, 5, 6, 7, 8)])
    assert folds.splitlines()[2].startswith("| (one cell) | 10 | 0.0 / 1.0 / 2.0 / 3.0 /")
    assert folds.splitlines()[-1].startswith("Per run: folds 0–9 (seed 0), in that order;")
    both = markdown_table([record("mtsa", seed, fold) for seed in (1, 0) for fold in (1, 0)]).splitlines()[-1]
    assert both.startswith("Per run: seed 0 fold 0, seed 0 fold 1, seed 1 fold 0, seed 1 fold 1, in that order;")
    assert markdown_table([record("mtsa", 3)]).splitlines()[-1].startswith("Per run: seed 3, in that order;")


def test_the_table_says_what_the_vectors_covered(tmp_path):
    from maskattn.train.resumable import run_to_end

    data = write_sentiment(tmp_path)
    (tmp_path / "glove.txt").write_text("the 1 2 3 4\ngood 5 6 7 8\n")
    grid = define_grid(tmp_path / "grid", overrides=[f"data.dir={data}", *TINY, f"data.vectors={tmp_path / 'glove.txt'}",
                                                     "model.embed_dim=4"], seeds="0")
    grid.folder.mkdir()
    grid.save()
    summary, trained = run_to_end(grid.config(grid.runs[0]))
    assert trained and run_to_end(grid.config(grid.runs[0]))[1] is False  # finished: read, not trained again
    records, _ = collect_runs([grid.folder])
    coverage = summary["data"]["vectors"]
    assert (f"Pretrained vectors (1 of 1 runs, {tmp_path / 'glove.txt'}): "
            f"{coverage['types_covered'] / coverage['vocab_types']:.1%} of the training vocabulary types, "
            f"{coverage['token_share']:.1%} of the training tokens.") in markdown_table(records)


def test_a_runs_log_tail_is_read_from_its_end(tmp_path):
    """`grid status` and `grid run` show the last lines of a run's log: read from its end, at most 4 MiB of it,
    whatever the log's size (issue 54: the records module's readers are bounded)."""
    import tracemalloc

    from maskattn.grid.records import log_tail

    with open(tmp_path / "train.log", "wb") as log:
        log.write(b"first\n" + b"x" * 2**25 + b"\nsecond to last\n\n  \nlast \n")
    tracemalloc.start()
    try:
        assert log_tail(tmp_path, 2) == ["second to last", "last"]
        assert log_tail(tmp_path, 5) == ["second to last", "last"]  # a line longer than 4 MiB is not read whole
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    (tmp_path / "train.log").write_text("one\r\ntwo\n\nthree")
    assert log_tail(tmp_path, 3) == ["one", "two", "three"] and log_tail(tmp_path / "nosuch") == []


def _sparse_log(path: Path, size: int, end: bytes) -> None:
    """A log of ``size`` bytes of NULs (a sparse file: nothing on disk) and no line break, then ``end``."""
    with open(path, "wb") as log:
        log.truncate(size)
        log.seek(size)
        log.write(end)


def test_grid_status_of_a_failed_run_reads_a_2_gb_log_from_its_end(tmp_path):
    import tracemalloc

    from maskattn.train.resumable import write_json

    data = write_sentiment(tmp_path)
    grid = define_grid(tmp_path / "grid", overrides=[f"data.dir={data}", *TINY], seeds="0")
    grid.folder.mkdir()
    grid.save()
    folder = grid.folder / "seed0"
    folder.mkdir()
    write_json(folder / "worker.json", {"pid": 1, "host": "h", "outcome": "failed", "error": "DataError: x"})
    _sparse_log(folder / "train.log", 2 * 2**30, b"\nerror: the last words\n")
    tracemalloc.start()
    try:
        result = run_cli("status", grid.folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0 and "seed0: failed: error: the last words" in result.output, result.output
    assert peak < 64 * 2**20, peak


def test_a_slurm_jobs_failure_reads_the_last_line_of_the_log_from_its_end(tmp_path):
    """The job's process says why its worker failed from the log's last line: read from the end (it read every
    line, holding a line as long as it is: a log of one long line was held whole)."""
    import sys
    import tracemalloc

    from maskattn.grid.launchers.slurm_job import SlurmRun

    (tmp_path / "r").mkdir()
    _sparse_log(tmp_path / "r" / "train.log", 64 * 2**20, b"\n")  # an earlier job's output, one long line
    job = SlurmRun(str(tmp_path), "r", [sys.executable, "-c", "print('error: the last words'); raise SystemExit(3)"],
                   {}, str(tmp_path), watch_parent=False)
    tracemalloc.start()
    try:
        with pytest.raises(RuntimeError, match=r"worker ended with exit status 3: error: the last words \(log: "):
            job()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak


def test_grid_status_says_where_each_run_is(tmp_path):
    from maskattn.train.resumable import write_json

    data = write_sentiment(tmp_path)
    grid = define_grid(tmp_path / "grid", overrides=[f"data.dir={data}", *TINY], seeds="0-4")
    grid.folder.mkdir()
    grid.save()
    folders = [grid.folder / run.name for run in grid.runs]
    for folder in folders[:4]:
        folder.mkdir()
    write_json(folders[0] / "summary.json", {"metric": "accuracy", "test": {"accuracy": 0.75}})
    write_json(folders[1] / "worker.json", {"pid": 1, "host": "h", "outcome": "failed", "error": "DataError: x"})
    (folders[1] / "train.log").write_text("loading\nerror: train.tsv:1: expected 'label<TAB>text'\n")
    write_json(folders[2] / "worker.json", {"pid": 1, "host": "h", "outcome": "interrupted"})
    (folders[2] / "last.safetensors").write_bytes(b"")
    with open(folders[3] / ".grid-worker", "a") as handle:  # a worker holds it
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = run_cli("status", grid.folder)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "seed0: finished: test accuracy 0.7500",
        "seed1: failed",
        "    loading",
        "    error: train.tsv:1: expected 'label<TAB>text'",
        "seed2: stopped: continues from its last.safetensors",
        "seed3: running",
        "seed4: not started",
        "5 runs: 1 finished, 1 running, 0 queued, 1 failed, 1 stopped, 1 not started"]


def test_the_slurm_launcher_refuses_in_one_line_what_it_cannot_submit(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    common = ["run", "--out", tmp_path / "grid", "--data", data, *[a for i in TINY for a in ("--set", i)]]
    for extra, message in (
            (["--slurm-time", "90"], "--slurm-time: only with --launcher slurm"),
            (["--launcher", "pbs"], "--launcher must be one of local, slurm, got 'pbs'"),
            (["--launcher", "slurm", "--slurm-time", "1:2:3:4"], "--slurm-time '1:2:3:4': expected Slurm's time"),
            (["--launcher", "slurm", "--slurm-option", "=x"], "--slurm-option '=x': expected key=value"),
            (["--launcher", "slurm", "--slurm-gpus-per-task", "0"], "--slurm-gpus-per-task must be an int >= 1"),
            (["--launcher", "slurm", "--slurm-time", "1", "--slurm-signal-delay", "0"],
             "--slurm-signal-delay must be an int >= 1, got 0"),
            (["--launcher", "slurm", "--slurm-time", "1", "--slurm-signal-delay", "16"],
             "--slurm-signal-delay 16: at most 15 s with a 1-minute time limit (--slurm-time 1): Slurm sends the "
             "warning up to 30 s before the delay asks"),
            (["--launcher", "slurm", "--slurm-time", "4:00:00", "--slurm-signal-delay", "7186"],
             "--slurm-signal-delay 7186: at most 7185 s with a 240-minute time limit")):
        result = run_cli(*common, *extra)
        assert result.exit_code == 2 and result.output.startswith(f"error: {message}"), result.output
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no Slurm here
    result = run_cli(*common, "--launcher", "slurm")
    assert result.exit_code == 2 and result.output == ("error: --launcher slurm: sbatch, squeue, scontrol, sinfo not "
                                                       "found on PATH (Slurm's client commands are needed on the machine "
                                                       "that submits the grid)\n")
    monkeypatch.setattr("maskattn.grid.launchers.slurm._have_submitit", lambda: False)
    result = run_cli(*common, "--launcher", "slurm")
    assert result.output == "error: --launcher slurm needs submitit: pip install 'maskattn[slurm]' (or pip install " \
                            "submitit)\n"
    assert not (tmp_path / "grid").exists()  # refused before anything was written


def test_an_unreachable_slurm_controller_is_refused_before_anything_is_written(tmp_path):
    """The controller check asked `squeue -j 0`, which squeue refuses itself ("Invalid job id") without asking the
    controller: with none answering, grid.json, .grid-submit and submitit's files were written before sbatch failed.
    Here the client commands point at a controller that is not there (SLURM_CONF)."""
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.skip("Slurm's client commands are not installed")
    pytest.importorskip("submitit")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nAuthType=auth/munge\n"
                    "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=localhost Default=YES\n")
    data = write_sentiment(tmp_path)
    done = subprocess.run([sys.executable, "-m", "maskattn.cli", "grid", "run", "--out", str(tmp_path / "grid"),
                           "--data", str(data), *[a for i in TINY for a in ("--set", i)], "--launcher", "slurm"],
                          capture_output=True, text=True, env={**os.environ, "SLURM_CONF": str(conf), "COLUMNS": "300"},
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert "error: --launcher slurm: the Slurm controller does not answer (sinfo: " in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "grid").exists()


def test_slurm_signal_delays_that_work():
    """Slurm warns a job at its first look (every 30 s) within delay + 30 s of its end, from each start: the
    delays allowed leave every job at least the delay before the earliest warning; the default is always one."""
    from maskattn.grid.launchers.slurm import CHECK_INTERVAL_S, default_signal_delay, max_signal_delay

    for minutes in (1, 2, 5, 20, 60, 240, 1440, 525600):
        most = max_signal_delay(minutes)
        assert minutes * 60 - most - CHECK_INTERVAL_S >= most  # the earliest warning, after the delay's length
        assert 1 <= default_signal_delay(minutes) <= most
    assert max_signal_delay(1) == 15 and max_signal_delay(2) == 45


def test_slurm_times_and_options_read_as_slurm_writes_them():
    from maskattn.grid.launchers.slurm import SlurmOptions, _refusal, parse_slurm_options, parse_slurm_time

    assert [parse_slurm_time(t) for t in ("60", "1:30", "4:00:00", "1-12", "1-0:30", "0-0:0:1")] == \
        [60, 2, 240, 2160, 1470, 1]
    assert parse_slurm_options(["constraint=a100", "--mail-type=END", "exclusive"]) == \
        {"constraint": "a100", "mail-type": "END", "exclusive": True}
    line = _refusal("sbatch: error: invalid partition specified: gpu2\nsbatch: error: Batch job submission failed: "
                    "Invalid partition name specified", SlurmOptions(partition="gpu2"))
    assert line == ("--launcher slurm: sbatch refused the jobs: invalid partition specified: gpu2 "
                    "(--slurm-partition gpu2)")


def test_workers_die_with_a_grid_process_killed_by_sigkill(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    data = write_sentiment(tmp_path)
    out = tmp_path / "grid"
    long = [item for item in TINY if not item.startswith(("train.max_steps=", "train.eval_every="))]
    long += ["train.max_steps=1000000", "train.eval_every=20"]
    parent = subprocess.Popen([sys.executable, "-m", "maskattn.cli", "grid", "run", "--out", str(out), "--data",
                               str(data), *[a for i in long for a in ("--set", i)], "--threads", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record = out / "run" / "worker.json"
    deadline = time.monotonic() + 300
    while not (record.exists() and (out / "run" / "last.safetensors").exists()) and time.monotonic() < deadline:
        assert parent.poll() is None, "the grid process ended early"
        time.sleep(0.2)
    worker = json.loads(record.read_text())["pid"]
    parent.send_signal(signal.SIGKILL)
    parent.wait()

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
        except (OSError, IndexError):
            return False
    deadline = time.monotonic() + 60
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the worker went on training after its grid process was killed")
    assert json.loads(record.read_text())["outcome"] == "interrupted"  # stopped as by Ctrl-C: checkpoints kept
    assert run_cli("status", out).output.splitlines()[0] == "run: stopped: continues from its last.safetensors"
