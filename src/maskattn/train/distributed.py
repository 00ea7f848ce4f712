"""Data-parallel training with ``torchrun`` + ``torch.distributed`` (DDP; gloo on CPU, NCCL on GPU).

Every rank draws the same global batch (the batch order depends only on the seed and the epoch) and
keeps every ``world_size``-th example of it; the loss is the sum over the local examples divided by the
global batch's count and multiplied by ``world_size``, so DDP's gradient average equals the gradient of
the global batch's mean loss — the same model as one process on the same global batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistContext", "init_distributed", "all_reduce_sum", "barrier", "cleanup"]


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> DistContext:
    """Join the process group described by torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``/``MASTER_PORT``); a single process when ``WORLD_SIZE`` is unset or 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.enabled:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def cleanup(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
