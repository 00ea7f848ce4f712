"""Dev metric of two grid cells at the same training steps: does a change of setting (here: CPU bfloat16 autocast,
issue 45) move what the runs reach at a fixed budget beyond the spread of the seeds?

Each CELL is a grid cell folder holding ``seed*/metrics.jsonl`` (runs still training count with the evaluations they
have logged). For every step in ``--steps``, the dev metric of each cell's runs at that step: mean ± sample standard
deviation, the difference of the means and Welch's t-test (scipy.stats) where both cells have two runs or more.
Comparable only where the learning-rate schedule does not depend on the run's length (constant, inverse_sqrt, warmup
with the same warm-up) and the runs share every other setting.

    python benchmarks/dev_at_steps.py --metric rouge --steps 500,1000,1500,2000 \\
        benchmarks/results/gigaword/grid/architecture=transformer \\
        benchmarks/results/gigaword_convergence/architecture=transformer
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from scipy import stats

from maskattn.train import read_metrics


def dev_values(cell: Path, metric: str, step: int) -> list[float]:
    """The dev ``metric`` at ``step`` of every run of ``cell`` that has evaluated there."""
    values = []
    for log in sorted(cell.glob("seed*/metrics.jsonl")):
        rows = [r for r in read_metrics(log) if r.get("split") == "dev" and r.get("step") == step and metric in r]
        if rows:
            values.append(float(rows[-1][metric]))
    return values


def spread(values: list[float]) -> str:
    if not values:
        return "—"
    std = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.2f}{std} ({len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs=2, type=Path, metavar="CELL")
    parser.add_argument("--metric", required=True, help="a dev metric of the runs' metrics.jsonl (rouge, accuracy, …)")
    parser.add_argument("--steps", required=True, help="comma-separated steps")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the metric (100: accuracy in %%)")
    args = parser.parse_args()
    for cell in args.cells:
        if not any(cell.glob("seed*/metrics.jsonl")):
            parser.error(f"{cell} holds no seed*/metrics.jsonl: not a grid cell folder")
    a_name, b_name = (str(c) for c in args.cells)
    print(f"A = {a_name}\nB = {b_name}\n")
    print(f"| step | A: dev {args.metric} (runs) | B: dev {args.metric} (runs) | B − A | Welch p |")
    print("|---:|---:|---:|---:|---:|")
    for step in (int(s) for s in args.steps.split(",")):
        a, b = ([v * args.scale for v in dev_values(cell, args.metric, step)] for cell in args.cells)
        difference = f"{statistics.mean(b) - statistics.mean(a):+.2f}" if a and b else "—"
        p = "—"
        if len(a) > 1 and len(b) > 1:
            p_value = float(stats.ttest_ind(b, a, equal_var=False).pvalue)
            p = f"{p_value:.2f}" if math.isfinite(p_value) else "—"
        print(f"| {step:,} | {spread(a)} | {spread(b)} | {difference} | {p} |")


if __name__ == "__main__":
    main()
