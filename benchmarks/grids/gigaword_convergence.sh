#!/usr/bin/env bash
# MAN Table 2's comparison at convergence (issue 45): the gigaword-transformer and gigaword-man presets, seeds 0-2,
# trained until dev ROUGE (greedy, every 500 steps) has not improved for 3 evaluations, at most 8,000 steps, under CPU
# bfloat16 autocast (train.amp=bf16: the fastest setting without a quality change, docs/results.md "Faster CPU
# training"; evaluation and test decoding stay float32). Tested as the short-budget grid: beam 5, fairseq length
# penalty 1.0, no repeated trigram; each run keeps its test hypotheses (test.hyp.txt) for the paired bootstrap.
# Records committed as each run finishes (benchmarks/results/gigaword_convergence/); run again to continue.
# GRID_ARGS=--dry-run checks every run's configuration and trains none.
#
#   bash benchmarks/grids/gigaword_convergence.sh [DATA_ROOT] [JOBS]     # default ../shared/data, 1 run at a time
#   maskattn grid compare benchmarks/results/gigaword_convergence --metric rouge1 \
#     architecture=man architecture=transformer          # and --metric rouge2, rougeL
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data}
JOBS=${2:-1}
maskattn grid run --preset gigaword-transformer --data "$DATA/gigaword" --out benchmarks/results/gigaword_convergence \
  --set model.architecture=transformer,man --set train.max_steps=8000 --set train.patience=3 --set train.amp=bf16 \
  --seeds 0-2 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
