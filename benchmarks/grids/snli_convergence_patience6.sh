#!/usr/bin/env bash
# How much of the SNLI convergence grid's spread is its stopping rule (issue 45's reading): every run of
# benchmarks/results/snli_convergence that train.patience=3 stopped is continued from its last checkpoint with
# train.patience=6 (same 15-epoch cap), into benchmarks/results/snli_convergence_patience6/<run>/. A resume is exact
# (the trainer restores the weights, optimiser, sampler position, RNG states and the count of evaluations without
# improvement), and no run of the grid had 6 such evaluations in a row before it stopped, so each continuation is the
# run that patience 6 would have trained from the start. The runs that reached the cap are not continued.
# Needs the grid's last.safetensors / best.safetensors, which are not committed (weights stay on the machine that
# trained them): on another machine, train the grid first (benchmarks/grids/snli_convergence.sh).
#
#   bash benchmarks/grids/snli_convergence_patience6.sh [RUN...]    # default: the seven runs stopped by patience
set -uo pipefail
cd "$(dirname "$0")/../.."
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(mtsa/seed0 mtsa/seed1 mtsa/seed2 bilstm/seed0 bilstm/seed1 bilstm/seed2 mha/seed2)
for run in "${runs[@]}"; do
  src=benchmarks/results/snli_convergence/$run
  dst=benchmarks/results/snli_convergence_patience6/$run
  if [ -f "$dst/summary.json" ]; then echo "$run: finished earlier"; continue; fi
  if [ ! -f "$dst/last.safetensors" ]; then  # first start: the stopped run's files; later: continue the copy
    [ -f "$src/last.safetensors" ] || { echo "$run: $src/last.safetensors is not here (train the grid first)"; exit 1; }
    mkdir -p "$dst" && cp "$src"/{config.yaml,metrics.jsonl,metrics.csv,last.safetensors,best.safetensors} "$dst"/
  fi
  start=$(date +%s)
  OMP_NUM_THREADS=1 maskattn train --resume "$dst/last.safetensors" --set train.patience=6 --set train.num_threads=1 \
    --no-progress >> "$dst/train.log" 2>&1 || { echo "$run: failed, see $dst/train.log"; exit 1; }
  # `maskattn train` prints the run's summary last (a grid run also writes it to summary.json): keep it as the record
  python -c 'import json, sys; text = open(sys.argv[1]).read(); json.dump(json.loads(text[text.rindex("\n{\n") + 1:]), open(sys.argv[2], "w"), indent=2)' \
    "$dst/train.log" "$dst/summary.json"
  echo "$run: finished in $(( $(date +%s) - start )) s"
done
