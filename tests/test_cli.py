"""The command line end to end on tiny files: train (config + overrides, resume), eval, predict, list,
the embedded default job, and error messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import yaml
from typer.testing import CliRunner

import maskattn.inference
import maskattn.train.api
from _train_helpers import tiny_config, write_sentiment
from maskattn.cli import app
from maskattn.train import Trainer, load_checkpoint, read_metrics, run_default_job

runner = CliRunner()


def summary_of(output: str) -> dict:
    return json.loads(output[output.index("{"):])


def test_train_eval_predict_resume(tmp_path):
    data = write_sentiment(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(data, tmp_path / "ignored").to_dict()))
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "--config", str(config), "--out", str(out), "--max-steps", "30",
                                 "--set", "train.eval_every=10", "--no-progress"])
    assert result.exit_code == 0, result.output
    summary = summary_of(result.output)
    assert summary["steps"] == 30 and summary["out_dir"] == str(out)
    assert load_checkpoint(out / "best.safetensors").config["train"]["max_steps"] == 30

    result = runner.invoke(app, ["eval", "--checkpoint", str(out / "best.safetensors"), "--data",
                                 str(data / "test.tsv")])
    assert result.exit_code == 0, result.output
    assert summary_of(result.output)["accuracy"] == summary["test"]["accuracy"]

    result = runner.invoke(app, ["predict", "-k", str(out / "best.safetensors"), "the film was good",
                                 "the plot was bad"])
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["pos", "neg"]

    result = runner.invoke(app, ["train", "--resume", str(out / "last.safetensors"), "--max-steps", "40",
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    assert summary_of(result.output)["steps"] == 40
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["split"] == "dev"] == [10, 20, 30, 40]


def test_cli_errors_are_messages_not_tracebacks(tmp_path):
    result = runner.invoke(app, ["train", "--set", "optim.lrr=3"])
    assert result.exit_code == 2 and "unknown config key(s) optim.lrr" in result.output
    assert "valid keys of optim: name, lr" in result.output.replace("\n", " ")
    result = runner.invoke(app, ["train", "--preset", "trec"])
    assert result.exit_code == 2 and "data.dir is not set" in result.output
    result = runner.invoke(app, ["predict", "-k", str(tmp_path / "none.safetensors"), "hello"])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = runner.invoke(app, ["train", "--resume", str(tmp_path / "x.safetensors"), "--set", "model.d_model=8"])
    assert result.exit_code == 2 and f"{tmp_path / 'x.safetensors'} does not exist" in result.output


def one_line_error(result) -> str:
    """The message of a command that failed on a user mistake: exit code 2, one ``error:`` line, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    return result.output


@pytest.mark.parametrize("setting, message", [
    ("model.d_model=-16", "model.d_model must be an int >= 1, got -16"),
    ("optim.betas=[0.9]", "optim.betas must be a list of two values, each in [0, 1), got [0.9]"),
    ("train.eval_every=-1", "train.eval_every must be an int >= 0, got -1"),
    ("train.patience=-3", "train.patience must be an int >= 0, got -3"),
    ("model.max_len=0", "model.max_len must be an int >= 1, got 0"),
    ("optim.lr=.nan", "optim.lr must be a number >= 0, got nan"),
    ("train.device=gpu", "train.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("data.dev_fraction=1", "data.dev_fraction must be in (0, 1), got 1.0"),
    ("optim.betas=[0.9", "override 'optim.betas=[0.9': not valid YAML"),
    # recipes (issue 32 items 4 and 5): a YAML typo in an option, an option given twice, a depth no machine holds
    ('model.encoder=csan1d(window="5)', """option window="5: not valid YAML (found unexpected end of stream)"""),
    ("model.encoder=csan1d(window=5, window=7)", "option window is given twice (window=5, window=7)"),
    ("model.encoder=mtsa x 100000", "repeat count must be in [1, 1000] (a recipe holds at most 1000 layers)"),
    ("model.d_model=" + "9" * 5000, "a YAML value maskattn cannot read (Exceeds the limit (4300 digits)"),
    ("model.encoder=[5]", "model.encoder must be a layer recipe or baseline name (text), or a non-empty list"),
    ("data.source=hf", "data.source 'hf' needs data.hf_name"),  # was a TypeError from datasets
    ("train.metric=f1", "train.metric 'f1' is not computed for model.type 'sentence'; expected one of accuracy, loss"),
])
def test_bad_config_values_name_the_key_and_the_range(tmp_path, setting, message):
    data = write_sentiment(tmp_path)
    result = runner.invoke(app, ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--set", setting])
    assert message in one_line_error(result)
    assert not (tmp_path / "run").exists()  # nothing written, not even the folder



def test_patience_on_a_run_that_cannot_stop_early_is_one_line(tmp_path):
    """Issue 45: early stopping on a run whose only dev evaluation is its last step is refused, not ignored."""
    data = write_sentiment(tmp_path)
    result = runner.invoke(app, ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--max-steps", "20",
                                 "--set", "train.patience=2", "--set", "train.eval_every=100"])
    message = one_line_error(result)
    assert "train.patience=2 can never stop this run early" in message
    assert "evaluates every 100 steps and makes only 1 evaluation in its 20 steps" in message
    assert not (tmp_path / "run").exists()

# legal YAML of 400 bytes whose aliases expand to 9**9 values, in a key that takes any mapping
BILLION_LAUGHS = "data:\n  hf_data_files:\n" + "".join(
    f"    {chr(97 + i)}: &{chr(97 + i)} [{', '.join([f'*{chr(96 + i)}' if i else 'lol'] * 9)}]\n" for i in range(9))


@pytest.mark.parametrize("text, message", [
    (BILLION_LAUGHS, "YAML with more than 100000 values (counting every alias as what it expands to)"),
    ("model: " + "[" * 5000 + "]" * 5000 + "\n", "YAML nested too deeply to read"),
    ("model:\n  d_model: 16\n  encoder: [mtsa\n", "run.yaml:4: not valid YAML"),
    ("# " + "x" * (1 << 20) + "\n", "more than the 1048576 a run configuration may hold"),
])
def test_hostile_yaml_is_a_message_not_the_machines_memory(tmp_path, text, message):
    """Issue 32 item 5: legal YAML of a few hundred bytes that expands to 9**9 values, nesting deeper than the
    parser's recursion, a syntax error and a file far larger than any configuration: one line each, at once."""
    (tmp_path / "run.yaml").write_text(text)
    result = runner.invoke(app, ["train", "-c", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "run")])
    assert message in one_line_error(result)


def test_io_errors_name_the_path(tmp_path):
    data = write_sentiment(tmp_path)
    blocked = tmp_path / "file"
    blocked.write_text("a file, not a folder")
    result = runner.invoke(app, ["train", "--data", str(data), "--out", str(blocked / "run"), "--max-steps", "2"])
    assert f"{blocked / 'run'}: " in one_line_error(result)  # FileExistsError / NotADirectoryError, as path: reason


def test_internal_errors_are_tracebacks_not_messages(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(maskattn.inference, "predict", broken)
    result = runner.invoke(app, ["predict", "-k", str(tmp_path / "x.safetensors"), "hello"])
    assert result.exit_code == 1 and isinstance(result.exception, KeyError)

    def internal_value_error(*args, **kwargs):  # a ValueError that no check raised on purpose is a bug too
        raise ValueError("an internal inconsistency")

    monkeypatch.setattr(maskattn.inference, "predict", internal_value_error)
    result = runner.invoke(app, ["predict", "-k", str(tmp_path / "x.safetensors"), "hello"])
    assert result.exit_code == 1 and isinstance(result.exception, ValueError)

    def unreadable_device(*args, **kwargs):  # an OSError about no file of the user's
        raise OSError("device busy")

    monkeypatch.setattr(maskattn.inference, "predict", unreadable_device)
    result = runner.invoke(app, ["predict", "-k", str(tmp_path / "x.safetensors"), "hello"])
    assert result.exit_code == 1 and isinstance(result.exception, OSError)
    monkeypatch.setattr(maskattn.train.api, "train", lambda *a, **k: None + 1)  # a TypeError inside training
    result = runner.invoke(app, ["train", "--data", str(write_sentiment(tmp_path)), "--max-steps", "1"])
    assert result.exit_code == 1 and isinstance(result.exception, TypeError)


def test_an_internal_error_prints_its_traceback(tmp_path):
    code = ("import sys, maskattn.cli, maskattn.inference\n"
            "def broken(*a, **k): raise RuntimeError('internal bug')\n"
            "maskattn.inference.predict = broken\n"
            "sys.argv = ['maskattn', 'predict', '-k', 'x.safetensors', 'hello']\n"
            "maskattn.cli.app()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1 and "Traceback" in done.stderr and "RuntimeError: internal bug" in done.stderr


def test_predict_gives_one_output_line_per_input_line(tmp_path):
    data = write_sentiment(tmp_path)
    Trainer(tiny_config(data, tmp_path / "run", train={"max_steps": 30, "eval_every": 10})).fit()
    lines = tmp_path / "in.txt"
    lines.write_bytes(b"the film was good\n\nthe plot was bad\nvery\x0cgood\r\n")  # blank line 2, \f in line 4
    result = runner.invoke(app, ["predict", "-k", str(tmp_path / "run" / "best.safetensors"), "--input", str(lines)])
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\n") == ["pos", "", "neg", "pos", ""]  # 4 lines in, 4 out; blank in, blank out
    # standard input as translate reads it: "-", and any path that reads like a file (issue 32 item 8: /dev/stdin,
    # a pipe, was refused as "not a file")
    result = runner.invoke(app, ["predict", "-k", str(tmp_path / "run" / "best.safetensors"), "--input", "-"],
                           input=lines.read_bytes())
    assert result.exit_code == 0 and result.stdout.split("\n") == ["pos", "", "neg", "pos", ""], result.output
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(lines.read_bytes()))
    writer.start()
    result = runner.invoke(app, ["predict", "-k", str(tmp_path / "run" / "best.safetensors"), "--input", str(fifo)])
    writer.join()
    assert result.exit_code == 0 and result.stdout.split("\n") == ["pos", "", "neg", "pos", ""], result.output
    result = runner.invoke(app, ["predict", "-k", str(tmp_path / "run" / "best.safetensors"), "--input", str(tmp_path)])
    assert result.exit_code == 2 and f"data file {tmp_path} is a folder, not a file" in result.output


def test_classifier_inputs_longer_than_the_model_reads_are_truncated_with_a_warning(tmp_path):
    data = write_sentiment(tmp_path)  # sentences of 4 to 10 tokens
    cfg = tiny_config(data, tmp_path / "run", model={"positional": "sinusoidal", "max_len": 8},
                      train={"max_steps": 20, "eval_every": 10})
    summary = Trainer(cfg).fit()  # training cuts at the positional table's 8 rows too
    best = str(tmp_path / "run" / "best.safetensors")
    result = runner.invoke(app, ["eval", "-k", best, "--data", str(data / "test.tsv")])
    assert result.exit_code == 0, result.output  # was: the whole file refused (sequence length exceeds max_len)
    assert summary_of(result.stdout)["accuracy"] == summary["test"]["accuracy"]
    long_lines = [i + 1 for i, line in enumerate((data / "test.tsv").read_text().splitlines())
                  if len(line.split("\t")[1].split()) > 8]
    warning = " ".join(result.stderr.split())
    assert f"{len(long_lines)} input line(s) longer than the model's max_len were truncated to fit (the first 8 " \
           f"tokens): line(s) {', '.join(map(str, long_lines[:10]))}" in warning
    result = runner.invoke(app, ["predict", "-k", best, "good", "the film was very very good and the plot too"])
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 2
    assert "1 input line(s) longer than the model's max_len were truncated" in " ".join(result.stderr.split())
    assert "argument(s) 2" in result.stderr  # numbered by source (issue 23)


def test_list_shows_mechanisms_models_and_presets():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    for name in ("mtsa", "dman", "sentence", "pair", "tagger", "bilstm", "multi_cnn", "trec", "sst5", "snli"):
        assert name in result.output


def test_train_without_arguments_runs_the_default_job(tmp_path):
    result = runner.invoke(app, ["train", "--max-steps", "3", "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "order task" in result.output and "mtsa" in result.output and "mha" in result.output
    assert (tmp_path / "mtsa" / "best.safetensors").exists() and (tmp_path / "mha" / "best.safetensors").exists()


@pytest.mark.slow
def test_default_job_separates_mtsa_from_multihead_in_under_two_minutes(tmp_path):
    start = time.perf_counter()
    results = run_default_job(str(tmp_path), progress=False)
    assert time.perf_counter() - start < 120
    assert results["mtsa"]["test"]["accuracy"] > 0.9 and results["mha"]["test"]["accuracy"] < 0.65


@pytest.mark.parametrize("command", [["train"], ["eval"], ["predict"], ["translate"], ["bench"], ["list"], ["demo"],
                                     ["viz", "masks"], ["viz", "attention"], ["viz", "localness"]])
def test_help_shows_no_value_after_a_flag(command):
    """Issue 32 item 8: ``--help`` printed ``--overwrite <bool>``, and ``--overwrite true`` then failed."""
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0 and "<bool>" not in result.output, result.output
    flags = [line.split()[0] for line in result.output.splitlines() if line.strip().startswith("--")]
    assert "--help" in flags


def test_the_old_names_work_with_a_warning_until_0_3(tmp_path):
    """Issue 32 item 7: CHANGELOG promises the old spellings until 0.3; three of them were gone without a shim, and
    the config key ``model.preset`` warned in a way no command-line user could see (DeprecationWarning is hidden
    outside ``__main__``)."""
    import importlib
    import sys

    import maskattn.bench
    import maskattn.hf.mtsa
    import maskattn.sections
    from maskattn.errors import RenamedWarning

    with pytest.warns(RenamedWarning, match=r"maskattn.bench.PRESETS is now maskattn.bench.SUITES"):
        assert maskattn.bench.PRESETS is maskattn.bench.SUITES
    with pytest.warns(RenamedWarning, match=r"maskattn.hf.mtsa.HEAD_MASK_PRESETS is now HEAD_MASK_NAMES"):
        assert maskattn.hf.mtsa.HEAD_MASK_PRESETS == maskattn.hf.mtsa.HEAD_MASK_NAMES
    sys.modules.pop("maskattn.configuration", None)
    with pytest.warns(RenamedWarning, match=r"the module maskattn.configuration is now maskattn.sections"):
        old = importlib.import_module("maskattn.configuration")
    assert old.from_dict is maskattn.sections.from_dict and old.Rule is maskattn.sections.Rule
    result = runner.invoke(app, ["train", "--set", "model.type=seq2seq", "--set", "model.preset=transformer",
                                 "--set", "data.format=parallel"])
    lines = result.output.splitlines()
    assert lines[0] == ("warning: config key model.preset is now model.architecture; the old name will be removed "
                        "in 0.3") and lines[1].startswith("error: data.dir is not set")


def test_issue_42_small_refusals_are_messages(tmp_path, monkeypatch):
    """--config given a folder, a thread count far above the CPUs, `generate -i f -o f`: one line each."""
    assert "config file" in one_line_error(runner.invoke(app, ["train", "-c", str(tmp_path)])) and \
        "is a folder, not a file" in one_line_error(runner.invoke(app, ["train", "-c", str(tmp_path)]))
    data = write_sentiment(tmp_path)
    result = runner.invoke(app, ["train", "--data", str(data), "--out", str(tmp_path / "run"),
                                 "--set", "train.num_threads=100000"])
    assert "train.num_threads=100000 is more than the " in one_line_error(result)
    source = tmp_path / "src.txt"
    source.write_text("ein satz\n")
    result = runner.invoke(app, ["generate", "-k", str(tmp_path / "x.safetensors"), "-i", str(source), "-o",
                                 str(source)])
    assert f"--output {source} is the --input file" in one_line_error(result)
    assert source.read_text() == "ein satz\n"  # before: replaced by the outputs


def test_eval_prints_json_even_for_non_finite_metrics(tmp_path, monkeypatch):
    """A checkpoint with NaN weights gave `"loss": NaN` (not JSON) and no warning: null, and a warning naming it."""
    monkeypatch.setattr(maskattn.inference, "evaluate_file",
                        lambda *a, **k: {"loss": float("nan"), "accuracy": 0.5, "per_label": {"pos": float("inf")}})
    (tmp_path / "x.safetensors").write_bytes(b"")
    result = runner.invoke(app, ["eval", "-k", str(tmp_path / "x.safetensors"), "--data", str(tmp_path / "d.tsv")])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "loss is nan" in warnings[0] and "per_label.pos is inf" in warnings[1]
    body = result.output[result.output.index("{"):]
    assert json.loads(body) == {"loss": None, "accuracy": 0.5, "per_label": {"pos": None}}


def test_help_and_the_grid_table_start_without_torch():
    """`maskattn --help`, `maskattn train --help` and `maskattn grid table` of a committed grid import no torch
    (issue 42: start-up; ~2 s of CPU on these machines): the packages load their API on first use (maskattn/lazy.py)
    and the records are read without building configurations unless a cell's runs were recorded two ways."""
    import subprocess
    import sys
    from pathlib import Path

    grid = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "table5_vectors" / "trec"
    script = ("import sys\nfrom typer.testing import CliRunner\nfrom maskattn.cli import app\n"
              "for args in (['--help'], ['train', '--help'], ['grid', 'table', sys.argv[1]]):\n"
              "    result = CliRunner().invoke(app, args)\n"
              "    assert result.exit_code == 0, (args, result.output)\n"
              "    assert 'torch' not in sys.modules, args\n"
              "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script, str(grid)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
