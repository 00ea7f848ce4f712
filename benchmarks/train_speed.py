"""Training speed of a preset on this CPU under each precision / compilation setting (issue 45, step 1).

For each setting — ``fp32`` (eager float32), ``bf16`` (``train.amp=bf16``: CPU bfloat16 autocast), ``compile``
(``train.compile=true``) and ``bf16+compile`` — a fresh process builds the preset's task and model exactly as
``maskattn train`` does (the :class:`~maskattn.train.Trainer` itself, seed 0, one thread) and runs the trainer's
own step (:meth:`Trainer.train_step`: autocast, loss, backward, clipping, optimiser) on the first ``--warmup`` +
``--steps`` batches of epoch 0 — the same batches for every setting. The warm-up steps (compilation included) are
not timed; the timed steps are reported as throughput (target tokens/s for seq2seq presets, examples/s otherwise)
per second of the process's CPU time (one thread: what the steps cost, whatever else runs on the machine — the
figure to compare settings by on a shared machine), per wall-clock second over all of them, and as the median of
``--windows`` equal wall-clock windows.

    python benchmarks/train_speed.py --preset gigaword-transformer --data ../shared/data/gigaword \
        --out benchmarks/results/train_speed/gigaword-transformer.json
    python benchmarks/train_speed.py --preset snli --data ../shared/data/snli --variant bilstm \
        --set data.vectors=../shared/data/glove/glove.6B.50d.txt --set model.embed_dim=50 ...

    python benchmarks/train_speed.py --table benchmarks/results/train_speed/*.json   # the Markdown table

Quality is checked separately, on real runs (docs/results.md, "Faster CPU training").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {"fp32": [], "bf16": ["train.amp=bf16"], "compile": ["train.compile=true"],
            "bf16+compile": ["train.amp=bf16", "train.compile=true"]}


def measure(preset: str, data: str, overrides: list[str], steps: int, warmup: int, windows: int) -> dict:
    """One setting, in this process: build the trainer, warm up, time ``steps`` trainer steps."""
    import torch

    from maskattn.train import Trainer
    from maskattn.train.config import load_config, preset_path

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        cfg = load_config(preset_path(preset), [f"data.dir={data}", f"train.out_dir={folder}/run", "train.seed=0",
                                                "train.num_threads=1", "train.progress=false", *overrides])
        built = time.perf_counter()
        trainer = Trainer(cfg)
        try:
            build_s = time.perf_counter() - built
            batches = trainer.sampler.batches(0)
            if len(batches) < warmup + steps:
                raise SystemExit(f"epoch 0 has {len(batches)} batches: fewer than --warmup + --steps")
            start = time.perf_counter()
            for indices in batches[:warmup]:
                trainer.train_step(indices)
            warmup_s = time.perf_counter() - start
            seconds, cpu_seconds, units = [], [], []
            for indices in batches[warmup:warmup + steps]:
                start, cpu_start = time.perf_counter(), time.process_time()
                units.append(trainer.train_step(indices)[1])
                seconds.append(time.perf_counter() - start)
                cpu_seconds.append(time.process_time() - cpu_start)
        finally:
            trainer.close()
    size = steps // windows
    window_speeds = [sum(units[i:i + size]) / sum(seconds[i:i + size]) for i in range(0, size * windows, size)]
    return {"unit": f"{trainer.task.unit}_per_s", "overall": sum(units) / sum(seconds),
            "per_cpu_s": sum(units) / sum(cpu_seconds),
            "median_window": statistics.median(window_speeds), "windows": window_speeds,
            "step_s_median": statistics.median(seconds), "build_s": build_s, "warmup_s": warmup_s,
            "units": sum(units), "timed_s": sum(seconds), "cpu_s": sum(cpu_seconds)}


def markdown_table(paths: list[Path]) -> str:
    """The rows of the reports ``paths`` as one Markdown table: each setting's throughput per CPU second, its ratio
    to the same row's ``fp32`` and its wall-clock throughput."""
    lines = ["| preset | setting | per CPU second | × fp32 | per second (wall) | warm-up |",
             "|---|---|---:|---:|---:|---:|"]
    for path in paths:
        rows = json.loads(path.read_text())["rows"]
        base = {r["name"]: r["per_cpu_s"] for r in rows if r["setting"] == "fp32"}
        for r in rows:
            unit = r["unit"].removesuffix("_per_s")
            ratio = f"{r['per_cpu_s'] / base[r['name']]:.2f}" if r["name"] in base else "—"
            lines.append(f"| {r['name']} | {r['setting']} | {r['per_cpu_s']:,.0f} {unit} | {ratio} | "
                         f"{r['overall']:,.0f} | {r['warmup_s']:.0f} s |")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--table"]:  # python benchmarks/train_speed.py --table REPORT.json [...]
        print(markdown_table([Path(p) for p in sys.argv[2:]]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--data", required=True, help="the preset's data folder (data.dir)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value (repeat)")
    parser.add_argument("--name", help="the row's name (default: the preset)")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--out", required=True, help="JSON file; rows are added to what it holds")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one setting, print JSON
    args = parser.parse_args()
    if args.one is not None:
        result = measure(args.preset, args.data, [*args.overrides, *SETTINGS[args.one]], args.steps, args.warmup,
                         args.windows)
        print("RESULT " + json.dumps(result))
        return
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in names if s not in SETTINGS]
    if unknown:
        parser.error(f"--settings: unknown {unknown}; expected some of {', '.join(SETTINGS)}")
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {"rows": []}
    row_name = args.name or args.preset
    for setting in names:
        command = [sys.executable, __file__, "--preset", args.preset, "--data", args.data, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--windows", str(args.windows), "--out", args.out, "--one", setting,
                   *[f"--set={o}" for o in args.overrides]]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            raise SystemExit(f"{row_name} {setting}: the measurement failed (exit {done.returncode})")
        result = json.loads(lines[-1][len("RESULT "):])
        report["rows"] = [r for r in report["rows"] if (r["name"], r["setting"]) != (row_name, setting)]
        report["rows"].append({"name": row_name, "preset": args.preset, "overrides": args.overrides,
                               "setting": setting, **result})
        report["machine"] = {"cpu": platform.processor() or platform.machine(), "threads": 1,
                             "steps": args.steps, "warmup": args.warmup}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"{row_name:24s} {setting:14s} {result['per_cpu_s']:9.1f} {result['unit']} per CPU second, "
              f"{result['overall']:.1f} per second (median window {result['median_window']:.1f}; warm-up "
              f"{result['warmup_s']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
