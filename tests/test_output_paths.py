"""Issue 55 item 1: one rule for every command's output paths (:func:`maskattn.files.check_outputs`) — an output
never replaces what the command reads (its inputs, through links, and the files of the run it reads), an existing
output needs --overwrite, and an output that cannot be written is refused before any work."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

import maskattn.inference
from _files_helpers import read_only_folder
from _train_helpers import tiny_config, write_sentiment
from maskattn.cli import app
from maskattn.errors import ArgumentError
from maskattn.train import Trainer

runner = CliRunner()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny classifier's run folder (both checkpoints, its log, configuration and manifest) and its data."""
    root = tmp_path_factory.mktemp("outputs")
    data = write_sentiment(root)
    Trainer(tiny_config(data, root / "run", train={"max_steps": 4, "eval_every": 2})).fit()
    return data, root / "run"


def best(folder) -> str:
    return str(folder / "best.safetensors")


def contents(*folders) -> dict:
    """Every file under ``folders`` with its bytes: what must not change."""
    return {path: path.read_bytes() for folder in folders for path in sorted(folder.rglob("*")) if path.is_file()}


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    return result.output


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command gets as far as its work (scoring, decoding, drawing)."""
    def work(*args, **kwargs):
        raise AssertionError("the command did its work before refusing its output")

    for name in ("evaluate_file", "evaluate_translation", "load_translator"):
        monkeypatch.setattr(maskattn.inference, name, work)


@pytest.mark.parametrize("target", ["best.safetensors", "last.safetensors", "metrics.jsonl", "config.yaml",
                                    ".run-files.json", "test.tsv", "link", "hard link"])
def test_eval_predictions_never_replace_a_file_the_command_reads(run, tmp_path, no_work, target):
    """Before: `eval --predictions` over the checkpoint, the data or another file of the run replaced it with JSON
    lines (rc 0). Now refused — even with --overwrite — naming the option, the path and the input."""
    data, folder = run
    before = contents(folder, data)
    path = data / target if target == "test.tsv" else folder / target
    if target == "link":
        path = tmp_path / "predictions.jsonl"
        path.symlink_to(folder / "best.safetensors")
    elif target == "hard link":
        path = tmp_path / "predictions.jsonl"
        os.link(data / "test.tsv", path)
    for overwrite in ([], ["--overwrite"]):
        result = runner.invoke(app, ["eval", "-k", best(folder), "--data", str(data / "test.tsv"),
                                     "--predictions", str(path), *overwrite])
        message = one_line_error(result)
        assert f"--predictions {path} is " in message and "which this command reads" in message
    assert contents(folder, data) == before


def test_seq2seq_outputs_never_replace_the_sources_references_or_checkpoint(run, tmp_path, no_work):
    data, folder = run
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("ein satz\n")
    ref.write_text("a sentence\n")
    before = contents(folder, tmp_path)
    for target, what in ((src, "the --src file"), (ref, "the --ref file")):
        result = runner.invoke(app, ["eval", "-k", best(folder), "--src", str(src), "--ref", str(ref),
                                     "--predictions", str(target), "--overwrite"])
        assert f"is {what} ({target})" in one_line_error(result)
    for target, what in ((folder / "best.safetensors", "the --checkpoint file"),
                         (folder / "last.safetensors", f"a file of the run in {folder}"), (src, "the --input file")):
        result = runner.invoke(app, ["generate", "-k", best(folder), "-i", str(src),
                                     "-o", str(target), "--overwrite"])
        assert f"--output {target} is {what}" in one_line_error(result)
    assert contents(folder, tmp_path) == before


def test_viz_outputs_are_checked_by_the_same_rule(run, tmp_path):
    data, folder = run
    before = contents(folder, data)
    result = runner.invoke(app, ["viz", "localness", "-k", best(folder), "--data", str(data / "test.tsv"),
                                 "--csv", str(data / "test.tsv")])
    assert "--csv" in one_line_error(result) and "is the --data file" in result.output
    table = tmp_path / "table"
    result = runner.invoke(app, ["viz", "localness", "-k", best(folder), "--data", str(data / "test.tsv"),
                                 "--csv", str(table), "--json", str(table)])
    assert f"--csv and --json name the same file ({table})" in one_line_error(result)
    assert contents(folder, data) == before
    image = tmp_path / "masks.png"
    image.write_bytes(b"mine")
    result = runner.invoke(app, ["viz", "masks", "-n", "4", "--no-terminal", "-o", str(image)])
    assert f"--out {image} exists; pass --overwrite to replace it" in one_line_error(result)
    assert image.read_bytes() == b"mine"
    result = runner.invoke(app, ["viz", "masks", "-n", "4", "--no-terminal", "-o", str(image), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = runner.invoke(app, ["viz", "attention", "good", "-k", best(folder), "-o",
                                 str(tmp_path / "a.jpg")])
    assert "--out" in one_line_error(result) and "must end in one of .png" in result.output


def test_an_existing_output_needs_overwrite(run, tmp_path):
    data, folder = run
    kept = tmp_path / "kept.jsonl"
    kept.write_text("my notes\n")
    result = runner.invoke(app, ["eval", "-k", best(folder), "--data", str(data / "test.tsv"),
                                 "--predictions", str(kept)])
    assert f"--predictions {kept} exists; pass --overwrite to replace it, or give another file" in \
        one_line_error(result)
    assert kept.read_text() == "my notes\n"
    result = runner.invoke(app, ["eval", "-k", best(folder), "--data", str(data / "test.tsv"),
                                 "--predictions", str(kept), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert len([json.loads(line) for line in kept.read_text().splitlines()]) == 32  # the test file's items
    fresh = tmp_path / "new" / "folders" / "p.jsonl"  # missing folders on the way are created
    result = runner.invoke(app, ["eval", "-k", best(folder), "--data", str(data / "test.tsv"),
                                 "--predictions", str(fresh)])
    assert result.exit_code == 0 and fresh.read_text() == kept.read_text()


def test_an_output_that_cannot_be_written_is_refused_before_the_work(run, tmp_path, no_work):
    """Before: a folder, a path below a file or a read-only folder failed after the scoring or decoding."""
    data, folder = run
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    src = tmp_path / "src.txt"
    src.write_text("ein satz\n")
    with read_only_folder(tmp_path / "read-only") as read_only:
        cases = [(tmp_path, f"--predictions {tmp_path} is a folder; give a file name"),
                 (blocker / "p.jsonl", f"--predictions {blocker / 'p.jsonl'}: {blocker} is a file, not a folder"),
                 (read_only / "p.jsonl", f"--predictions {read_only / 'p.jsonl'}: folder {read_only} is not "
                                         "writable (read-only, or no permission)")]
        for path, message in cases:
            result = runner.invoke(app, ["eval", "-k", best(folder), "--data", str(data / "test.tsv"),
                                         "--predictions", str(path)])
            assert message in one_line_error(result)
        result = runner.invoke(app, ["generate", "-k", best(folder), "-i", str(src), "-o",
                                     str(read_only / "h.txt")])
        assert "is not writable" in one_line_error(result)
        result = runner.invoke(app, ["bench", "--out", str(read_only / "bench"), "--lengths", "8"])
        assert f"--out {read_only / 'bench'}: folder {read_only} is not writable" in one_line_error(result)
    result = runner.invoke(app, ["bench", "--out", str(blocker), "--lengths", "8"])
    assert f"--out {blocker} is a file, not a folder" in one_line_error(result)


def test_bench_refuses_to_replace_an_earlier_run_without_overwrite(tmp_path, monkeypatch):
    import maskattn.bench

    (tmp_path / "bench.json").write_text("{}")

    def work(*args, **kwargs):
        raise AssertionError("the benchmark ran before its outputs were checked")

    monkeypatch.setattr(maskattn.bench, "run_benchmark", work)
    result = runner.invoke(app, ["bench", "--out", str(tmp_path), "--lengths", "8"])
    assert f"--out's bench.json {tmp_path / 'bench.json'} exists; pass --overwrite" in one_line_error(result)
    assert (tmp_path / "bench.json").read_text() == "{}"


def test_the_rule_itself(tmp_path):
    from maskattn.files import check_output_folder, check_outputs

    source = tmp_path / "in.txt"
    source.write_text("x")
    check_outputs({"--out": tmp_path / "out.txt", "--log": None}, inputs=[("the --in file", source)])
    with pytest.raises(ArgumentError, match="would replace it"):
        check_outputs({"--out": tmp_path / "sub" / ".." / "in.txt"}, inputs=[("the --in file", source)])
    with pytest.raises(ArgumentError, match=r"--out .* exists; pass --overwrite"):
        check_outputs({"--out": source})
    check_outputs({"--out": source}, overwrite=True)
    assert check_output_folder("--dir", tmp_path / "new") == tmp_path / "new"
    with pytest.raises(ArgumentError, match="is a file, not a folder"):
        check_output_folder("--dir", source)
