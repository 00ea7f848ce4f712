"""The Gigaword tables of docs/results.md from the data and from finished run folders.

    # LEAD-k baselines and length statistics of the 1,951 test pairs (no model needed)
    python scripts/gigaword_results.py baselines --data ../shared/data/gigaword

    # the runs: one grid, each model's seeds in <grid>/architecture=<model>/seed<k>/
    maskattn grid run --preset gigaword-transformer --data ../shared/data/gigaword --out runs/gigaword \
        --set model.architecture=transformer,man --seeds 0-2 --jobs 2 --threads 1

    # test ROUGE of the finished runs (a run folder needs its summary.json only: the archived copies in
    # benchmarks/results/gigaword/grid/ serve as well as the grid folder)
    python scripts/gigaword_results.py table --runs runs/gigaword --data ../shared/data/gigaword

    # sample outputs: the first N test articles (or --lines), their reference and each model's summary (the lowest
    # seed whose folder still holds best.safetensors)
    python scripts/gigaword_results.py samples --runs runs/gigaword --data ../shared/data/gigaword --n 5

Each prints Markdown on stdout and, with --out, writes the numbers as JSON. Every number comes from the files:
ROUGE by maskattn.metrics.rouge_scores (rouge-score, no stemming), the same code that scores the models.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from maskattn.data.parallel import read_parallel
from maskattn.metrics import lead, rouge_scores

UNK = ["UNK", "<unk>"]


def test_pairs(data: Path):
    return read_parallel(data / "test.src", data / "test.tgt").with_unknown(UNK)


def _stats(lengths: list[int]) -> dict:
    return {"mean": statistics.mean(lengths), "median": statistics.median(lengths), "min": min(lengths),
            "max": max(lengths)}


def baselines(args) -> dict:
    text = test_pairs(args.data)
    ref_words = [len(line.split()) for line in text.target]
    mean_ref = statistics.mean(ref_words)
    k75 = round(0.75 * mean_ref)
    rows = {}
    for name, k in (("LEAD-8", 8), (f"LEAD-{k75} (75 % of the mean reference length)", k75)):
        rows[name] = rouge_scores(lead(text.source, k), text.target)
    result = {"pairs": len(text), "reference_words": _stats(ref_words),
              "article_words": _stats([len(line.split()) for line in text.source]), "baselines": rows}
    print(f"Test pairs: {len(text)}; reference length (words) mean {mean_ref:.2f}, median "
          f"{statistics.median(ref_words)}, min {min(ref_words)}, max {max(ref_words)}; article mean "
          f"{result['article_words']['mean']:.2f} words\n")
    print("| baseline | ROUGE-1 | ROUGE-2 | ROUGE-L |\n|---|---:|---:|---:|")
    for name, s in rows.items():
        print(f"| {name} | " + " | ".join(f"{s[t]:.2f} [{s[t + '_low']:.2f}, {s[t + '_high']:.2f}]"
                                       for t in ("rouge1", "rouge2", "rougeL")) + " |")
    return result


def _run_folders(runs: Path, model: str) -> list[Path]:
    """The finished runs of ``model`` in the grid folder ``runs``, by seed."""
    return sorted((p for p in (runs / f"architecture={model}").glob("seed*") if (p / "summary.json").is_file()),
                  key=lambda p: int(p.name.removeprefix("seed")))


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def table(args) -> dict:
    result: dict = {}
    print("| model (preset) | seeds | ROUGE-1 | ROUGE-2 | ROUGE-L | per seed R-1 / R-2 / R-L | best step | "
          "train tokens/s | wall time per run |\n|---|---|---:|---:|---:|---|---|---:|---:|")
    for model in args.models:
        folders = _run_folders(args.runs, model)
        if not folders:
            print(f"| `gigaword-{model}` | (no finished run in {args.runs / f'architecture={model}'}) |||||||")
            continue
        summaries = [json.loads((f / "summary.json").read_text()) for f in folders]
        tests = [s["test"] for s in summaries]
        walls = [s["wall_s"] for s in summaries]
        per_seed = "; ".join(f"{f.name}: " + " / ".join(f"{t[k]:.2f}" for k in ("rouge1", "rouge2", "rougeL"))
                             for f, t in zip(folders, tests))
        speed = statistics.mean(s.get("tokens_per_s", float("nan")) for s in summaries)
        wall = f"{statistics.mean(walls) / 3600:.2f} h"
        print(f"| `gigaword-{model}` | {len(folders)} | " + " | ".join(_mean_std([t[k] for t in tests]) for k in
                                                                       ("rouge1", "rouge2", "rougeL"))
              + f" | {per_seed} | {', '.join(str(s['best_step']) for s in summaries)} | {speed:,.0f} | {wall} |")
        result[model] = {"seeds": [f.name for f in folders], "test": tests, "best_step": [s["best_step"] for s in summaries],
                         "tokens_per_s": [s.get("tokens_per_s") for s in summaries], "wall_s": walls}
    text = test_pairs(args.data)
    result["LEAD-8"] = lead8 = rouge_scores(lead(text.source, 8), text.target)
    print("| LEAD-8 (no model) | – | " + " | ".join(f"{lead8[k]:.2f}" for k in ("rouge1", "rouge2", "rougeL"))
          + " | | | | |")
    return result


def samples(args) -> dict:
    from maskattn.inference import load_translator

    text = test_pairs(args.data)
    lines = args.lines or list(range(1, args.n + 1))
    outputs, checkpoints = {}, {}
    for model in args.models:
        with_weights = [f / "best.safetensors" for f in _run_folders(args.runs, model)
                        if (f / "best.safetensors").is_file()]
        if with_weights:
            checkpoints[model] = with_weights[0]
            outputs[model] = load_translator(with_weights[0]).translate([text.source[i - 1] for i in lines])
    result = []
    for j, line in enumerate(lines):
        row = {"line": line, "article": text.source[line - 1], "reference": text.target[line - 1],
               **{model: out[j] for model, out in outputs.items()}}
        result.append(row)
        print(f"**Test line {line}.** Article: {row['article']}\n")
        print(f"* reference: {row['reference']}")
        for model in outputs:
            print(f"* {model}: {row[model]}")
        print()
    return {"models": {m: str(c.parent) for m, c in checkpoints.items()}, "samples": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("baselines", "table", "samples"))
    parser.add_argument("--data", type=Path, required=True, help="the Gigaword folder (test.src / test.tgt)")
    parser.add_argument("--runs", type=Path, help="the folder holding gigaword-<model>/seed<k>/ run folders")
    parser.add_argument("--models", nargs="+", default=["transformer", "man"])
    parser.add_argument("--n", type=int, default=5, help="samples: the first N test lines")
    parser.add_argument("--lines", type=int, nargs="*", help="samples: these 1-based test lines instead")
    parser.add_argument("--out", type=Path, help="also write the numbers here as JSON")
    args = parser.parse_args()
    if args.what != "baselines" and args.runs is None:
        parser.error(f"{args.what} needs --runs")
    result = {"baselines": baselines, "table": table, "samples": samples}[args.what](args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
