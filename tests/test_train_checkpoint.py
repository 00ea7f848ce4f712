"""Atomic checkpoint writes: a failure or a SIGKILL while saving never corrupts the existing checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from maskattn.checkpoint import load_checkpoint
from maskattn.train.checkpoint import save_checkpoint

WRITER = """
import sys, torch
from maskattn.train.checkpoint import save_checkpoint
model = torch.nn.Linear(1024, 2048)
i = 0
while True:
    i += 1
    with torch.no_grad():
        model.weight.fill_(float(i))
    save_checkpoint(sys.argv[1], model=model, config={"train": {"i": i}}, vocab=["<pad>", "<unk>"], labels=["a"],
                    model_type="sentence", step=i)
    print(i, flush=True)
"""


def save_small(path, value: float, step: int):
    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.fill_(value)
    return save_checkpoint(path, model=model, config={"train": {"v": value}}, vocab=["<pad>", "<unk>"], labels=["a", "b"],
                           model_type="sentence", step=step)


def test_failure_during_replace_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.safetensors"
    save_small(path, 1.0, 1)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save_small(path, 2.0, 2)
    monkeypatch.undo()
    ckpt = load_checkpoint(path)
    assert ckpt.step == 1 and torch.all(ckpt.model_state["weight"] == 1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.safetensors"]  # no temp file left behind


def test_sigkill_while_saving_never_leaves_a_corrupt_checkpoint(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    for attempt in range(2):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip()  # at least one checkpoint written
            time.sleep(0.05 + 0.1 * attempt)  # kill somewhere in the middle of a later write
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        ckpt = load_checkpoint(path)
        assert torch.all(ckpt.model_state["weight"] == float(ckpt.config["train"]["i"]))  # complete and consistent
