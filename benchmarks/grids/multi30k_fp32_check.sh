#!/usr/bin/env bash
# Does CPU bfloat16 autocast change what the translation presets reach? (issue 53, as the SNLI bf16 check of
# issue 45): multi30k-transformer and multi30k-man, seed 0, in float32 (train.amp=false) for 2,000 steps with dev
# BLEU every 500 and no early stop, beside the bf16 grid's seed-0 dev curves (the presets' learning rate is
# inverse_sqrt after a 400-step warm-up: it does not depend on the run's length, so the same steps compare). No test
# decoding. One run at a time, one thread; run again to continue.
#
#   bash benchmarks/grids/multi30k_fp32_check.sh [DATA_ROOT]
#   python benchmarks/dev_at_steps.py --metric bleu --steps 500,1000,1500,2000 \
#     benchmarks/results/multi30k_fp32_check/architecture=man benchmarks/results/multi30k_convergence/architecture=man
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data}
if [ ! -f "$DATA/multi30k/train.en" ]; then
  echo "multi30k_fp32_check.sh: no Multi30k at $DATA/multi30k (train.en missing); pass the data root as the first argument" >&2
  exit 2
fi
maskattn grid run --preset multi30k-transformer --data "$DATA/multi30k" --out benchmarks/results/multi30k_fp32_check \
  --set model.architecture=transformer,man --set train.max_steps=2000 --set train.patience=0 \
  --set train.amp=false --set data.test=null --seeds 0 --jobs 1 --threads 1 ${GRID_ARGS:-}
