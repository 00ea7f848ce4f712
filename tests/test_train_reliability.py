"""What a run folder guarantees (docs/reliability.md): one process per folder, no finished run silently replaced,
a metrics log that agrees with the checkpoints after any kill, checksummed checkpoints, stale temporary files
removed, a full disk that keeps the previous checkpoint. The tests with real processes (``maskattn train``
killed with SIGKILL, two runs started into one folder) are marked slow; each has a fast in-process variant here."""

from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch
import yaml
from rich.console import Console
from safetensors.torch import save_file
from typer.testing import CliRunner

import maskattn.files
import maskattn.train.run_folder
from _train_helpers import (assert_same_last_weights, fit_killed_before_step, sentiment_lines, tiny_config,
                            write_sentiment)
from maskattn.checkpoint import FORMAT, load_checkpoint
from maskattn.cli import app
from maskattn.errors import (CheckpointError, ConfigError, DataError, DivergenceError, RunFolderError,
                             UnverifiedCheckpointWarning)
from maskattn.train import RunFolder, Trainer, cross_validate, read_metrics, resume

runner = CliRunner()


def flat(text: str) -> str:
    return " ".join(text.split())


def dev_steps(run) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "dev"]


def curve(run) -> list[tuple]:
    """The rows of a run's log without their timings."""
    return [(r["step"], r["split"], r.get("loss"), r.get("accuracy")) for r in read_metrics(run / "metrics.jsonl")]


def dead_pid() -> int:
    """The pid of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- one process per run folder -----------------------------------------------------------------------

def test_a_held_run_folder_stops_a_second_trainer_naming_the_holder(tmp_path):
    data = write_sentiment(tmp_path)
    with RunFolder(tmp_path / "run"):  # another owner (flock: per open file, so it also works in one process)
        with pytest.raises(RunFolderError, match=rf"run folder .*run is in use by another run \(pid {os.getpid()} on "):
            Trainer(tiny_config(data, tmp_path / "run"))
        assert not (tmp_path / "run" / "config.yaml").exists()  # the second trainer wrote nothing
    summary = Trainer(tiny_config(data, tmp_path / "run", train={"max_steps": 4})).fit()  # free again
    assert summary["steps"] == 4 and not (tmp_path / "run" / ".lock").exists()  # released: the file is gone
    Trainer(tiny_config(data, tmp_path / "other", train={"max_steps": 2})).fit()
    with RunFolder(tmp_path / "other"):  # the trainers released their folders when fit() returned
        pass


def test_a_lock_file_deleted_by_its_last_holder_is_not_trusted(tmp_path, monkeypatch):
    first = RunFolder(tmp_path / "run").lock()
    real_flock, released = fcntl.flock, []

    def holder_releases_first(handle, operation):  # the holder lets go between our open() and our flock()
        if operation & fcntl.LOCK_EX and not released:
            released.append(True)
            first.unlock()  # deletes the .lock file we have just opened (and the empty folder)
        return real_flock(handle, operation)

    monkeypatch.setattr(maskattn.train.run_folder.fcntl, "flock", holder_releases_first)
    second = RunFolder(tmp_path / "run").lock()  # locked the deleted file, noticed, took the new one
    monkeypatch.undo()
    assert released and json.loads((tmp_path / "run" / ".lock").read_text())["pid"] == os.getpid()
    with pytest.raises(RunFolderError, match="in use by another run"):
        RunFolder(tmp_path / "run").lock()  # the file at the path is the one second holds
    second.unlock()


def test_a_failed_run_releases_its_folder(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    with pytest.raises(ConfigError):
        Trainer(tiny_config(data, tmp_path / "run", train={"metric": "bleu"}))  # fails while it is built
    assert not (tmp_path / "run").exists()  # the folder it created is removed again, lock file and all
    monkeypatch.setattr(Trainer, "train_step", lambda self, indices: (float("nan"), len(indices)))
    with pytest.raises(DivergenceError, match="training loss is nan at step 1"):
        Trainer(tiny_config(data, tmp_path / "diverged")).fit()  # fails while it trains
    with RunFolder(tmp_path / "diverged"):
        pass


def test_cross_validation_holds_its_folder(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "all.tsv").write_text("\n".join(sentiment_lines(60, 0)) + "\n")
    cfg = tiny_config(data, tmp_path / "cv", data={"train": "all.tsv", "test": None, "cv_folds": 3},
                      train={"max_steps": 2})
    with RunFolder(tmp_path / "cv"), pytest.raises(RunFolderError, match="is in use by another run"):
        cross_validate(cfg)
    Trainer(tiny_config(data, tmp_path / "plain", data={"train": "all.tsv", "test": None},
                        train={"max_steps": 2})).fit()
    cfg.train.out_dir = str(tmp_path / "plain")
    with pytest.raises(RunFolderError, match="already holds a run"):
        cross_validate(cfg)  # a plain run is not a cross-validation to continue
    assert cross_validate(cfg, overwrite=True)["completed"] == 3
    assert not (tmp_path / "plain" / "best.safetensors").exists()


# --- a finished run is never replaced silently ---------------------------------------------------------

def test_a_new_run_refuses_a_folder_holding_a_run(tmp_path):
    data = write_sentiment(tmp_path)
    out = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(data, out, train={"max_steps": 4}).to_dict()))
    assert runner.invoke(app, ["train", "--config", str(config), "--no-progress"]).exit_code == 0
    best = (out / "best.safetensors").read_bytes()
    result = runner.invoke(app, ["train", "--config", str(config), "--seed", "3", "--no-progress"])
    message = flat(result.output)
    assert result.exit_code == 2 and f"run folder {out} already holds a run" in message
    assert f"--resume {out / 'last.safetensors'}" in message and "--overwrite" in message
    assert (out / "best.safetensors").read_bytes() == best  # untouched
    result = runner.invoke(app, ["train", "--config", str(config), "--seed", "3", "--overwrite", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert load_checkpoint(out / "last.safetensors").config["train"]["seed"] == 3
    assert dev_steps(out) == [4]  # the old run's rows are gone, not mixed in


def test_overwrite_waits_for_the_folder(tmp_path):
    data = write_sentiment(tmp_path)
    Trainer(tiny_config(data, tmp_path / "run", train={"max_steps": 2})).fit()
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    with RunFolder(tmp_path / "run"), pytest.raises(RunFolderError, match="in use by another run"):
        Trainer(tiny_config(data, tmp_path / "run"), overwrite=True)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before  # nothing deleted


def test_a_preset_default_folder_is_not_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "trec").mkdir(parents=True)
    (tmp_path / "runs" / "trec" / "metrics.jsonl").write_text('{"step": 1}\n')
    data = tmp_path / "trec"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.tsv").write_text("".join(f"{'NUM' if i % 2 else 'HUM'}\tx\tWho is {i} ?\n" for i in range(20)))
    result = runner.invoke(app, ["train", "--preset", "trec", "--data", str(data), "--max-steps", "1"])
    assert result.exit_code == 2 and "runs/trec already holds a run" in flat(result.output)
    assert "another folder (--out)" in flat(result.output)


def test_resume_continues_in_the_checkpoints_folder(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "run", train={"eval_every": 4}), 6)
    with pytest.raises(ConfigError, match="continues in the folder of its checkpoint"):
        resume(tmp_path / "run" / "last.safetensors", train_overrides={"out_dir": str(tmp_path / "elsewhere")})
    (tmp_path / "run").rename(tmp_path / "moved")
    assert resume(tmp_path / "moved" / "last.safetensors")["out_dir"] == str(tmp_path / "moved")
    assert dev_steps(tmp_path / "moved") == [4, 8, 12]


# --- the log and the checkpoints agree after any kill -------------------------------------------------

def test_a_kill_right_after_the_checkpoint_write_keeps_the_dev_row(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    original = Trainer.save

    def killed_after_last(self, name, *, resumable):
        path = original(self, name, resumable=resumable)
        if name == "last" and self.step == 8:
            raise KeyboardInterrupt  # SIGKILL between the checkpoint write and whatever followed it
        return path

    monkeypatch.setattr(Trainer, "save", killed_after_last)
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny_config(data, tmp_path / "run", train={"eval_every": 4})).fit()
    monkeypatch.setattr(Trainer, "save", original)
    assert load_checkpoint(tmp_path / "run" / "last.safetensors").step == 8
    assert dev_steps(tmp_path / "run") == [4, 8]  # the row of the checkpoint's step is in the log
    resume(tmp_path / "run" / "last.safetensors")
    assert dev_steps(tmp_path / "run") == [4, 8, 12]


def test_a_torn_last_line_is_dropped_with_a_warning_on_resume(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    sections = {"train": {"eval_every": 4}}
    Trainer(tiny_config(data, tmp_path / "full", **sections)).fit()
    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "cut", **sections), 7)
    log = tmp_path / "cut" / "metrics.jsonl"
    with log.open("a") as f:
        f.write('{"step": 7, "epoch": 0, "split": "tr')  # a kill in the middle of an append
    assert [r["step"] for r in read_metrics(log)][-1] == 6  # readers leave the cut line out
    output = io.StringIO()
    resume(tmp_path / "cut" / "last.safetensors", console=Console(file=output, width=300))
    assert f"{log}: dropped its last line, cut short" in flat(output.getvalue())
    assert curve(tmp_path / "cut") == curve(tmp_path / "full")  # nothing lost, nothing doubled


def test_a_damaged_middle_line_is_an_error_naming_file_and_line(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "split": "train"}\n{"step": 2, "spl\n{"step": 3, "split": "train"}\n')
    with pytest.raises(DataError, match=r"metrics\.jsonl:2: not a JSON row"):
        read_metrics(log)


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "run", train={"eval_every": 4}), 6)
    stale = tmp_path / "run" / f".last.safetensors.tmp-{dead_pid()}"
    live = tmp_path / "run" / f".best.safetensors.tmp-{os.getppid()}"  # a live process: it may still be writing
    stale.write_bytes(b"half a checkpoint")
    live.write_bytes(b"being written")
    resume(tmp_path / "run" / "last.safetensors")
    assert not stale.exists() and live.exists()


# --- checksums ----------------------------------------------------------------------------------------

def test_a_flipped_byte_in_the_tensor_data_is_detected(tmp_path):
    data = write_sentiment(tmp_path)
    Trainer(tiny_config(data, tmp_path / "run", train={"max_steps": 4})).fit()
    best = tmp_path / "run" / "best.safetensors"
    load_checkpoint(best)  # intact: loads
    raw = bytearray(best.read_bytes())
    raw[-100] ^= 0x01  # one bit of one weight
    best.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=rf"checkpoint {best} is damaged: its content does not match"):
        load_checkpoint(best)
    result = runner.invoke(app, ["eval", "-k", str(best), "--data", str(data / "test.tsv")])
    assert result.exit_code == 2 and "is damaged" in flat(result.output)


def test_checkpoints_without_a_checksum_load_with_one_warning(tmp_path):
    old = tmp_path / "old.safetensors"
    save_file({"model.w": torch.ones(2)}, str(old), metadata={
        "format": FORMAT, "config": "{}", "vocab": "[]", "labels": "[]", "model_type": "sentence", "step": "3"})
    with pytest.warns(UnverifiedCheckpointWarning, match="has no checksum"):
        assert load_checkpoint(old).step == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checkpoint(old)  # once per file


# --- a full disk ---------------------------------------------------------------------------------------

def test_a_full_disk_while_saving_is_a_message_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "run", train={"eval_every": 4}), 6)
    last = tmp_path / "run" / "last.safetensors"
    before = last.read_bytes()

    class FullDisk(io.FileIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(maskattn.files, "open", lambda path, mode: FullDisk(path, "wb"), raising=False)
    result = runner.invoke(app, ["train", "--resume", str(last), "--no-progress"])
    message = flat(result.output)
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'run'}/" in message and "No space left on device while writing it" in message
    assert last.read_bytes() == before and load_checkpoint(last).step == 4  # the previous checkpoint is intact
    assert not [p for p in (tmp_path / "run").iterdir() if ".tmp-" in p.name]  # no temp file left behind


# --- real processes ------------------------------------------------------------------------------------

def train_command(config, *extra) -> list[str]:
    return [sys.executable, "-m", "maskattn.cli", "train", "--config", str(config), "--no-progress", *extra]


def slow_config(tmp_path, data, out, **train):
    """A run long enough to be killed in the middle (one thread, a step logged and a checkpoint every 10)."""
    config = tmp_path / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump(tiny_config(data, out, train={"max_steps": 120, "eval_every": 10,
                                                                     **train}).to_dict()))
    return config


@pytest.mark.slow
def test_two_runs_started_into_one_folder_the_second_stops_at_once(tmp_path):
    data = write_sentiment(tmp_path)
    out = tmp_path / "run"
    first = subprocess.Popen(train_command(slow_config(tmp_path, data, out)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (out / ".lock").exists() or '"pid"' not in (out / ".lock").read_text():
            assert time.time() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.1)
        start = time.time()
        second = subprocess.run(train_command(slow_config(tmp_path, data, out, seed=3), "--overwrite"),
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and f"is in use by another run (pid {first.pid}" in flat(second.stderr)
        assert time.time() - start < 30  # at once: no data was read, no model built
        stdout, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, stderr
    assert load_checkpoint(out / "best.safetensors").config["train"]["seed"] == 0  # all of one run
    assert dev_steps(out) == list(range(10, 121, 10))


@pytest.mark.slow
def test_sigkill_and_resume_reproduce_the_uninterrupted_run(tmp_path):
    data = write_sentiment(tmp_path)
    full = subprocess.run(train_command(slow_config(tmp_path, data, tmp_path / "full")), capture_output=True,
                          text=True, timeout=600)
    assert full.returncode == 0, full.stderr
    cut = tmp_path / "cut"
    config = slow_config(tmp_path, data, cut)
    for attempt in range(3):  # killed at three moments of the run, resumed each time
        command = train_command(config) if attempt == 0 else [
            sys.executable, "-m", "maskattn.cli", "train", "--resume", str(cut / "last.safetensors"), "--no-progress"]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        target = 30 * (attempt + 1) + 3 * attempt  # a train row past the next checkpoint, off the eval steps
        while not any(r["step"] >= target for r in read_metrics(cut / "metrics.jsonl")):
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        checkpoint_step = load_checkpoint(cut / "last.safetensors").step
        assert set(dev_steps(cut)) >= set(range(10, checkpoint_step + 1, 10))  # the log is not behind
    done = subprocess.run([sys.executable, "-m", "maskattn.cli", "train", "--resume", str(cut / "last.safetensors"),
                           "--no-progress"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr

    assert curve(cut) == curve(tmp_path / "full")  # same rows, bit-identical values, nothing lost or doubled
    assert_same_last_weights(tmp_path / "full", cut)
    assert not [p for p in cut.iterdir() if ".tmp-" in p.name]
    assert json.loads(done.stdout[done.stdout.index("{"):])["test"] == \
        json.loads(full.stdout[full.stdout.index("{"):])["test"]


# --- --overwrite deletes what a run wrote, nothing else --------------------------------------------------

def test_overwrite_deletes_only_what_the_run_wrote(tmp_path):
    """Issue 32 item 1: ``fold<N>`` folders holding the user's data survive ``--overwrite``, and so does every
    other file of theirs in the run folder."""
    data = write_sentiment(tmp_path)
    out = tmp_path / "ud"
    for fold in ("fold0", "fold1"):
        (out / fold).mkdir(parents=True)
        (out / fold / "train.tsv").write_text("\n".join(sentiment_lines(8, 0)) + "\n")
    (out / "notes.txt").write_text("mine")
    Trainer(tiny_config(data, out, train={"max_steps": 2})).fit()
    Trainer(tiny_config(data, out, train={"max_steps": 2, "seed": 5}), overwrite=True).fit()
    assert (out / "fold0" / "train.tsv").is_file() and (out / "fold1" / "train.tsv").is_file()
    assert (out / "notes.txt").read_text() == "mine"
    assert load_checkpoint(out / "last.safetensors").config["train"]["seed"] == 5
    # a cross-validation's overwrite empties its folds through their manifests and keeps what the user added
    all_data = tmp_path / "all"
    all_data.mkdir()
    (all_data / "all.tsv").write_text("\n".join(sentiment_lines(60, 0)) + "\n")
    cfg = tiny_config(all_data, tmp_path / "cv", data={"train": "all.tsv", "test": None, "cv_folds": 2},
                      train={"max_steps": 2})
    cross_validate(cfg)
    (tmp_path / "cv" / "fold1" / "mine.txt").write_text("mine")
    assert cross_validate(cfg, overwrite=True)["completed"] == 2
    assert (tmp_path / "cv" / "fold1" / "mine.txt").read_text() == "mine"
    assert (tmp_path / "cv" / "fold1" / "summary.json").is_file()


def test_a_folder_of_an_older_run_loses_only_its_run_files(tmp_path):
    """A run folder written before manifests existed: its run files go by name, a ``fold<N>`` folder only when
    it holds such a run itself (and only its run files), a config.yaml on its own is the user's."""
    data = write_sentiment(tmp_path)
    out = tmp_path / "old"
    (out / "fold0").mkdir(parents=True)
    (out / "fold0" / "train.tsv").write_text("mine\n")
    (out / "fold1").mkdir()
    (out / "fold1" / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "best.safetensors").write_bytes(b"old")
    with pytest.raises(RunFolderError, match="already holds a run"):
        Trainer(tiny_config(data, out, train={"max_steps": 2}))
    Trainer(tiny_config(data, out, train={"max_steps": 2}), overwrite=True).fit()
    assert (out / "fold0" / "train.tsv").read_text() == "mine\n" and not (out / "fold1").exists()
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.yaml").write_text("my: config\n")
    for overwrite in (False, True):
        with pytest.raises(RunFolderError, match="holds config.yaml, which no maskattn run wrote"):
            Trainer(tiny_config(data, own, train={"max_steps": 2}), overwrite=overwrite)
    assert (own / "config.yaml").read_text() == "my: config\n"


def test_a_run_folder_holding_the_data_is_refused(tmp_path):
    data = tmp_path / "ud" / "fold0"
    data.mkdir(parents=True)
    (data / "train.tsv").write_text("\n".join(sentiment_lines(40, 0)) + "\n")
    (data / "test.tsv").write_text("\n".join(sentiment_lines(8, 1)) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(data, tmp_path / "x").to_dict()))
    for out in (tmp_path / "ud", data):
        result = runner.invoke(app, ["train", "-c", str(config), "--out", str(out), "--overwrite", "--no-progress"])
        assert result.exit_code == 2 and f"run folder {out} holds the data this run reads" in flat(result.output)
    assert sorted(p.name for p in data.iterdir()) == ["test.tsv", "train.tsv"]
    assert sorted(p.name for p in (tmp_path / "ud").iterdir()) == ["fold0"]


def _edited(path, out, **changes):
    """``path`` rewritten with its metadata ``changes`` applied (``None`` removes an entry) and no checksum, as a
    hand edit leaves it."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        metadata = {k: v for k, v in f.metadata().items() if k != "sha256"}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for key, value in changes.items():
        if value is None:
            metadata.pop(key)
        else:
            metadata[key] = value
    save_file(tensors, str(out), metadata=metadata)
    return out


@pytest.mark.parametrize("changes, message", [
    ({"config": None}, "its metadata has no 'config' entry"),
    ({"vocab": None}, "its metadata has no 'vocab' entry"),
    ({"config": '{"model": '}, "metadata entry 'config' is not JSON (Expecting value at character 10)"),
    ({"step": "twelve"}, "metadata entry 'step' must be a step count (an int >= 0), got 'twelve'"),
    ({"config": "[1, 2]"}, "metadata entry 'config' must be a JSON object of config sections"),
    ({"labels": '["pos", 3]'}, "metadata entry 'labels' must be a JSON list of strings, got ['pos', 3]"),
    ({"extra": "[]"}, "metadata entry 'extra' must be a JSON object"),
    ({"config": '{"model": {"d_model": "wide"}}'}, "holds a configuration this version of maskattn rejects"),
])
def test_hand_edited_checkpoint_metadata_is_a_message_naming_file_and_entry(tmp_path, changes, message):
    """Issue 32 item 5: metadata edited by hand (the checksum removed, which only warns) gave ``KeyError:
    'config'``, ``JSONDecodeError``, ``ValueError`` on the step and ``AttributeError: 'list' object has no attribute
    'get'``; each is one line naming the file and the entry, after the unverified checkpoint's ``warning:`` line."""
    from maskattn.checkpoint import _warned_unverified

    data = write_sentiment(tmp_path)
    Trainer(tiny_config(data, tmp_path / "run", train={"max_steps": 4})).fit()
    edited = _edited(tmp_path / "run" / "best.safetensors", tmp_path / "edited.safetensors", **changes)
    _warned_unverified.clear()
    result = runner.invoke(app, ["eval", "-k", str(edited), "--data", str(data / "test.tsv")])
    lines = result.output.splitlines()
    assert result.exit_code == 2 and len(lines) == 2, result.output
    assert lines[0].startswith(f"warning: checkpoint {edited} has no checksum")
    assert lines[1].startswith("error: checkpoint") and str(edited) in lines[1] and message in lines[1]


@pytest.mark.parametrize("trainer_edit, message", [
    (lambda state: state.pop("epoch"), "metadata entry 'trainer' must be a JSON object with the trainer's epoch"),
    (lambda state: state["optimizer"].pop("param_groups"), "its trainer state (optimizer, schedule or random "
                                                           "generators) cannot be restored (KeyError: 'param_groups')"),
    (lambda state: state["rng"].update(python=[3]), "cannot be restored (ValueError"),
])
def test_a_hand_edited_trainer_state_is_refused_on_resume(tmp_path, monkeypatch, trainer_edit, message):
    data = write_sentiment(tmp_path)
    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "run", train={"eval_every": 4}), 6)
    last = tmp_path / "run" / "last.safetensors"
    state = load_checkpoint(last).trainer
    trainer_edit(state)
    _edited(last, last, trainer=json.dumps(state))
    result = runner.invoke(app, ["train", "--resume", str(last), "--no-progress"])
    assert result.exit_code == 2 and message in flat(result.output), result.output
    assert "Traceback" not in result.output


def test_an_interrupt_says_what_there_is_to_resume(tmp_path, monkeypatch):
    """Issue 32 item 8: an interrupt before the first checkpoint said the checkpoints were intact."""
    data = write_sentiment(tmp_path)
    original = Trainer.train_step
    for stop_before, expected in ((3, "no checkpoint was written yet (the first comes at the first evaluation), so "
                                      "there is nothing to resume: run the command again with --overwrite"),
                                  (6, "are intact; resume with --resume")):
        def crash(self, indices, stop_before=stop_before):
            if self.step == stop_before - 1:
                raise KeyboardInterrupt
            return original(self, indices)

        monkeypatch.setattr(Trainer, "train_step", crash)
        console = Console(record=True, width=400)
        with pytest.raises(KeyboardInterrupt):
            Trainer(tiny_config(data, tmp_path / f"run{stop_before}", train={"eval_every": 4}), console=console).fit()
        text = flat(console.export_text())
        assert f"interrupted at step {stop_before - 1}" in text and expected in text


# --- issue 55 --------------------------------------------------------------------------------------------------

def stop_at_step(monkeypatch, step: int) -> None:
    """Ctrl-C / SIGTERM (a ``KeyboardInterrupt``) in the training loop once ``step`` steps are done."""
    original = Trainer.train_step

    def crash(self, indices):
        if self.step == step:
            raise KeyboardInterrupt
        return original(self, indices)

    monkeypatch.setattr(Trainer, "train_step", crash)


def test_a_metrics_log_with_bytes_that_are_not_utf8_is_one_line_on_resume(tmp_path, monkeypatch):
    """Item 3: `train --resume` on a metrics.jsonl with non-UTF-8 bytes was a UnicodeDecodeError traceback; a last
    line cut inside a character (a kill mid-write) is cut short like any other, and left out."""
    data = write_sentiment(tmp_path)
    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "run", train={"eval_every": 4}), 6)
    log = tmp_path / "run" / "metrics.jsonl"
    rows = read_metrics(log)
    with log.open("ab") as f:
        f.write('{"step": 6, "split": "train", "note": "caf\u00e9'.encode()[:-1])  # cut inside the é
    assert read_metrics(log) == rows
    lines = log.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"train"', b'"tr\xe9in"')
    log.write_bytes(b"\n".join(lines))
    result = runner.invoke(app, ["train", "--resume", str(tmp_path / "run" / "last.safetensors"), "--no-progress"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: {log}:2: not UTF-8 text (byte 0xe9 at byte ")


def test_sigterm_while_a_run_starts_says_what_was_kept(tmp_path):
    """Minor item: SIGTERM in `train`'s first seconds (loading data, building the model) exited 130 with no
    message. A real SIGTERM, sent by the process to itself while the trainer builds its task, and another before
    the trainer exists."""
    data = write_sentiment(tmp_path)
    script = """
import os, signal, sys
import maskattn.train.config as config
import maskattn.train.trainer as trainer
from maskattn.cli import app

def stopped(original):
    def call(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)
    return call

if sys.argv[1] == "task":
    trainer.build_task = stopped(trainer.build_task)
else:
    config.load_config = stopped(config.load_config)
sys.argv = ["maskattn", "train", "--data", sys.argv[2], "--out", sys.argv[3], "--set", "data.format=tsv",
            "--set", "data.train=train.tsv", "--set", "model.d_model=16", "--set", "model.num_heads=2", "--no-progress"]
app()
"""
    for when, expected in (("task", "interrupted while the run was set up (data, model), before training: "
                                    f"nothing was written in {tmp_path / 'task'}; run the command again"),
                           ("config", "interrupted: before training started; nothing was trained")):
        done = subprocess.run([sys.executable, "-c", script, when, str(data), str(tmp_path / when)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 130, done.stderr[-2000:]
        assert expected in flat(done.stdout + done.stderr), done.stdout + done.stderr
        assert not (tmp_path / when).exists()  # nothing was written: the folder is gone


def test_more_threads_than_cpus_are_refused_before_the_run_starts(tmp_path):
    """Minor item: train.num_threads=200 on 2 CPUs was accepted (then libgomp could not start the threads under
    a memory cap). The limit is the CPUs this process may use (its affinity)."""
    cpus = len(os.sched_getaffinity(0))
    data = write_sentiment(tmp_path)
    with pytest.raises(ConfigError, match=rf"^train\.num_threads={cpus + 1} is more than the {cpus} CPU\(s\) this "
                                          rf"process may use; set at most train\.num_threads={cpus} \(0: PyTorch's "
                                          r"default\)$"):
        Trainer(tiny_config(data, tmp_path / "run", train={"num_threads": cpus + 1}))
    assert not (tmp_path / "run").exists()
    Trainer(tiny_config(data, tmp_path / "run", train={"num_threads": cpus})).close()


def test_the_command_that_started_a_run_continues_it_with_resume_added(tmp_path, monkeypatch):
    """Minor item: the interrupt message suggests --resume X, but the original command plus --resume was refused
    ("drop --config/--preset/--data"). Now it continues the run; a command whose configuration differs from the
    run's outside train.* is refused naming the differences."""
    data = write_sentiment(tmp_path)
    out = tmp_path / "run"
    command = ["train", "--data", str(data), "--out", str(out), "--max-steps", "12", "--no-progress",
               *[a for s in ("data.format=tsv", "data.train=train.tsv", "data.test=test.tsv", "model.d_model=16",
                             "model.num_heads=2", "train.eval_every=4", "train.num_threads=1") for a in ("--set", s)]]
    stop_at_step(monkeypatch, 5)
    result = runner.invoke(app, command)
    assert result.exit_code == 130
    last = out / "last.safetensors"
    assert f"resume with --resume {last} (added to the same command, or alone)" in flat(result.output)
    monkeypatch.undo()
    changed = [a if a != "model.d_model=16" else "model.d_model=32" for a in command]
    result = runner.invoke(app, [*changed, "--resume", str(last)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert (f"error: --resume {last} continues a run of another configuration than this command's: model.d_model "
            f"(16 in the checkpoint, 32 here); continue it with `maskattn train --resume {last}` alone") in result.output
    result = runner.invoke(app, [*command, "--resume", str(last)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output[result.output.index("{"):])["steps"] == 12
    assert dev_steps(out) == [4, 8, 12]


def test_the_trainers_messages_keep_long_paths_whole_in_a_file(tmp_path, monkeypatch):
    """Minor item: with stderr/stdout a file (80 columns for rich), the trainer's messages were wrapped, cutting the
    path to resume from."""
    data = write_sentiment(tmp_path)
    out = tmp_path / ("a-run-folder-with-a-rather-long-name-" * 3)
    stop_at_step(monkeypatch, 5)
    written = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny_config(data, out, train={"eval_every": 4}), console=Console(file=written)).fit()
    assert f"resume with --resume {out / 'last.safetensors'} (added" in written.getvalue()
    monkeypatch.undo()
    (out / "metrics.jsonl").write_text("")  # the resumed run warns, naming the log
    written = io.StringIO()
    resume(out / "last.safetensors", console=Console(file=written))
    assert f"warning: {out / 'metrics.jsonl'}: it holds no row, but the checkpoint" in written.getvalue()
