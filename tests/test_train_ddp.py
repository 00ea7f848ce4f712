"""Data-parallel training: 2 CPU processes (gloo) train the same model as 1 process on the same global
batch."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp

from _train_helpers import tiny_config, write_sentiment
from maskattn.train import Trainer, load_checkpoint, read_metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    # SGD: the comparison is of gradients. (Adam would turn float noise in exactly-zero gradients, e.g. of
    # the source2token output bias, whose softmax is shift-invariant, into full-size steps.)
    cfg = tiny_config(data, out, model={"dropout": 0.0}, optim={"name": "sgd", "lr": 0.5, "momentum": 0.9},
                      train={"max_steps": 8, "eval_every": 4})
    Trainer(cfg).fit()


def assert_two_processes_train_as_one(run, tmp_path, *args) -> None:
    """``run(rank, world_size, port, *args, out_dir)`` once in this process and once in two spawned processes
    (into ``tmp_path``/single and /ddp): the final weights must agree."""
    run(0, 1, free_port(), *args, str(tmp_path / "single"))
    os.environ.pop("WORLD_SIZE", None)
    mp.spawn(run, args=(2, free_port(), *args, str(tmp_path / "ddp")), nprocs=2, join=True)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)
    single = load_checkpoint(tmp_path / "single" / "last.safetensors").model_state
    ddp = load_checkpoint(tmp_path / "ddp" / "last.safetensors").model_state
    assert single.keys() == ddp.keys()
    for name in single:
        assert torch.allclose(single[name], ddp[name], atol=1e-5, rtol=1e-4), name


def test_two_processes_train_the_same_model_as_one(tmp_path):
    data = write_sentiment(tmp_path)
    assert_two_processes_train_as_one(worker, tmp_path, str(data))
    losses = lambda run: [r["loss"] for r in read_metrics(tmp_path / run / "metrics.jsonl") if r["split"] == "train"]
    assert len(losses("ddp")) == 8
    assert torch.allclose(torch.tensor(losses("single")), torch.tensor(losses("ddp")), atol=1e-5)
