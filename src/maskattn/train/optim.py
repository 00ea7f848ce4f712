"""Optimisers (Adam, AdamW, Adadelta, SGD) and learning-rate schedules (constant, warm-up,
inverse square root, reduce-on-plateau), built from an :class:`~maskattn.train.config.OptimConfig`."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

__all__ = ["build_optimizer", "build_scheduler", "OPTIMIZERS", "SCHEDULES"]

OPTIMIZERS = ("adam", "adamw", "adadelta", "sgd")
SCHEDULES = ("constant", "warmup", "inverse_sqrt", "plateau")


def build_optimizer(cfg, model: nn.Module) -> torch.optim.Optimizer:
    """The optimiser over the model's trainable parameters; ``weight_decay`` is the L2 factor γ."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "adadelta":
        return torch.optim.Adadelta(params, lr=cfg.lr, rho=cfg.rho, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optim.name {cfg.name!r}; expected one of {', '.join(OPTIMIZERS)}")


def _lr_factor(schedule: str, warmup: int):
    """Multiplier of the base learning rate at optimiser step ``step`` (0-based)."""
    def warmup_then_constant(step: int) -> float:
        return min(1.0, (step + 1) / warmup) if warmup else 1.0

    def inverse_sqrt(step: int) -> float:
        s, w = step + 1, max(1, warmup)
        return min(s / w, math.sqrt(w / s)) if warmup else 1.0 / math.sqrt(s)

    return {"warmup": warmup_then_constant, "inverse_sqrt": inverse_sqrt, "constant": lambda step: 1.0}[schedule]


def build_scheduler(cfg, optimizer: torch.optim.Optimizer):
    """A step-wise ``LambdaLR`` (constant / warmup / inverse_sqrt; call ``step()`` after every optimiser
    step) or an evaluation-wise ``ReduceLROnPlateau`` (call ``step(dev_metric)`` after every evaluation)."""
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"unknown optim.schedule {cfg.schedule!r}; expected one of {', '.join(SCHEDULES)}")
    if cfg.schedule == "plateau":
        return ReduceLROnPlateau(optimizer, mode="max", factor=cfg.plateau_factor, patience=cfg.plateau_patience,
                                 min_lr=cfg.min_lr)
    return LambdaLR(optimizer, _lr_factor(cfg.schedule, cfg.warmup_steps))
