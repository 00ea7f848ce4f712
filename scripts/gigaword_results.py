"""The Gigaword baselines and sample outputs of docs/results.md, from the data and from finished run folders.

    # LEAD-k baselines and length statistics of the 1,951 test pairs (no model needed)
    python scripts/gigaword_results.py baselines --data ../shared/data/gigaword

    # the runs: one grid, each model's seeds in <grid>/architecture=<model>/seed<k>/
    maskattn grid run --preset gigaword-transformer --data ../shared/data/gigaword --out runs/gigaword \
        --set model.architecture=transformer,man --seeds 0-2 --jobs 2 --threads 1

    # test ROUGE-1/2/L of the finished runs, mean ± sample std per model (the archived records in
    # benchmarks/results/gigaword/grid/ serve as well as the grid folder)
    maskattn grid table runs/gigaword --metric rouge1,rouge2,rougeL

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
    parser.add_argument("what", choices=("baselines", "samples"))
    parser.add_argument("--data", type=Path, required=True, help="the Gigaword folder (test.src / test.tgt)")
    parser.add_argument("--runs", type=Path, help="the grid folder holding architecture=<model>/seed<k>/ run folders")
    parser.add_argument("--models", nargs="+", default=["transformer", "man"])
    parser.add_argument("--n", type=int, default=5, help="samples: the first N test lines")
    parser.add_argument("--lines", type=int, nargs="*", help="samples: these 1-based test lines instead")
    parser.add_argument("--out", type=Path, help="also write the numbers here as JSON")
    args = parser.parse_args()
    if args.what != "baselines" and args.runs is None:
        parser.error(f"{args.what} needs --runs")
    result = {"baselines": baselines, "samples": samples}[args.what](args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
