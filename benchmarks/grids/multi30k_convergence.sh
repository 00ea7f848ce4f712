#!/usr/bin/env bash
# The translation half of the papers at convergence (issue 53): MAN Table 1 and CSAN Table 1's comparison with the
# Transformer — the multi30k-transformer / -man / -csan presets (3 + 3 layers, d_model 256, joint BPE 8,000), seeds
# 0-2, trained until dev BLEU (greedy, every 500 steps) has not improved for 4 evaluations (2,000 steps), at most
# 6,000 steps (≈ 27 epochs), under CPU bfloat16 autocast (train.amp=bf16: the fastest setting here, 1.09-1.13x
# float32; torch.compile is slower — docs/results.md "Translation at convergence"); evaluation and test decoding stay
# float32. Test: the best dev checkpoint, beam 5, length penalty 0.6, sacreBLEU BLEU and chrF; each run keeps its test
# hypotheses (test.hyp.txt) for the paired bootstrap. Order: seed-major (transformer, man, csan for seed 0, then
# seed 1, then seed 2), one run at a time, one thread each.
# Records committed as each run finishes (benchmarks/results/multi30k_convergence/); run again to continue: finished
# runs are kept, an interrupted run resumes from its last checkpoint. GRID_ARGS=--dry-run checks every run's
# configuration and trains none.
#
#   bash benchmarks/grids/multi30k_convergence.sh [DATA_ROOT] [JOBS]     # default ../shared/data, 1 run at a time
#   maskattn grid compare benchmarks/results/multi30k_convergence --metric bleu \
#     architecture=man architecture=transformer          # and architecture=csan; --metric chrf
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data}
JOBS=${2:-1}
if [ ! -f "$DATA/multi30k/train.en" ]; then
  echo "multi30k_convergence.sh: no Multi30k at $DATA/multi30k (train.en missing); pass the data root as the first argument" >&2
  exit 2
fi
maskattn grid run --preset multi30k-transformer --data "$DATA/multi30k" --out benchmarks/results/multi30k_convergence \
  --set model.architecture=transformer,man,csan --set train.max_steps=6000 --set train.patience=4 \
  --set train.amp=bf16 --seeds 0-2 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
