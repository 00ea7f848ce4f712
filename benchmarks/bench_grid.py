"""What `maskattn grid run` costs next to `maskattn train`, and whether parallel runs hold their throughput.

Issue 34's two speed questions, timed with the commands a user types:

1. *The grid adds no overhead to a single run*: the same run (a preset, a fixed number of steps, one thread) as
   ``maskattn train`` and as a one-run ``maskattn grid run``, alternated ``--rounds`` times so that a change of
   machine load falls on both alike; the wall time of each process and the training examples/s of its run.
2. *N parallel runs with a thread budget each do not collapse*: grids of two runs two at a time with one thread
   each, of one run with two threads and of one run with one thread; examples/s per run.

Every process is timed from its start to its exit (interpreter start and imports included); the 1-minute load
average before and after each is recorded, since on a shared machine it moves a short run more than the grid's
start-up does. One JSON line per process goes to ``--out``.

    python benchmarks/bench_grid.py --data ../shared/data/trec --out benchmarks/results/glove/grid_overhead.jsonl

The figures in docs/results.md ("The grid itself") were measured with TREC, MTSA at d_model 300, 300 steps (the
defaults below). Each process trains in a fresh folder under ``--work`` (deleted afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

SETTINGS = ["model.d_model=300", "model.num_heads=4", "train.keep_last=false"]


def _sets(settings: list[str]) -> list[str]:
    return [arg for s in settings for arg in ("--set", s)]


def _timed(command: list[str], stdout: Path, stderr: Path) -> tuple[float, int, float, float]:
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with stdout.open("wb") as out, stderr.open("wb") as err:
        code = subprocess.run(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL).returncode
    return time.perf_counter() - start, code, load_before, os.getloadavg()[0]


def _speeds(folder: Path, stdout: Path) -> list[float]:
    """Training examples/s of every run: the summary.json of each grid run under ``folder``, or the summary that
    ``maskattn train`` prints (a JSON object, the end of its standard output)."""
    summaries = [json.loads(p.read_text()) for p in sorted(folder.rglob("summary.json"))]
    if not summaries:
        text = stdout.read_text(errors="replace")
        summaries = [json.loads(text[text.rindex("\n{") + 1 if "\n{" in text else text.index("{"):])]
    return [s["examples_per_s"] for s in summaries]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the data folder of --preset")
    parser.add_argument("--preset", default="trec")
    parser.add_argument("--steps", type=int, default=300, help="training steps of every run")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of train and one-run grid")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        help="more section.key=value settings for every run (repeatable)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=Path("grid_overhead.jsonl"))
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1")
    settings = _sets([*SETTINGS, f"train.max_steps={args.steps}", *args.settings])
    work = Path(tempfile.mkdtemp(prefix="bench_grid_", dir=args.work))
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def record(kind: str, i: int, folder: Path, command: list[str]) -> None:
        stdout, stderr = work / "stdout.txt", work / "stderr.txt"
        wall, code, before, after = _timed(command, stdout, stderr)
        tail = "" if code == 0 else stderr.read_text(errors="replace")[-2000:]
        row = {"kind": kind, "i": i, "wall_s": round(wall, 2), "rc": code, "load_before": before,
               "load_after": after, "tail": tail,
               "examples_per_s": _speeds(folder, stdout) if code == 0 else []}
        with args.out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{kind:>24} #{i}: {wall:7.1f} s, exit {code}, examples/s {row['examples_per_s']}, "
              f"load {before:.1f} -> {after:.1f}")
        shutil.rmtree(folder, ignore_errors=True)

    base = ["--preset", args.preset, "--data", str(args.data)]
    try:
        for i in range(args.rounds):
            folder = work / f"train{i}"
            record("train", i, folder, ["maskattn", "train", *base, "--out", str(folder), "--no-progress",
                                        *settings, "--set", "train.num_threads=1"])
            folder = work / f"grid{i}"
            record("grid", i, folder, ["maskattn", "grid", "run", *base, "--out", str(folder), *settings,
                                       "--threads", "1"])
        for jobs, threads, seeds in ((2, 1, "0-1"), (1, 2, "0"), (1, 1, "0")):
            folder = work / f"grid-j{jobs}-t{threads}"
            record(f"grid jobs={jobs} threads={threads}", 0, folder,
                   ["maskattn", "grid", "run", *base, "--out", str(folder), *settings, "--seeds", seeds,
                    "--jobs", str(jobs), "--threads", str(threads)])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
