"""Training throughput of the four Seq2Seq architectures on the same Multi30k batches (target tokens per second).

For each architecture of ``--architectures`` the run configuration of the preset ``multi30k-<architecture>`` (or
``-gpu`` with ``--gpu-presets``) is loaded with ``data.dir = --data``; every architecture gets the same subword model
and the same first ``--steps`` token batches of epoch 0 (the batch order depends only on the seed). One measured
step is what the trainer does: forward, label-smoothed loss, backward, gradient clipping, Adam step. The
architectures are timed in turn, round by round (``--rounds``), so that a change of machine load affects all
of them alike; the figure per architecture is the median over rounds of (target tokens / wall time of the round).

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

ARCHITECTURES = ("transformer", "man", "csan", "mtsa-encoder")


def build(architecture: str, args) -> tuple[TranslationTask, torch.optim.Optimizer]:
    name = f"multi30k-{architecture}" + ("-gpu" if args.gpu_presets else "")
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
    parser.add_argument("--architectures", default=",".join(ARCHITECTURES))
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per architecture and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = PyTorch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gpu-presets", action="store_true", help="use the multi30k-<preset>-gpu presets (AMP)")
    parser.add_argument("--out", default="bench_translation.json")
    args = parser.parse_args()
    architectures = args.architectures.split(",")
    if unknown := sorted(set(architectures) - set(ARCHITECTURES)):
        parser.error(f"unknown architectures {unknown}; expected some of {', '.join(ARCHITECTURES)}")
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)

    runs = {architecture: build(architecture, args) for architecture in architectures}
    first = runs[architectures[0]][0]
    batches = first.sampler.batches(0)[: args.steps + 1]
    amp = first.cfg.train.amp and first.device.type == "cuda"
    amp_dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if amp else None
    for task, optimizer in runs.values():  # warm-up: one step each
        train_steps(task, optimizer, batches[:1], amp_dtype)
    rates: dict[str, list[float]] = {architecture: [] for architecture in architectures}
    for _ in range(args.rounds):
        for architecture in architectures:
            task, optimizer = runs[architecture]
            start = time.perf_counter()
            tokens = train_steps(task, optimizer, batches[1:], amp_dtype)
            rates[architecture].append(tokens / (time.perf_counter() - start))

    base = statistics.median(rates[architectures[0]])
    rows = []
    for architecture in architectures:
        task = runs[architecture][0]
        rate = statistics.median(rates[architecture])
        rows.append({"architecture": architecture, "tokens_per_s": round(rate, 1),
                     "relative": round(rate / base, 3), "rounds": [round(r, 1) for r in rates[architecture]],
                     "parameters": sum(p.numel() for p in task.model.parameters())})
    result = {"machine": machine_info(first.device), "settings": vars(args), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"| architecture | parameters | target tokens/s | relative to {architectures[0]} |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['architecture']} | {row['parameters'] / 1e6:.2f} M | {row['tokens_per_s']:.0f} | {row['relative']:.2f} |")


if __name__ == "__main__":
    main()
