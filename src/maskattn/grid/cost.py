"""What the cells of a grid cost, measured side by side on one machine (``maskattn grid cost``): MTSA Table 1's
efficiency columns — parameters without the word embeddings, training time per epoch, inference time, memory of a
training step — for any grid.

For every cell (its first run's configuration) the task and model are built as ``maskattn train`` builds them, and

* **training time per epoch**: the trainer's step (forward, loss, backward, gradient clipping, optimiser step) on
  the first ``steps`` batches of epoch 0 — the same batches for every cell of a grid, since the batch order depends
  on the seed and the data alone — after ``warmup`` untimed steps; cells are timed in turn, round after round, so
  that a change of machine load touches all of them alike; the median round's time per step × the batches of an
  epoch;
* **inference time**: one pass of evaluation over the test split (``train.eval_batch_size``), median over rounds;
* **peak memory**: the bytes PyTorch allocates during one training step (:func:`maskattn.bench.measure.
  peak_memory_bytes`: activations, gradients, temporaries; not the parameters and optimiser state that exist
  before it) on a synthetic batch of ``memory_batch`` inputs of ``memory_length`` tokens each (MTSA Table 1: 64 × 64;
  both sentences of a pair that long); a translation model is measured on its first real batch.

The figures are written to ``<grid>/cost.json``, which ``maskattn grid table`` shows beside the accuracies.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

from ..bench.measure import machine_info, peak_memory_bytes, synchronize
from ..data.batching import collate
from ..device import resolve_device
from ..errors import ArgumentError
from ..metrics import summed_loss
from ..train.acceleration import autocast_dtype
from ..train.optim import build_optimizer, optimizer_step
from ..train.resumable import write_json
from ..train.tasks import Task, build_task
from ..train.trainer import parameter_counts, seed_everything
from .records import COST_FILE
from .spec import Grid, GridRun
from .table import bytes_text, count_text, seconds_text

__all__ = ["measure_costs", "cost_table"]


class _Cell:
    """A cell's task, model and optimiser, built once and timed in every round."""

    def __init__(self, grid: Grid, run: GridRun, extra: list[str]):
        self.run = run
        self.cfg = grid.config(run, extra)
        seed_everything(self.cfg.train.seed)
        self.device = resolve_device(self.cfg.train.device)
        self.task: Task = build_task(self.cfg, self.device)
        self.model = self.task.model.to(self.device)
        self.optimizer = build_optimizer(self.cfg.optim, self.model)
        self.amp_dtype = autocast_dtype(self.cfg.train.amp, self.device)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None

    def train_steps(self, batches: list[list[int]]) -> int:
        """The trainer's step on each batch (:meth:`Trainer.train_step` without its bookkeeping: mixed precision,
        loss, backward, clipping, optimiser step); returns the throughput units (examples or target tokens)."""
        self.model.train()
        units = 0
        for indices in batches:
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                loss = self.task.loss_sum(self.model, indices) / self.task.loss_terms(indices)
            optimizer_step(loss, self.optimizer, self.model, clip_norm=self.cfg.optim.clip_norm, scaler=self.scaler)
            units += self.task.throughput_units(indices)
        synchronize(self.device)
        return units

    def memory_step(self, batch: int, length: int) -> Callable[[], None]:
        """One training step on the synthetic batch of the module docstring (a translation model: its first real
        batch)."""
        model_type = self.cfg.model.type
        if model_type == "seq2seq":
            first = self.task.sampler.batches(0)[0]

            def real_step() -> None:
                self.train_steps([first])
            return real_step
        generator = torch.Generator().manual_seed(0)
        vocab = len(getattr(self.task, "vocab", [])) or 100

        def ids() -> list[int]:
            return torch.randint(2, vocab, (length,), generator=generator).tolist()

        items = [{"premise": ids(), "hypothesis": ids(), "label": 0} if model_type == "pair"
                 else {"tokens": ids(), "label": [0] * length if model_type == "tagger" else 0} for _ in range(batch)]
        synthetic = collate(items).to(self.device)

        def step() -> None:
            self.model.train()
            loss = summed_loss(self.model(**synthetic.inputs), synthetic.targets) / synthetic.count
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        return step


def measure_costs(grid: Grid, *, steps: int = 20, warmup: int = 2, rounds: int = 3, memory_batch: int = 64,
                  memory_length: int = 64, inference: bool = True, extra: list[str] | None = None,
                  say: Callable[[str], None] = print) -> dict:
    """Measure every cell of ``grid`` (module docstring) and write ``<grid>/cost.json``; returns its content.
    ``extra``: overrides for the measurement (e.g. ``train.eval_batch_size=128``)."""
    for name, value, low in (("steps", steps, 1), ("rounds", rounds, 1), ("warmup", warmup, 0),
                             ("memory batch", memory_batch, 1), ("memory length", memory_length, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ArgumentError(f"{name} must be an int >= {low}, got {value!r}")
    previous = os.getcwd()
    os.chdir(grid.cwd)  # the runs' relative paths (data.dir, data.vectors) mean the grid's working directory
    try:
        return _measure(grid, steps=steps, warmup=warmup, rounds=rounds, memory_batch=memory_batch,
                        memory_length=memory_length, inference=inference, extra=list(extra or []), say=say)
    finally:
        os.chdir(previous)


def _measure(grid: Grid, *, steps: int, warmup: int, rounds: int, memory_batch: int, memory_length: int,
             inference: bool, extra: list[str], say: Callable[[str], None]) -> dict:
    first_runs = list({run.cell: run for run in reversed(grid.runs)}.values())[::-1]
    cells = []
    for run in first_runs:
        say(f"building {run.cell or '(base)'} ({run.name})")
        cells.append(_Cell(grid, run, extra))
    timed: dict[str, list[list[int]]] = {}  # the same batches for every cell with the same data and batch size
    results: dict[str, dict] = {}
    for cell in cells:
        batches = cell.task.sampler.batches(0)
        cell.train_steps(batches[:warmup])
        timed[cell.run.cell] = batches[warmup:warmup + steps]
        results[cell.run.cell] = {"run": cell.run.name, "parameters": parameter_counts(cell.model),
                                  "batches_per_epoch": len(cell.task.sampler), "timed_steps": len(timed[cell.run.cell]),
                                  "step_s": [], "units_per_s_rounds": [], "inference_s_rounds": []}
    for round_ in range(rounds):
        for cell in cells:
            result = results[cell.run.cell]
            batches = timed[cell.run.cell]
            start = time.perf_counter()
            units = cell.train_steps(batches)
            seconds = time.perf_counter() - start
            result["step_s"].append(seconds / len(batches))
            result["units_per_s_rounds"].append(units / seconds)
            if inference and cell.task.has_split("test"):
                start = time.perf_counter()
                cell.task.evaluate(cell.model, "test")
                result["inference_s_rounds"].append(time.perf_counter() - start)
        say(f"round {round_ + 1} of {rounds} measured")
    for cell in cells:
        result = results[cell.run.cell]
        result["epoch_s"] = statistics.median(result["step_s"]) * result["batches_per_epoch"]
        result[f"{cell.task.unit}_per_s"] = statistics.median(result["units_per_s_rounds"])
        if result["inference_s_rounds"]:
            result["inference_s"] = statistics.median(result["inference_s_rounds"])
        result["peak_memory_bytes"] = peak_memory_bytes(cell.memory_step(memory_batch, memory_length), cell.device)
    report = {"machine": machine_info(cells[0].device),
              "settings": {"steps": steps, "warmup": warmup, "rounds": rounds, "memory_batch": memory_batch,
                           "memory_length": memory_length, "extra": extra,
                           "batch": (f"batches of at most {cells[0].cfg.data.max_tokens} tokens"
                                     if cells[0].cfg.model.type == "seq2seq" else f"batch {cells[0].cfg.train.batch_size}"),
                           "eval_batch_size": cells[0].cfg.train.eval_batch_size},
              "cells": results}
    write_json(grid.folder / COST_FILE, report)
    return report


def cost_table(report: dict) -> str:
    """The Markdown table of a :func:`measure_costs` report (training speed also relative to the first cell)."""
    settings = report["settings"]
    cells = report["cells"]
    speeds = {cell: next((v, k.removesuffix("_per_s")) for k, v in result.items()
                         if k.endswith("_per_s") and k != "units_per_s_rounds") for cell, result in cells.items()}
    first = next(iter(speeds.values()))[0]
    lines = ["| cell | parameters (without embeddings) | training time / epoch | training speed (× the first row) | "
             "inference (test set) | peak memory (training step) |", "|---|---:|---:|---:|---:|---:|"]
    for cell, result in cells.items():
        speed, unit = speeds[cell]
        lines.append(f"| {cell or '(base)'} | {count_text(result['parameters']['without_embeddings'])} | "
                     f"{seconds_text(result['epoch_s'])} | {speed:,.0f} {unit}/s ({speed / first:.2f}) | "
                     + (seconds_text(result["inference_s"]) if "inference_s" in result else "–")
                     + f" | {bytes_text(result['peak_memory_bytes'])} |")
    lines += ["", f"Training: {settings['batch']}, the median of {settings['rounds']} rounds of "
                  f"{settings['steps']} steps (after {settings['warmup']} untimed) × the batches of an epoch; inference: "
                  f"one pass over the test split, batch {settings['eval_batch_size']}; memory: one training step on "
                  f"{settings['memory_batch']} inputs of {settings['memory_length']} tokens; "
                  f"{report['machine'].get('threads')} thread(s), torch {report['machine'].get('torch')}, "
                  f"{report['machine'].get('device')}."]
    return "\n".join(lines)
