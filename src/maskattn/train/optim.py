"""Optimisers (Adam, AdamW, Adadelta, SGD) with their parameter groups (weight decay on weight matrices only,
layer-wise learning rates for fine-tuning) and learning-rate schedules (constant, warm-up, linear warm-up then
linear decay, inverse square root, reduce-on-plateau), built from an
:class:`~maskattn.train.config.OptimConfig`."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from ..errors import ArgumentError, ConfigError

__all__ = ["build_optimizer", "build_scheduler", "Schedule", "parameter_groups", "optimizer_step", "OPTIMIZERS", "SCHEDULES",
           "DECAY_TARGETS"]

OPTIMIZERS = ("adam", "adamw", "adadelta", "sgd")
SCHEDULES = ("constant", "warmup", "linear", "inverse_sqrt", "plateau")
DECAY_TARGETS = ("all", "matrices", "except_embeddings")  # optim.weight_decay_on


def _decays(target: str, name: str, param: nn.Parameter, embeddings: set[int]) -> bool:
    """Does ``weight_decay_on: target`` decay this parameter? ``matrices``: weight matrices (and embedding tables)
    yes, biases, LayerNorm gains and other vectors no; ``except_embeddings``: everything but the word embedding
    tables (``embeddings``: their ids) — with Adam, an L2 term on a table whose rare rows get no other gradient
    moves them by the learning rate every step and wipes pretrained vectors out within a few hundred steps."""
    if target == "except_embeddings":
        return id(param) not in embeddings
    return param.ndim >= 2 and not name.endswith("bias")


def parameter_groups(cfg, model: nn.Module) -> list[dict]:
    """The optimiser's parameter groups. ``optim.layer_decay`` ``d`` < 1: the model's layers
    (``model.layer_groups()``, bottom first; pretrained encoders) get the learning rate ``lr · d^k`` at ``k``
    layers below the top group (the head keeps ``lr``); ``optim.weight_decay_on`` ``matrices`` or
    ``except_embeddings`` puts the parameters :func:`_decays` refuses into groups without weight decay. The top group comes first, so
    ``param_groups[0]["lr"]`` is the learning rate of the head (what the metrics log shows). With neither
    option: one group of every trainable parameter."""
    if cfg.layer_decay != 1.0:
        layer_groups = getattr(model, "layer_groups", None)
        if layer_groups is None:
            raise ConfigError(f"optim.layer_decay {cfg.layer_decay:g} needs a model with numbered layers, a "
                              f"pretrained encoder (model.pretrained); {type(model).__name__} has none: set "
                              "optim.layer_decay=1")
        layers = layer_groups()
    else:
        layers = [[p for p in model.parameters() if p.requires_grad]]
    names = {id(p): name for name, p in model.named_parameters()}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    groups = []
    for depth in reversed(range(len(layers))):
        lr = cfg.lr * cfg.layer_decay ** (len(layers) - 1 - depth)
        params = layers[depth]
        if cfg.weight_decay_on == "all":
            parts = [params, []]
        else:
            decays = [_decays(cfg.weight_decay_on, names[id(p)], p, embeddings) for p in params]
            parts = [[p for p, d in zip(params, decays) if d], [p for p, d in zip(params, decays) if not d]]
        for part, decay in zip(parts, (cfg.weight_decay, 0.0)):
            if part:
                groups.append({"params": part, "lr": lr, "weight_decay": decay})
    return groups


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, model: nn.Module, *, clip_norm: float,
                   scaler: torch.amp.GradScaler | None = None) -> None:
    """One optimiser step on ``loss``: gradients cleared, backward (scaled by ``scaler`` under float16 autocast),
    gradients unscaled and clipped to ``clip_norm`` (0: not clipped), the step — the trainer's and the cost
    measurement's (:mod:`maskattn.grid.cost`) alike."""
    optimizer.zero_grad(set_to_none=True)
    (scaler.scale(loss) if scaler else loss).backward()
    if scaler:
        scaler.unscale_(optimizer)
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def build_optimizer(cfg, model: nn.Module) -> torch.optim.Optimizer:
    """The optimiser over the model's trainable parameters, in :func:`parameter_groups`; ``weight_decay`` is
    the L2 factor γ (decoupled for ``adamw``)."""
    params = parameter_groups(cfg, model)
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "adadelta":
        return torch.optim.Adadelta(params, lr=cfg.lr, rho=cfg.rho, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    raise ArgumentError(f"unknown optim.name {cfg.name!r}; expected one of {', '.join(OPTIMIZERS)}")


def _lr_factor(schedule: str, warmup: int, total: int | None):
    """Multiplier of the base learning rate at optimiser step ``step`` (0-based)."""
    def warmup_then_constant(step: int) -> float:
        return min(1.0, (step + 1) / warmup) if warmup else 1.0

    def warmup_then_linear(step: int) -> float:  # 1 at the last warm-up step, 1 / (total − peak) at the last step
        assert total is not None  # build_schedule requires the run's length for 'linear'
        peak = max(warmup - 1, 0)
        if step < peak:
            return (step + 1) / warmup
        return max(0.0, (total - step) / (total - peak))

    def inverse_sqrt(step: int) -> float:
        s, w = step + 1, max(1, warmup)
        return min(s / w, math.sqrt(w / s)) if warmup else 1.0 / math.sqrt(s)

    return {"warmup": warmup_then_constant, "linear": warmup_then_linear, "inverse_sqrt": inverse_sqrt,
            "constant": lambda step: 1.0}[schedule]


class Schedule:
    """A learning-rate schedule and when it moves, so that the training loop never asks which one it is: the
    step-wise schedules move in :meth:`after_step` (after every optimiser step), ``plateau`` in
    :meth:`after_evaluation` (after every dev evaluation, from the dev metric); the other call does nothing.
    ``state_dict`` / ``load_state_dict`` are the scheduler's (checkpoints)."""

    def __init__(self, scheduler, *, per_evaluation: bool):
        self.scheduler = scheduler
        self.per_evaluation = per_evaluation

    def after_step(self) -> None:
        if not self.per_evaluation:
            self.scheduler.step()

    def after_evaluation(self, value: float) -> None:
        """``value``: the dev metric, higher = better."""
        if self.per_evaluation:
            self.scheduler.step(value)

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.scheduler.optimizer.param_groups]

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


def build_scheduler(cfg, optimizer: torch.optim.Optimizer, total_steps: int | None = None) -> Schedule:
    """The :class:`Schedule` of ``optim.schedule``: a step-wise ``LambdaLR`` (constant / warmup / linear /
    inverse_sqrt) or an evaluation-wise ``ReduceLROnPlateau``. ``linear`` (the usual fine-tuning schedule) rises
    linearly to ``lr`` at the last of ``warmup_steps`` steps, then decays linearly to reach 0 just after the last
    of the run's ``total_steps`` (which it needs), so every step trains."""
    if cfg.schedule not in SCHEDULES:
        raise ArgumentError(f"unknown optim.schedule {cfg.schedule!r}; expected one of {', '.join(SCHEDULES)}")
    if cfg.schedule == "plateau":
        return Schedule(ReduceLROnPlateau(optimizer, mode="max", factor=cfg.plateau_factor,
                                          patience=cfg.plateau_patience, min_lr=cfg.min_lr), per_evaluation=True)
    if cfg.schedule == "linear" and (total_steps is None or total_steps < cfg.warmup_steps):
        raise ConfigError(f"optim.schedule 'linear' decays towards 0 at the run's last step, which must not come "
                          f"before the end of optim.warmup_steps {cfg.warmup_steps}; the run has {total_steps} steps")
    return Schedule(LambdaLR(optimizer, _lr_factor(cfg.schedule, cfg.warmup_steps, total_steps)),
                    per_evaluation=False)
