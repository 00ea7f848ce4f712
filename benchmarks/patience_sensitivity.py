"""How much of a grid's comparison is its stopping rule: the same runs stopped by ``train.patience`` P and continued
with a longer patience (``benchmarks/grids/snli_convergence_patience6.sh``), compared cell against cell under both.

GRID is a grid of classifier runs (``<cell>/seed<N>/``), LONGER the folder of its continued runs (the same layout;
a run missing there — one that reached the step cap — counts with its GRID record). For every run: where it stopped,
its best dev accuracy and its test accuracy under both rules; for every pair of cells under each rule: the
difference of the mean test accuracies with Welch's t over the seeds, and per seed pair the paired bootstrap over
the test items from the runs' ``test.pred.jsonl`` (:mod:`maskattn.grid.compare`, as ``maskattn grid compare``).

    python benchmarks/patience_sensitivity.py benchmarks/results/snli_convergence \\
        benchmarks/results/snli_convergence_patience6 mtsa bilstm mha
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from maskattn.metrics.test_outputs import PREDICTIONS, read_predictions
from maskattn.grid.compare import label_statistics, p_text, paired_bootstrap, welch


def run_record(grid: Path, longer: Path, cell: str, seed: int) -> tuple[dict, dict, Path]:
    """The run's summary under the grid's rule and under the longer patience, and the folder of the latter."""
    short = grid / cell / f"seed{seed}"
    continued = longer / cell / f"seed{seed}"
    if not (continued / "summary.json").is_file():
        continued = short
    return (json.loads((short / "summary.json").read_text()), json.loads((continued / "summary.json").read_text()),
            continued)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grid", type=Path)
    parser.add_argument("longer", type=Path)
    parser.add_argument("cells", nargs="+")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--samples", type=int, default=1000)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]

    print("| run | stopped at (epochs): short → longer patience | best dev (step) | test accuracy |")
    print("|---|---|---|---|")
    tests: dict[str, dict[str, list[float]]] = {"short": {}, "longer": {}}
    folders: dict[tuple[str, int], Path] = {}
    for cell in args.cells:
        for seed in seeds:
            a, b, folder = run_record(args.grid, args.longer, cell, seed)
            folders[cell, seed] = folder
            tests["short"].setdefault(cell, []).append(100 * a["test"]["accuracy"])
            tests["longer"].setdefault(cell, []).append(100 * b["test"]["accuracy"])
            print(f"| {cell} seed {seed} | {a['steps']:,} ({a['epochs']:.1f}) → {b['steps']:,} ({b['epochs']:.1f}) | "
                  f"{100 * a['best_dev']:.2f} ({a['best_step']:,}) → {100 * b['best_dev']:.2f} ({b['best_step']:,}) | "
                  f"{100 * a['test']['accuracy']:.2f} → {100 * b['test']['accuracy']:.2f} |")
    print()
    for rule, values in tests.items():
        print(f"{rule} patience: " + ", ".join(f"{cell} {statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}"
                                              for cell, v in values.items()))
    print("\n| A − B | short patience: Δ, Welch p | longer patience: Δ, Welch p | longer, paired bootstrap Δ (p) per "
          "seed |")
    print("|---|---|---|---|")
    for i, a in enumerate(args.cells):
        for b in args.cells[i + 1:]:
            short = welch(tests["short"][a], tests["short"][b])
            longer = welch(tests["longer"][a], tests["longer"][b])
            pairs = []
            for seed in seeds:
                (stats_a, score), (stats_b, _) = (label_statistics(read_predictions(folders[c, seed] / PREDICTIONS),
                                                                   "accuracy") for c in (a, b))
                for cell, rows in ((a, stats_a), (b, stats_b)):  # the file is what the run was scored on
                    assert abs(score(rows.sum(0)) - tests["longer"][cell][seeds.index(seed)]) < 1e-9, (cell, seed)
                result = paired_bootstrap(stats_a, stats_b, score, samples=args.samples)
                pairs.append(f"{result.difference:+.2f} ({p_text(result)})")
            print(f"| {a} − {b} | {short.difference:+.2f}, {short.p:.3g} | {longer.difference:+.2f}, {longer.p:.3g} | "
                  f"{' / '.join(pairs)} |")


if __name__ == "__main__":
    main()
