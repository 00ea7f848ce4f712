"""k-fold cross-validation as one job (``cross_validate`` / ``maskattn train --all-folds``): one run per fold,
mean ± std over folds, finished folds kept and interrupted folds resumed exactly, clear errors."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml
from typer.testing import CliRunner

from _train_helpers import sentiment_lines, tiny_config
from maskattn.cli import app
from maskattn.train import Trainer, cross_validate, load_checkpoint

FOLDS = 3


def cv_config(tmp_path, out="cv"):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "all.tsv").write_text("\n".join(sentiment_lines(60, 0)) + "\n")
    return tiny_config(data, tmp_path / out, data={"train": "all.tsv", "test": None, "cv_folds": FOLDS})


def accuracies(result):
    return [(f["fold"], f["best_dev"], f["best_step"], f["test"]["accuracy"]) for f in result["folds"]]


def test_every_fold_is_trained_and_averaged(tmp_path):
    result = cross_validate(cv_config(tmp_path))
    values = [f["test"]["accuracy"] for f in result["folds"]]
    assert [f["fold"] for f in result["folds"]] == [0, 1, 2] and result["completed"] == FOLDS
    assert result["mean"] == pytest.approx(statistics.mean(values))
    assert result["std"] == pytest.approx(statistics.stdev(values))
    assert json.loads((tmp_path / "cv" / "cv.json").read_text()) == json.loads(json.dumps(result))
    for fold in range(FOLDS):
        assert load_checkpoint(tmp_path / "cv" / f"fold{fold}" / "best.safetensors").config["data"]["fold"] == fold


def test_an_interrupted_job_continues_where_it_stopped(tmp_path, monkeypatch):
    reference = cross_validate(cv_config(tmp_path, "reference"))
    real_step, calls = Trainer.train_step, {"n": 0}

    def killed_in_fold_1(self, batch):  # fold 0 takes 12 steps; stop at the 7th step of fold 1
        calls["n"] += 1
        if calls["n"] == 12 + 7:
            raise KeyboardInterrupt
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", killed_in_fold_1)
    with pytest.raises(KeyboardInterrupt):
        cross_validate(cv_config(tmp_path))
    out = tmp_path / "cv"
    assert (out / "fold0" / "summary.json").exists() and (out / "fold1" / "last.safetensors").exists()
    assert not (out / "fold1" / "summary.json").exists()
    fold0_best = (out / "fold0" / "best.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(Trainer, "train_step", real_step)
    calls["n"] = 0
    result = cross_validate(cv_config(tmp_path))
    assert (out / "fold0" / "best.safetensors").stat().st_mtime_ns == fold0_best  # not trained again
    assert accuracies(result) == accuracies(reference)  # fold 1 resumed exactly, fold 2 trained as before


def test_a_folder_of_another_configuration_is_not_reused(tmp_path):
    cross_validate(cv_config(tmp_path))
    again = cv_config(tmp_path)
    again.train.progress = True  # display settings may change
    assert cross_validate(again)["completed"] == FOLDS
    other = cv_config(tmp_path)
    other.optim.lr = 0.5
    with pytest.raises(ValueError, match=r"fold0 holds a run of another configuration \(differs in optim.lr\)"):
        cross_validate(other)


def test_damaged_files_of_an_earlier_job_are_messages_naming_them(tmp_path):
    """A fold's summary.json or config.yaml edited by hand: one error naming the file, not a traceback."""
    cross_validate(cv_config(tmp_path))
    summary = tmp_path / "cv" / "fold1" / "summary.json"
    summary.write_text('{"test": [1]}')
    with pytest.raises(ValueError, match=rf"{summary} is not a finished fold's summary .*delete it to train that fold"):
        cross_validate(cv_config(tmp_path))
    summary.unlink()
    config = tmp_path / "cv" / "fold1" / "config.yaml"
    config.write_text("model: [unclosed\n")
    with pytest.raises(ValueError, match=rf"{config}:2: not valid YAML"):
        cross_validate(cv_config(tmp_path))


def test_errors_name_the_setting(tmp_path):
    cfg = cv_config(tmp_path)
    cfg.data.cv_folds = 0
    with pytest.raises(ValueError, match="cross-validation needs data.cv_folds >= 2.*got data.cv_folds=0"):
        cross_validate(cfg)
    runner = CliRunner()
    result = runner.invoke(app, ["train", "--all-folds", "--resume", str(tmp_path / "last.safetensors")])
    assert result.exit_code == 2 and "--all-folds continues an interrupted cross-validation" in result.output


def test_cli_all_folds(tmp_path):
    cfg = cv_config(tmp_path)
    config = tmp_path / "cv.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--all-folds", "--no-progress",
                                      "--out", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "cli" / "cv.json").read_text())
    assert written["completed"] == FOLDS and f"fold {FOLDS} of {FOLDS}" in result.output
    assert json.loads(result.output[result.output.index('{\n  "folds"'):]) == written
