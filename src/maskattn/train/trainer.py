"""The training loop: optimiser and schedule, gradient clipping, mixed precision on GPU, an optional moving
average of the weights, evaluation every N steps, best-checkpoint selection, early stopping, exact resume,
DDP, progress bar and metrics files.

One loop serves every model type; what differs (data, batches, model, loss, metrics, what a checkpoint
carries) lives in a task (:mod:`maskattn.train.tasks`): classification or translation.

Resume determinism: the batch order is a pure function of (seed, epoch) (:class:`BucketBatchSampler`,
:class:`TokenBatchSampler`), and a resumable checkpoint stores the position in the epoch, the optimiser and
scheduler states, the weight average and the torch / Python / NumPy RNG states (dropout), so a resumed run
reproduces the uninterrupted run's loss curve.

The run folder (``train.out_dir``) is held by one trainer from its construction to the end of :meth:`fit`
(:class:`~maskattn.train.run_folder.RunFolder`); a new run refuses a folder that holds a run unless told to
``overwrite`` it. At every evaluation the dev row is appended to the metrics log *before* the checkpoints are
written, so every checkpoint's step has its rows in the log whenever the process is killed (resume drops the
rows after the checkpoint's step and redoes them).
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import yaml
from rich.console import Console
from rich.markup import escape
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ..checkpoint import Checkpoint, load_checkpoint, load_weights
from ..errors import CheckpointError, ConfigError, DivergenceError, Interrupted
from ..device import resolve_device
from ..metrics.test_outputs import HYPOTHESES, PREDICTIONS
from . import acceleration
from .checkpoint import capture_rng, optimizer_from_flat, optimizer_to_flat, restore_rng, save_checkpoint
from .config import RunConfig, from_dict
from ..files import atomic_write, check_output_folder
from .distributed import (DistContext, all_reduce_sum, barrier, cleanup, collective_failed, gather_rng,
                          init_distributed, restore_rank_rng)
from .logger import MetricsLogger
from .optim import build_optimizer, build_scheduler, optimizer_step
from .progress import TrainProgress
from .run_folder import RunFolder, refuse_inputs_inside
from .tasks import Task, build_task

__all__ = ["Trainer", "resolve_device", "seed_everything", "parameter_counts"]

#: what a trainer writes into its run folder (recorded there as the run's before any is written)
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "metrics.csv", "best.safetensors", "last.safetensors", HYPOTHESES,
               PREDICTIONS)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a Slurm allocation, ``taskset``), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _better(metric: str, new: float, old: float | None) -> bool:
    if old is None:
        return True
    return new < old if metric == "loss" else new > old


class Trainer:
    """Train one model described by a :class:`RunConfig`.

    ``Trainer(cfg).fit()`` trains and returns a summary (best dev metric, its step, test metrics of the
    best checkpoint, training throughput, paths). ``Trainer.resume(path)`` continues from a resumable checkpoint
    (``last.safetensors``). Under ``torchrun`` every process runs the same code (DDP); the main process holds
    the run folder and writes its files.

    The trainer holds ``train.out_dir`` from construction until :meth:`fit` returns (or :meth:`close`); a
    folder another process holds raises :class:`~maskattn.errors.RunFolderError`, and so does a folder that
    holds a run, unless ``overwrite`` (its run's files are deleted once the folder is held).
    """

    def __init__(self, cfg: RunConfig, *, console: Console | None = None, overwrite: bool = False,
                 _checkpoint: Checkpoint | None = None):
        self.cfg = cfg
        train_config = cfg.train
        if train_config.max_steps <= 0 and train_config.max_epochs <= 0:
            raise ConfigError("set train.max_steps or train.max_epochs (both are 0: the run would never end)")
        if train_config.num_threads > (cpus := usable_cpus()):  # each thread is started, and holds its stack
            raise ConfigError(f"train.num_threads={train_config.num_threads} is more than the {cpus} CPU(s) this "
                              f"process may use; set at most train.num_threads={cpus} (0: PyTorch's default)")
        if train_config.num_threads:
            torch.set_num_threads(train_config.num_threads)
        if train_config.tensorboard:  # refused now, before the run folder is taken (an optional sink)
            check_output_folder("train.tensorboard", train_config.tensorboard)
        self.device = resolve_device(train_config.device)
        self.dist: DistContext = init_distributed(self.device)
        if self.device.type == "cuda" and self.dist.enabled:  # one GPU per process: all the node's, or its own
            self.device = torch.device("cuda", self.dist.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        self.console = console or Console()
        self.out_dir = Path(train_config.out_dir)
        refuse_inputs_inside(self.out_dir, cfg.data.input_paths())
        self.folder = RunFolder(self.out_dir)
        try:
            if self.dist.is_main:
                self.folder.lock()
            self._setup(overwrite, _checkpoint)
        except KeyboardInterrupt:
            if self.dist.is_main:
                self._say_interrupted("while the run was set up (data, model), before training")
            self.close()
            raise Interrupted from None
        except BaseException:
            self.close()
            raise

    def _setup(self, overwrite: bool, ckpt: Checkpoint | None) -> None:
        """Everything of construction after the run folder is held: the task, model, optimiser, the restored
        checkpoint, then the run folder's files (an overwritten run is deleted only once everything else is
        built, so a mistake in the new configuration leaves it in place)."""
        cfg, train_config = self.cfg, self.cfg.train
        replace = ckpt is None and self.dist.is_main
        if replace and not overwrite:
            self.folder.refuse_existing_run()
        if self.dist.is_main:
            self.folder.claim(*RUN_OUTPUTS, record=False)  # refused now, before an overwrite deletes anything
        seed_everything(train_config.seed)
        if ckpt is not None and ckpt.model_type != cfg.model.type:
            raise CheckpointError(f"checkpoint {ckpt.path} holds a {ckpt.model_type!r} model, the config a "
                                  f"{cfg.model.type!r} model")
        self.task: Task = build_task(cfg, self.device, ckpt)
        if self.dist.is_main:
            for message in getattr(self.task, "notices", ()):
                self._warn(message)
            for message in getattr(self.task, "notes", ()):
                self.console.print(escape(message), highlight=False, soft_wrap=True)
        if train_config.metric not in self.task.metrics:
            raise ConfigError(f"train.metric {train_config.metric!r} is not computed for model.type {cfg.model.type!r}; "
                             f"expected one of {', '.join(self.task.metrics)}")
        self.sampler = self.task.sampler
        self._check_patience()
        self.model = self.task.model.to(self.device)
        self.optimizer = build_optimizer(cfg.optim, self.model)
        self.scheduler = build_scheduler(cfg.optim, self.optimizer, self.total_steps())
        self.step, self.epoch, self.position = 0, 0, 0
        self._elapsed_before = 0.0  # seconds of the run's earlier sessions (a resumed run)
        self._start: float | None = None  # when this session's loop began
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.bad_evals = 0
        self._bar: TrainProgress | None = None  # the progress bar, while fit() runs
        # the train loss summed over the steps since the last train row (a checkpoint keeps it: a resumed run's
        # first row averages the same steps as the uninterrupted run's)
        self.window_loss, self.window_steps = 0.0, 0
        self.ema = build_ema(self.model, train_config.ema_decay)
        if ckpt is not None:
            self._restore(ckpt)
        self.amp_dtype = acceleration.autocast_dtype(train_config.amp, self.device)
        acceleration.check_trainable_backends(self.model, self.device,
                                              self.amp_dtype or next(self.model.parameters()).dtype)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        # what runs the training forward: DDP around the model, compiled when train.compile (docs/training.md)
        self.ddp = DistributedDataParallel(self.model) if self.dist.enabled else None
        self.train_module = self.ddp or self.model
        self.recompiles = None
        if train_config.compile:
            self.train_module = acceleration.compile_model(self.train_module)
            self.recompiles = acceleration.RecompileMonitor()
        if replace and overwrite:
            self.folder.clear()
        if self.dist.is_main:
            self.folder.claim(*RUN_OUTPUTS)
        self.logger = MetricsLogger(self.out_dir, enabled=self.dist.is_main,
                                    resume_step=self.step if ckpt is not None else None, warn=self._warn,
                                    tensorboard=train_config.tensorboard)
        if self.dist.is_main:
            atomic_write(self.out_dir / "config.yaml", [yaml.safe_dump(cfg.to_dict(), sort_keys=False).encode()])

    def evaluations(self) -> int:
        """How many dev evaluations the run makes from step 0 to its last step (the last step is always one):
        every ``train.eval_every`` steps, or at every epoch's end when it is 0."""
        total, every = self.total_steps(), self.cfg.train.eval_every or len(self.sampler)
        return -(-total // every)  # ceil: the last, partial interval ends in an evaluation too

    def _check_patience(self) -> None:
        """Refuse ``train.patience`` that can never stop the run: early stopping needs ``patience`` evaluations
        after the best one, so a run of at most ``patience`` evaluations trains to its end whatever the dev metric."""
        train_config = self.cfg.train
        patience, evaluations = train_config.patience, self.evaluations()
        if patience and evaluations <= patience:
            when = (f"every {train_config.eval_every} steps" if train_config.eval_every
                    else f"at the end of each epoch of {len(self.sampler)} steps")
            raise ConfigError(f"train.patience={patience} can never stop this run early: it stops after {patience} "
                              f"dev evaluations without improvement, but the run evaluates {when} and makes only "
                              f"{evaluations} evaluation{'s' * (evaluations != 1)} in its {self.total_steps()} steps; "
                              f"lower train.eval_every, raise train.max_steps / max_epochs, or set train.patience=0")

    def _warn(self, message: str) -> None:
        """``warning: …``, one line however long (a path is never cut at the console's width)."""
        self.console.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False, soft_wrap=True)

    def _say_interrupted(self, when: str) -> None:
        """``interrupted …: <what there is to resume>``, one line (after Ctrl-C / SIGTERM)."""
        self.console.print(f"[yellow]interrupted {escape(when)}[/yellow]: {escape(self._kept())}", highlight=False,
                           soft_wrap=True)

    def close(self) -> None:
        """Release the run folder (:meth:`fit` does it when it returns or raises)."""
        if getattr(self, "logger", None) is not None:
            self.logger.close()
        self.folder.unlock()

    # --- construction from checkpoints ------------------------------------------------------------------

    @classmethod
    def resume(cls, path: str | Path, *, train_overrides: dict | None = None, console: Console | None = None,
               command_config: RunConfig | None = None) -> Trainer:
        """Continue the run saved in the resumable checkpoint ``path`` with its own configuration, in the folder
        that holds ``path``; the ``train`` section may be overridden (e.g. a larger ``max_steps``) except
        ``out_dir`` (copy the folder to branch a run). ``command_config``: the configuration of the command that
        started the run, given again (``maskattn train <the same options> --resume …``): every section but
        ``train`` must equal the checkpoint's (:class:`ConfigError` naming what differs), and its ``train``
        settings are taken, under ``train_overrides``."""
        path = Path(path)
        ckpt = load_checkpoint(path)
        if ckpt.trainer is None:
            raise CheckpointError(f"{path} holds weights only (a best/exported checkpoint); resume from the run's "
                                  "last.safetensors")
        config = dict(ckpt.config)
        overrides = dict(train_overrides or {})
        if command_config is not None:
            _refuse_another_run(command_config, config, path)
            overrides = {**command_config.to_dict()["train"], **overrides}
        if "out_dir" in overrides and Path(overrides["out_dir"]).resolve() != path.parent.resolve():
            raise ConfigError(f"a resumed run continues in the folder of its checkpoint ({path.parent}); train.out_dir "
                              f"({overrides['out_dir']}) cannot change (copy the folder to continue a copy of the run "
                              "elsewhere)")
        config["train"] = {**config.get("train", {}), **overrides, "out_dir": str(path.parent)}
        try:
            cfg = from_dict(RunConfig, config)
        except ConfigError as exc:
            raise CheckpointError(f"checkpoint {path} holds a configuration this version of maskattn rejects, with "
                                  f"the train.* settings given: {exc}") from None
        return cls(cfg, console=console, _checkpoint=ckpt)

    def _restore(self, ckpt: Checkpoint) -> None:
        load_weights(self.model, ckpt)
        state = ckpt.trainer
        assert state is not None  # from_checkpoint refused weights-only checkpoints
        try:  # the checkpoint reader checked the state's outline; what is inside is read here
            optimizer_from_flat(self.optimizer, ckpt.extra_tensors, state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            restore_rng(ckpt.extra_tensors, state["rng"])
            restore_rank_rng(ckpt.extra_tensors, self.dist, state.get("world_size", 1))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {ckpt.path}: its trainer state (optimizer, schedule or random "
                                  f"generators) cannot be restored ({type(exc).__name__}: {exc}); the file was edited "
                                  "or damaged: resume from another checkpoint") from None
        self.step, self.epoch, self.position = ckpt.step, state["epoch"], state["position"]
        written = state.get("world_size")  # absent in checkpoints written before issue 56
        if written not in (None, self.dist.world_size) and self.dist.is_main:  # docs/cluster.md: the same batch
            self.console.print(escape(
                f"note: {ckpt.path} was written by {written} process(es) and is continued by {self.dist.world_size}, "
                f"with the same global batch of {self.cfg.train.batch_size} examples shared among them: the steps "
                "from here equal an uninterrupted run's up to float rounding, not bit for bit"),
                highlight=False, soft_wrap=True)
        self._elapsed_before = float(state.get("elapsed_s", 0.0))  # absent in checkpoints before 0.2.1
        self.best_metric, self.best_step, self.bad_evals = state["best_metric"], state["best_step"], state["bad_evals"]
        window = state.get("window")
        if window is None:  # written before the window was kept
            if self.step % self.cfg.train.log_every:
                self._warn(f"{ckpt.path} was written by an older maskattn without the running train loss: the first "
                           f"train row after step {self.step} averages only the steps after it")
        else:
            self.window_loss, self.window_steps = float(window["loss"]), int(window["steps"])
        if self.ema is not None:
            ema_state = {k[len("ema."):]: v for k, v in ckpt.extra_tensors.items() if k.startswith("ema.")}
            if not ema_state:
                raise ConfigError(f"{ckpt.path} was saved without train.ema_decay; resume it with train.ema_decay=0")
            self.ema.load_state_dict(ema_state)

    # --- checkpoints ------------------------------------------------------------------------------------

    def save(self, name: str, *, resumable: bool) -> Path | None:
        """Write ``<out_dir>/<name>.safetensors`` atomically (main process only)."""
        ranks_rng = gather_rng(self.dist) if resumable else {}  # every process's generators (its dropout)
        if not self.dist.is_main:
            return None
        trainer, extra = None, None
        if resumable:
            rng_tensors, rng_state = capture_rng()
            rng_tensors.update(ranks_rng)
            optim_tensors, optim_meta = optimizer_to_flat(self.optimizer)
            trainer = {"epoch": self.epoch, "position": self.position, "best_metric": self.best_metric,
                       "best_step": self.best_step, "bad_evals": self.bad_evals, "rng": rng_state,
                       "optimizer": optim_meta, "scheduler": self.scheduler.state_dict(),
                       "elapsed_s": self._elapsed(), "world_size": self.dist.world_size,
                       "window": {"loss": self.window_loss, "steps": self.window_steps}}
            extra = {**rng_tensors, **optim_tensors}
            if self.ema is not None:
                extra.update({f"ema.{k}": v.detach().cpu().contiguous() for k, v in self.ema.state_dict().items()})
        # a weights-only checkpoint holds the model that is evaluated (the average, with train.ema_decay)
        model = self.model if resumable else self.eval_model
        return save_checkpoint(self.out_dir / f"{name}.safetensors", model=model, config=self.cfg.to_dict(),
                               model_type=self.cfg.model.type, step=self.step, trainer=trainer, extra_tensors=extra,
                               **self.task.checkpoint_fields())

    # --- one step ---------------------------------------------------------------------------------------

    def train_step(self, indices: list[int]) -> tuple[float, int]:
        """One optimiser step on the global batch ``indices``; returns (global mean loss, throughput units:
        examples or target tokens)."""
        world, rank = self.dist.world_size, self.dist.rank
        global_count = self.task.loss_terms(indices)
        local = indices[rank::world]
        module = self.train_module
        module.train()
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            if local:
                loss_sum = self.task.loss_sum(module, local)
            else:  # an empty shard still joins DDP's gradient all-reduce
                loss_sum = sum((p.sum() for p in module.parameters()), torch.zeros((), device=self.device)) * 0.0
        loss = loss_sum * (world / global_count)
        optimizer_step(loss, self.optimizer, self.model, clip_norm=self.cfg.optim.clip_norm, scaler=self.scaler)
        self.scheduler.after_step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        if self.recompiles is not None and (message := self.recompiles.check()):
            self._warn(message)
        total = all_reduce_sum(loss_sum.detach().float().reshape(1), self.dist)
        return float(total) / global_count, self.task.throughput_units(indices)

    # --- evaluation -------------------------------------------------------------------------------------

    @property
    def eval_model(self) -> nn.Module:
        """The model that is evaluated and kept as ``best``: the trained one, or its exponential moving average
        of the weights with ``train.ema_decay``."""
        return self.model if self.ema is None else self.ema.module

    def evaluate(self, split: str) -> dict[str, float]:
        """Metrics of :attr:`eval_model` on ``dev`` or ``test`` (every rank computes the same numbers); a long
        evaluation (decoding a split) shows its own row under the progress bar."""
        return self.task.evaluate(self.eval_model, split,
                                  progress=self._bar.stage(f"decode {split}") if self._bar is not None else None)

    def _evaluate_and_checkpoint(self) -> bool:
        """Dev evaluation, its row in the log, best / last checkpoints, schedule and early stopping; True = stop.
        The row is logged first: a checkpoint is never ahead of the log (module docstring)."""
        train_config = self.cfg.train
        metrics = self.evaluate("dev")
        value = metrics[train_config.metric]  # the task computes every metric it accepts (checked in __init__)
        self.logger.log(step=self.step, epoch=self.epoch, split="dev", **metrics, elapsed_s=self._elapsed())
        self.scheduler.after_evaluation(-value if train_config.metric == "loss" else value)
        improved = _better(train_config.metric, value, self.best_metric)
        if improved:
            self.best_metric, self.best_step, self.bad_evals = value, self.step, 0
            self.save("best", resumable=False)
        else:
            self.bad_evals += 1
        if train_config.keep_last:
            self.save("last", resumable=True)
        barrier(self.dist)
        return bool(train_config.patience) and self.bad_evals >= train_config.patience

    def _elapsed(self) -> float:
        """Seconds of training so far, earlier sessions of a resumed run included (the work between a run's last
        checkpoint and its interruption is redone, and counted, once)."""
        now = time.perf_counter() - self._start if self._start is not None else 0.0
        return round(self._elapsed_before + now, 3)

    # --- the loop ---------------------------------------------------------------------------------------

    def total_steps(self) -> int:
        per_epoch = len(self.sampler)
        limits = [s for s in (self.cfg.train.max_steps, self.cfg.train.max_epochs * per_epoch) if s > 0]
        return min(limits)

    def fit(self) -> dict:
        """Train until ``max_steps`` / ``max_epochs`` or early stopping; then evaluate the best checkpoint on
        the test split. Ctrl-C / SIGTERM stop the loop; checkpoints already written stay intact. However it
        ends, the run folder is released."""
        total = self.total_steps()
        try:
            with TrainProgress(total, console=self.console, enabled=self.cfg.train.progress and self.dist.is_main,
                               start=self.step, unit="tok" if self.task.unit == "tokens" else "ex") as self._bar:
                try:
                    try:
                        self._train(total)
                    except RuntimeError as exc:  # a broken collective: another process stopped first?
                        collective_failed(exc, self.dist)
                        raise
                except KeyboardInterrupt:
                    if self.dist.is_main:
                        self._say_interrupted(f"at step {self.step}")
                    raise Interrupted from None
                return self._finish()
        finally:
            self._bar = None
            cleanup(self.dist)
            self.close()

    def _kept(self) -> str:
        """What an interrupted run leaves to continue from (said once it stops)."""
        last = self.out_dir / "last.safetensors"
        if last.exists():
            return (f"checkpoints in {self.out_dir} are intact; resume with --resume {last} (added to the same "
                    "command, or alone)")
        if (self.out_dir / "best.safetensors").exists():
            return (f"{self.out_dir / 'best.safetensors'} is intact, but there is no last.safetensors to resume from "
                    "(train.keep_last is off): a new run starts again from step 0")
        if not self.folder.run_entries():
            return f"nothing was written in {self.out_dir}; run the command again to start the run"
        return (f"no checkpoint was written yet (the first comes at the first evaluation), so there is nothing to "
                f"resume: run the command again with --overwrite to start over in {self.out_dir}")

    def _train(self, total: int) -> None:
        """The loop: optimiser steps, train rows every ``log_every`` steps, evaluations and checkpoints, until
        step ``total`` or early stopping."""
        train_config = self.cfg.train
        self._start = time.perf_counter()
        speed_key = f"{self.task.unit}_per_s"
        self._train_units, self._train_seconds = 0, 0.0  # throughput of the training steps alone
        window_units, window_start = 0, time.perf_counter()  # this session's: the speed of the next row
        stop = self.step >= total
        bar = self._bar
        assert bar is not None  # fit() holds it
        while not stop:
            batches = self.sampler.batches(self.epoch)
            while self.position < len(batches) and not stop:
                step_start = time.perf_counter()
                loss, units = self.train_step(batches[self.position])
                self._train_seconds += time.perf_counter() - step_start
                self._train_units += units
                if not math.isfinite(loss):
                    raise DivergenceError(f"training loss is {loss} at step {self.step + 1}; lower "
                                          "optim.lr or set optim.clip_norm")
                self.step += 1
                self.position += 1
                self.window_loss += loss
                self.window_steps += 1
                window_units += units
                if self.step % train_config.log_every == 0 or self.step == total:
                    speed = window_units / max(1e-9, time.perf_counter() - window_start)
                    mean = self.window_loss / self.window_steps
                    board = self.logger.board
                    norm = {"grad_norm": self._grad_norm()} if board is not None and board.active else {}
                    self.logger.log(step=self.step, epoch=self.epoch, split="train", loss=mean,
                                    lr=self.optimizer.param_groups[0]["lr"], **{speed_key: round(speed, 1)},
                                    elapsed_s=self._elapsed(), **norm)
                    bar.update(self.step, loss=mean, speed=speed)
                    self.window_loss, self.window_steps, window_units = 0.0, 0, 0
                    window_start = time.perf_counter()
                if self.position == len(batches):
                    self.epoch, self.position = self.epoch + 1, 0
                stop = self.step >= total
                end_of_epoch = self.position == 0
                if (train_config.eval_every and self.step % train_config.eval_every == 0) or \
                        (not train_config.eval_every and end_of_epoch) or stop:
                    stop = self._evaluate_and_checkpoint() or stop
                if end_of_epoch:
                    break

    def _grad_norm(self) -> float:
        """The L2 norm of the last step's gradients as applied (after clipping; TensorBoard's ``train/grad_norm``)."""
        norms = [p.grad.detach().float().norm() for p in self.model.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0

    def _finish(self) -> dict:
        """Reload the best checkpoint's weights and evaluate them on the test split."""
        best = self.out_dir / "best.safetensors"
        if best.exists():
            load_weights(self.eval_model, load_checkpoint(best))
        summary: dict[str, object] = {"best_dev": self.best_metric, "best_step": self.best_step, "steps": self.step,
                   "epochs": round(self.epoch + self.position / max(1, len(self.sampler)), 3),
                   "metric": self.cfg.train.metric, "out_dir": str(self.out_dir),
                   "parameters": parameter_counts(self.model)}
        if self._train_seconds > 0:  # this session's training steps (evaluation time excluded)
            summary[f"{self.task.unit}_per_s"] = round(self._train_units / self._train_seconds, 1)
        if self.task.data_summary():
            summary["data"] = self.task.data_summary()
        if self.task.has_split("test"):
            test = self.evaluate("test")
            summary["test"] = test
            outputs = self.task.item_outputs("test")
            if outputs is not None and self.dist.is_main:  # what the run was scored on, for paired tests
                name, content = outputs
                atomic_write(self.out_dir / name, [content])
            self.logger.log(step=self.best_step or self.step, epoch=self.epoch, split="test", **test,
                            elapsed_s=self._elapsed())
        summary["wall_s"] = self._elapsed()
        return summary


def _refuse_another_run(command: RunConfig, saved: dict, path: Path) -> None:
    """Refuse (:class:`ConfigError`) to resume the run of checkpoint ``path``, whose configuration is ``saved``,
    with a command whose configuration ``command`` differs from it outside the ``train`` section."""
    try:
        checkpoint = from_dict(RunConfig, {**saved, "train": {}}).to_dict()
    except ConfigError:  # Trainer.resume says so, naming the checkpoint
        return
    wanted = command.to_dict()
    changed = [f"{section}.{key} ({checkpoint[section].get(key)!r} in the checkpoint, {value!r} here)"
               for section, values in wanted.items() if section != "train"
               for key, value in values.items() if checkpoint.get(section, {}).get(key) != value]
    if changed:
        raise ConfigError(f"--resume {path} continues a run of another configuration than this command's: "
                          f"{'; '.join(changed[:4])}{'; …' if len(changed) > 4 else ''}; continue it with "
                          f"`maskattn train --resume {path}` alone, or drop --resume to start a new run")


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Parameters of ``model``: ``total``, ``trainable``, and ``without_embeddings`` — everything but the word
    embedding tables (what MTSA Table 1's |θ| counts)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    params = list(model.parameters())
    return {"total": sum(p.numel() for p in params),
            "trainable": sum(p.numel() for p in params if p.requires_grad),
            "without_embeddings": sum(p.numel() for p in params if id(p) not in embeddings)}


def build_ema(model: nn.Module, decay: float) -> AveragedModel | None:
    """The exponential moving average of ``model``'s parameters (Polyak averaging; ``torch.optim.swa_utils``):
    after every optimiser step ``ema ← decay · ema + (1 − decay) · θ``, starting from the first step's
    weights. ``decay`` 0: none. Buffers are copied, not averaged (they are constant tables here)."""
    if decay == 0.0:  # the section's rule has checked it (train.ema_decay in [0, 1))
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(float(decay)), use_buffers=False)
