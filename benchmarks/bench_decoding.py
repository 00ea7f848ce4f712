"""Decoding throughput of a seq2seq checkpoint with and without n-gram blocking (sentences per second).

The checkpoint decodes the same source file with its own decoding settings (a Gigaword run: beam 5, fairseq's
length penalty 1.0, 1–30 output subwords), once with ``no_repeat_ngram_size`` 0 and once with ``--ngram`` (3:
trigram blocking), in turn over ``--rounds`` rounds so that a change of machine load affects both alike; the figure
of each setting is the median over rounds of (sentences / wall time of the round), and the ratio of the medians is
the slowdown of blocking. The outputs of the two settings are compared too (how many lines blocking changed).

    python benchmarks/bench_decoding.py -k runs/gigaword/architecture=man/seed0/best.safetensors \\
        --src ../shared/data/gigaword/test.src --threads 1 --out benchmarks/results/gigaword/bench_decoding_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from maskattn.bench import machine_info
from maskattn.data.text import read_lines
from maskattn.inference import load_translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", "--checkpoint", type=Path, required=True)
    parser.add_argument("--src", type=Path, required=True, help="source lines (e.g. Gigaword's test.src)")
    parser.add_argument("--ngram", type=int, default=3, help="the blocked n-gram size compared with none")
    parser.add_argument("--beam", type=int, default=None, help="beam size (default: the checkpoint's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path("bench_decoding.json"))
    args = parser.parse_args()
    if args.rounds < 1 or args.ngram < 1:
        parser.error("--rounds and --ngram must be >= 1")
    torch.set_num_threads(args.threads)
    translator = load_translator(args.checkpoint, device="cpu")
    lines = [line for line in read_lines(args.src) if line.strip()]
    settings = {"none": 0, f"{args.ngram}-gram blocking": args.ngram}
    speeds: dict[str, list[float]] = {name: [] for name in settings}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, n in settings.items():
            start = time.perf_counter()
            outputs[name] = translator.translate(lines, batch_size=args.batch_size, no_repeat_ngram_size=n,
                                                 beam=args.beam)
            speeds[name].append(len(lines) / (time.perf_counter() - start))
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    plain, blocked = medians["none"], medians[f"{args.ngram}-gram blocking"]
    changed = sum(a != b for a, b in zip(outputs["none"], outputs[f"{args.ngram}-gram blocking"]))
    result = {"checkpoint": str(args.checkpoint), "source": str(args.src), "sentences": len(lines),
              "decoding": {**dataclasses.asdict(translator.decoding.replace(beam=args.beam)), "no_repeat_ngram_size": "varied"},
              "threads": args.threads, "batch_size": args.batch_size, "rounds": args.rounds,
              "sentences_per_s": speeds, "median_sentences_per_s": medians, "slowdown": plain / blocked,
              "outputs_changed_by_blocking": changed,
              "mean_output_words": {name: statistics.mean(len(o.split()) for o in out) for name, out in outputs.items()},
              "machine": machine_info(torch.device("cpu"))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(lines)} sentences, {args.threads} thread(s): {plain:.1f} sentences/s without blocking, {blocked:.1f} "
          f"with {args.ngram}-gram blocking (slowdown ×{plain / blocked:.3f}); blocking changed {changed} outputs; mean "
          f"output length {result['mean_output_words']['none']:.2f} / "
          f"{result['mean_output_words'][f'{args.ngram}-gram blocking']:.2f} words")


if __name__ == "__main__":
    main()
