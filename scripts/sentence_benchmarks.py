"""Train MTSA and the context-fusion baselines on sentence-classification data sets over several seeds and
write mean ± std test accuracy (the measurements behind docs/results.md).

    python scripts/sentence_benchmarks.py --data-root ../shared/data --datasets trec,sst5 \\
        --models mtsa,mha,bilstm,multi_cnn,disa --seeds 0,1,2 --out runs/bench

Every run goes through the toolkit (``maskattn.train.Trainer``) with the preset of its data set
(``src/maskattn/configs/<dataset>.yaml``), the model overrides of MODELS below and ``--set`` overrides for all runs;
results are appended to ``<out>/results.jsonl``. A model's own overrides come after ``--set`` and win (a
note names each ``--set`` they replace): ``--set model.encoder=...`` does not change ``mtsa``. Each run is
claimed first (``<run_dir>/.claimed``), so several copies of the script can share the grid and a restarted
script skips claimed runs (delete the claim file of a run that was interrupted to redo it).
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
    # Kim (2014) CNN-rand, model and training protocol: 300-d word vectors U(-0.25, 0.25), 3/4/5-gram filters x 100,
    # ReLU, max-over-time pooling, dropout 0.5 on the penultimate layer only, softmax; Adadelta (rho 0.95,
    # eps 1e-6), batch 50, 25 epochs, test accuracy of the best dev epoch. Not reproduced: Kim's max-norm 3
    # constraint on the output weights. These overrides replace any --set of the same keys.
    "cnn_rand": ["model.encoder=multi_cnn", "model.encoder_options={channels: 100}", "model.d_model=300",
                 "model.embed_init=0.25", "model.pool=max", "model.mlp_layers=0", "model.dropout=0.5",
                 "model.embed_dropout=0.0", "optim.name=adadelta", "optim.lr=1.0", "optim.rho=0.95", "optim.eps=1e-6",
                 "optim.weight_decay=0.0", "train.batch_size=50", "train.max_steps=0", "train.max_epochs=25",
                 "train.eval_every=0", "train.patience=0"],
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

    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; models: {', '.join(MODELS)}")
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
                warn_replaced(args.set, MODELS[model], model)
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


def warn_replaced(common: list[str], per_model: list[str], model: str) -> None:
    """Say which ``--set`` overrides the model's own overrides replace (they come later, so they win)."""
    own = {item.split("=", 1)[0]: item for item in per_model}
    for item in common:
        key = item.split("=", 1)[0]
        if key in own and own[key] != item:
            print(f"note: for {model}, --set {item} is replaced by {own[key]}", flush=True)


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
