"""``torchrun`` itself: two CPU processes (gloo) launched by ``python -m torch.distributed.run`` on the
``maskattn train`` command train the same translation model as one process on the same global batches.

(tests/test_train_ddp.py checks the same equality for a classifier with processes spawned directly; this
test goes through the launcher and the command line, as a user does.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import yaml

from maskattn.train import load_checkpoint, read_metrics
from _train_helpers import write_parallel
from test_translation import translation_config


def run(args: list[str], cwd) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.slow
def test_torchrun_two_processes_train_the_same_translation_model_as_one(tmp_path):
    data = write_parallel(tmp_path)
    # SGD without dropout: the comparison is of gradients (see tests/test_train_ddp.py).
    cfg = translation_config(data, tmp_path / "unused", model={"dropout": 0.0},
                             optim={"name": "sgd", "lr": 0.3, "momentum": 0.9, "schedule": "constant",
                                    "warmup_steps": 0},
                             train={"max_steps": 6, "eval_every": 6, "metric": "loss", "test_beam": 1})
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    common = ["train", "--config", str(config), "--no-progress"]
    run(["-m", "maskattn.cli", *common, "--out", str(tmp_path / "single")], tmp_path)
    run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "maskattn.cli", *common,
         "--out", str(tmp_path / "ddp")], tmp_path)

    single = load_checkpoint(tmp_path / "single" / "last.safetensors")
    ddp = load_checkpoint(tmp_path / "ddp" / "last.safetensors")
    assert single.extra["subword_model"] == ddp.extra["subword_model"]  # every rank trained the same subwords
    assert single.model_state.keys() == ddp.model_state.keys()
    for name in single.model_state:
        assert torch.allclose(single.model_state[name], ddp.model_state[name], atol=1e-5, rtol=1e-4), name
    losses = {run: [r["loss"] for r in read_metrics(tmp_path / run / "metrics.jsonl") if r["split"] == "train"]
              for run in ("single", "ddp")}
    assert len(losses["ddp"]) == 6
    assert torch.allclose(torch.tensor(losses["single"]), torch.tensor(losses["ddp"]), atol=1e-5)
