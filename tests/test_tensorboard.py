"""``train.tensorboard`` / ``maskattn train --tensorboard``: the run's loss, learning rate, gradient norm, throughput,
dev and test metrics as TensorBoard scalars, read back with tensorboard's own event reader; a grid gives each run
``<DIR>/<cell>/<seed>``; the setting does not change what the run is."""

from __future__ import annotations

import json

import pytest

from maskattn.train import Trainer

from _train_helpers import tiny_config, write_sentiment

pytest.importorskip("tensorboard")


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_run_writes_its_curves_as_tensorboard_scalars(tmp_path):
    data = write_sentiment(tmp_path)
    summary = Trainer(tiny_config(data, tmp_path / "run", train={"tensorboard": str(tmp_path / "tb")})).fit()
    tags = scalars(tmp_path / "tb")
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/examples_per_s", "dev/accuracy", "dev/loss",
                "test/accuracy", "test/loss"):
        assert tag in tags, sorted(tags)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["loss"]) for r in rows if r["split"] == "train"]
    assert [s for s, _ in tags["train/loss"]] == [s for s, _ in train]
    assert [v for _, v in tags["train/loss"]] == pytest.approx([v for _, v in train], rel=1e-6)
    assert [s for s, _ in tags["dev/accuracy"]] == [r["step"] for r in rows if r["split"] == "dev"]
    assert tags["test/accuracy"] == [(summary["best_step"], pytest.approx(summary["test"]["accuracy"]))]
    assert all(value > 0 for _, value in tags["train/grad_norm"])
    # the setting is how the run was run, not what it computed: the folder continues without it
    from maskattn.train.resumable import check_same_run

    check_same_run(tiny_config(data, tmp_path / "run"), tmp_path / "run")


def test_the_command_line_option_and_a_grid_give_each_run_its_folder(tmp_path):
    from typer.testing import CliRunner

    from maskattn.cli import app
    from maskattn.grid.spec import Grid, GridRun

    data = write_sentiment(tmp_path)
    result = CliRunner().invoke(app, ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--no-progress",
                                      "--tensorboard", str(tmp_path / "tb"), "--set", "data.format=tsv", "--set",
                                      "data.train=train.tsv", "--set", "data.test=test.tsv", "--set",
                                      "model.d_model=16", "--set", "model.num_heads=2", "--set", "train.max_steps=4",
                                      "--set", "train.eval_every=2", "--set", "train.batch_size=8"])
    assert result.exit_code == 0, result.output
    assert "test/accuracy" in scalars(tmp_path / "tb")
    grid = Grid(tmp_path / "grid", {}, [], str(tmp_path), [GridRun("mtsa/seed1", "mtsa", {}, {}, ["train.seed=1"])],
                tensorboard="boards")
    assert grid.config(grid.runs[0]).train.tensorboard == "boards/mtsa/seed1"
    grid = Grid(tmp_path / "grid", {}, ["train.tensorboard=tb"], str(tmp_path), grid.runs)
    assert grid.config(grid.runs[0]).train.tensorboard == "tb/mtsa/seed1"


def test_without_the_package_the_setting_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    import sys

    from maskattn.errors import ConfigError

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    data = write_sentiment(tmp_path)
    with pytest.raises(ConfigError, match=r"files need the tensorboard package \(pip install 'maskattn\[tensorboard\]'\)"):
        Trainer(tiny_config(data, tmp_path / "run", train={"tensorboard": str(tmp_path / "tb")}))


def test_grid_run_tensorboard_gives_every_run_its_folder_and_keeps_it_for_the_grid(tmp_path):
    """``maskattn grid run --tensorboard DIR``: each run's events in DIR/<cell>/<seed>, and the folder recorded in
    grid.json, so ``grid run --out`` alone goes on writing there."""
    from typer.testing import CliRunner

    from maskattn.cli import app
    from maskattn.grid.spec import load_grid

    data = write_sentiment(tmp_path)
    tiny = ["model.d_model=16", "model.num_heads=2", "model.ffn=false", "train.batch_size=16", "train.max_steps=4",
            "train.eval_every=2", "data.dev_fraction=0.25", "train.num_threads=1"]
    sets = [a for item in tiny for a in ("--set", item)]
    out, board = tmp_path / "grid", tmp_path / "tb"
    result = CliRunner().invoke(app, ["grid", "run", "--out", str(out), "--data", str(data), *sets, "--set",
                                      "model.encoder=mtsa,mha", "--seeds", "0", "--tensorboard", str(board)])
    assert result.exit_code == 0, result.output
    for cell in ("encoder=mtsa", "encoder=mha"):
        assert "test/accuracy" in scalars(board / cell / "seed0"), cell
    assert load_grid(out).tensorboard == str(board)


# --- issue 55 item 7: an optional sink never kills a run ------------------------------------------------------

def _full_disk(*args, **kwargs):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device", "events.out.tfevents")


def test_a_full_disk_under_tensorboard_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, capfd):
    """TensorBoard on a full disk ended the training run (OSError in the writer's thread, then a traceback, exit
    1, no test result). Now: one warning, the run trains to its end and tests, the metrics files keep every row.
    The failure comes from tensorboard's writer thread, as on a real full disk: the thread's traceback is not
    printed either."""
    from rich.console import Console
    from tensorboard.summary.writer.record_writer import RecordWriter

    data = write_sentiment(tmp_path)
    written = {"records": 0}
    real_write = RecordWriter.write

    def write(self, record):  # the file version and the first rows fit, then the disk is full
        written["records"] += 1
        if written["records"] > 5:
            _full_disk()
        real_write(self, record)

    monkeypatch.setattr(RecordWriter, "write", write)
    import io

    output = io.StringIO()
    summary = Trainer(tiny_config(data, tmp_path / "run", train={"tensorboard": str(tmp_path / "tb")}),
                      console=Console(file=output)).fit()
    assert summary["steps"] == 12 and "accuracy" in summary["test"]
    warnings = [line for line in output.getvalue().splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, output.getvalue()
    assert f"TensorBoard stopped writing to {tmp_path / 'tb'} (events.out.tfevents: No space left on device); the " \
           "run goes on without it" in warnings[0]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, 13))
    assert "Exception in thread" not in capfd.readouterr().err


@pytest.mark.parametrize("call", ["add_scalar", "flush", "close"])
def test_a_failing_tensorboard_call_is_one_warning(tmp_path, monkeypatch, call):
    from rich.console import Console
    from torch.utils.tensorboard import SummaryWriter

    monkeypatch.setattr(SummaryWriter, call, _full_disk)
    data = write_sentiment(tmp_path)
    console = Console(record=True, width=400)
    summary = Trainer(tiny_config(data, tmp_path / "run", train={"tensorboard": str(tmp_path / "tb")}),
                      console=console).fit()
    assert "accuracy" in summary["test"]
    assert console.export_text().count("warning: TensorBoard stopped writing") == 1


def test_a_tensorboard_folder_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    """A read-only TensorBoard folder left a run folder holding only .run-files.json; `--tensorboard <a file>` said
    only "File exists". Both are refused before the run folder is taken, naming the setting."""
    from typer.testing import CliRunner

    from _files_helpers import read_only_folder
    from maskattn.cli import app
    from maskattn.errors import ArgumentError

    data = write_sentiment(tmp_path)
    with read_only_folder(tmp_path / "boards") as boards:
        with pytest.raises(ArgumentError, match=rf"^train\.tensorboard {boards / 'tb'}: folder {boards} is not "
                                                r"writable \(read-only, or no permission\)"):
            Trainer(tiny_config(data, tmp_path / "run", train={"tensorboard": str(boards / "tb")}))
    assert not (tmp_path / "run").exists()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    result = CliRunner().invoke(app, ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--tensorboard",
                                      str(a_file), "--set", "data.format=tsv", "--set", "data.train=train.tsv"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output == f"error: train.tensorboard {a_file} is a file, not a folder; give a folder (it is " \
                            "created if missing)\n"
    assert not (tmp_path / "run").exists() and a_file.read_text() == "mine"


def test_a_resumed_run_keeps_one_test_point_as_its_log_does(tmp_path):
    """After a resume, TensorBoard kept the first run segment's test point (its log drops it): the events of the
    first segment's test and of the steps after the checkpoint are dropped, as from metrics.jsonl."""
    from maskattn.train import resume

    data = write_sentiment(tmp_path)
    board = tmp_path / "tb"
    Trainer(tiny_config(data, tmp_path / "run", train={"tensorboard": str(board), "max_steps": 8})).fit()
    summary = resume(tmp_path / "run" / "last.safetensors", train_overrides={"max_steps": 12})
    tags = scalars(board)
    assert tags["test/accuracy"] == [(summary["best_step"], pytest.approx(summary["test"]["accuracy"]))]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s for s, _ in tags["train/loss"]] == [r["step"] for r in rows if r["split"] == "train"] == \
        list(range(1, 13))
    assert [s for s, _ in tags["dev/accuracy"]] == [4, 8, 12]
