"""Train MTSA and the context-fusion baselines on sentence-classification data sets over several seeds and
write mean ± std test accuracy (the measurements behind docs/results.md).

    python scripts/sentence_benchmarks.py --data-root ../shared/data --datasets trec,sst5 \\
        --models mtsa,mha,bilstm,multi_cnn,disa --seeds 0,1,2 --out runs/bench

Every run goes through the toolkit (``maskattn.train.Trainer``) with the preset of its data set
(``src/maskattn/configs/<dataset>.yaml``), the model overrides of MODELS below and ``--set`` overrides for all runs;
results are appended to ``<out>/results.jsonl``. Each run is claimed first (``<run_dir>/.claimed``), so
several copies of the script can share the grid and a restarted script skips claimed runs (delete the
claim file of a run that was interrupted to redo it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from maskattn.train import Trainer, load_config, preset_path

# model name -> config overrides (the same embeddings, width, optimiser and budget for every model)
MODELS = {
    "mtsa": ["model.encoder=mtsa", "model.ffn=false", "model.positional=none"],
    "mha": ["model.encoder=mha", "model.ffn=false", "model.positional=sinusoidal"],
    "bilstm": ["model.encoder=bilstm", "model.encoder_options={hidden: 150}"],
    "multi_cnn": ["model.encoder=multi_cnn", "model.encoder_options={channels: 100}"],
    "disa": ["model.encoder=disa", "model.ffn=false", "model.positional=none", "model.num_heads=2"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", required=True, help="folder holding one sub-folder per data set")
    parser.add_argument("--datasets", default="trec,sst5")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--set", action="append", default=[],
                        help="override for every run (before the per-model overrides): section.key=value")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    for dataset in args.datasets.split(","):
        for model in args.models.split(","):
            for seed in map(int, args.seeds.split(",")):
                run_dir = out / dataset / model / f"seed{seed}"
                if not claim(run_dir):  # finished, or taken by another copy of this script running in parallel
                    continue
                overrides = [f"data.dir={Path(args.data_root) / dataset}", f"train.seed={seed}",
                             f"train.out_dir={run_dir}", "train.progress=false", *args.set, *MODELS[model]]
                cfg = load_config(preset_path(dataset), overrides)
                start = time.perf_counter()
                summary = Trainer(cfg).fit()
                row = {"dataset": dataset, "model": model, "seed": seed, "test_accuracy": summary["test"]["accuracy"],
                       "best_dev": summary["best_dev"], "best_step": summary["best_step"], "steps": summary["steps"],
                       "seconds": round(time.perf_counter() - start, 1), "overrides": overrides}
                print(json.dumps(row), flush=True)
                with results_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    summarize(results_path)


def claim(run_dir: Path) -> bool:
    """Atomically claim a run (``<run_dir>/.claimed``); False when it was claimed before."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        (run_dir / ".claimed").open("x").close()
    except FileExistsError:
        return False
    return True


def summarize(results_path: Path) -> None:
    """Print a markdown table of mean ± std test accuracy (in %) per data set and model."""
    rows = [json.loads(line) for line in results_path.open()]
    datasets = sorted({r["dataset"] for r in rows})
    print("| model | " + " | ".join(datasets) + " |")
    print("|---|" + "---:|" * len(datasets))
    for model in dict.fromkeys(r["model"] for r in rows):
        cells = []
        for dataset in datasets:
            acc = [100 * r["test_accuracy"] for r in rows if r["model"] == model and r["dataset"] == dataset]
            cells.append(f"{statistics.mean(acc):.1f} ± {statistics.stdev(acc):.1f} (n={len(acc)})" if len(acc) > 1
                         else (f"{acc[0]:.1f} (n=1)" if acc else "–"))
        print(f"| {model} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
