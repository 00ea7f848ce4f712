"""The command line end to end on tiny files: train (config + overrides, resume), eval, predict, list,
the embedded default job, and error messages."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from typer.testing import CliRunner

from _train_helpers import tiny_config, write_sentiment
from maskattn.cli import app
from maskattn.train import load_checkpoint, read_metrics, run_default_job

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
    assert result.exit_code == 2 and "only train.* settings may change" in result.output


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
