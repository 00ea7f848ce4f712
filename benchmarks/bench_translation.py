"""Training throughput of the four Seq2Seq presets on the same Multi30k batches (target tokens per second).

For each preset of ``--presets`` the run configuration of ``multi30k-<preset>`` (or ``-gpu`` with
``--gpu-presets``) is loaded with ``data.dir = --data``; every preset gets the same subword model and the
same first ``--steps`` token batches of epoch 0 (the batch order depends only on the seed). One measured
step is what the trainer does: forward, label-smoothed loss, backward, gradient clipping, Adam step. The
presets are timed in turn, round by round (``--rounds``), so that a change of machine load affects all of
them alike; the figure per preset is the median over rounds of (target tokens / wall time of the round).

    python benchmarks/bench_translation.py --data ../shared/data/multi30k --threads 2 \\
        --out benchmarks/results/bench_translation_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from maskattn.bench import machine_info
from maskattn.bench.measure import synchronize
from maskattn.train import load_config, preset_path
from maskattn.train.optim import build_optimizer
from maskattn.train.tasks import TranslationTask
from maskattn.train.trainer import resolve_device, seed_everything

PRESETS = ("transformer", "man", "csan", "mtsa-encoder")


def build(preset: str, args) -> tuple[TranslationTask, torch.optim.Optimizer]:
    name = f"multi30k-{preset}" + ("-gpu" if args.gpu_presets else "")
    cfg = load_config(preset_path(name), [f"data.dir={args.data}", f"train.device={args.device}"])
    seed_everything(cfg.train.seed)
    task = TranslationTask(cfg, resolve_device(args.device))
    task.model.to(task.device)
    return task, build_optimizer(cfg.optim, task.model)


def train_steps(task: TranslationTask, optimizer, batches: list[list[int]], amp_dtype) -> int:
    """The trainer's step on each batch; returns the number of target tokens."""
    model, clip = task.model, task.cfg.optim.clip_norm
    model.train()
    tokens = 0
    for indices in batches:
        with torch.autocast(task.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = task.loss_sum(model, indices) / task.loss_terms(indices)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        tokens += task.throughput_units(indices)
    synchronize(task.device)
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the Multi30k folder (train/val/test_2016_flickr .en/.de)")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per preset and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = PyTorch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gpu-presets", action="store_true", help="use the multi30k-<preset>-gpu presets (AMP)")
    parser.add_argument("--out", default="bench_translation.json")
    args = parser.parse_args()
    presets = args.presets.split(",")
    if unknown := sorted(set(presets) - set(PRESETS)):
        parser.error(f"unknown presets {unknown}; expected some of {', '.join(PRESETS)}")
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)

    runs = {preset: build(preset, args) for preset in presets}
    first = runs[presets[0]][0]
    batches = first.sampler.batches(0)[: args.steps + 1]
    amp = first.cfg.train.amp and first.device.type == "cuda"
    amp_dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if amp else None
    for task, optimizer in runs.values():  # warm-up: one step each
        train_steps(task, optimizer, batches[:1], amp_dtype)
    rates: dict[str, list[float]] = {preset: [] for preset in presets}
    for _ in range(args.rounds):
        for preset in presets:
            task, optimizer = runs[preset]
            start = time.perf_counter()
            tokens = train_steps(task, optimizer, batches[1:], amp_dtype)
            rates[preset].append(tokens / (time.perf_counter() - start))

    base = statistics.median(rates[presets[0]])
    rows = []
    for preset in presets:
        task = runs[preset][0]
        rate = statistics.median(rates[preset])
        rows.append({"preset": preset, "encoder": task.cfg.model.preset, "tokens_per_s": round(rate, 1),
                     "relative": round(rate / base, 3), "rounds": [round(r, 1) for r in rates[preset]],
                     "parameters": sum(p.numel() for p in task.model.parameters())})
    result = {"machine": machine_info(first.device), "settings": vars(args), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"| preset | parameters | target tokens/s | relative to {presets[0]} |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['preset']} | {row['parameters'] / 1e6:.2f} M | {row['tokens_per_s']:.0f} | {row['relative']:.2f} |")


if __name__ == "__main__":
    main()
