#!/usr/bin/env bash
# MTSA Table 5 with GloVe 6B 50-d vectors (issue 34 item 4): MTSA, multi-head attention and Kim's CNN with static
# and non-static vectors on TREC and SST-5 (seeds 0-4) and CR / SUBJ / MPQA (10-fold cross-validation, seed 0).
# Every grid folder lives in benchmarks/results/table5_vectors/<data set>/: its records (grid.json, each run's
# config.yaml, summary.json, metrics, train.log) are committed, the weights are not (benchmarks/results/.gitignore).
# Run again to continue: finished runs are kept, an interrupted run resumes from its last checkpoint.
# GRID_ARGS=--dry-run checks every run's configuration and trains none.
#
#   bash benchmarks/grids/table5_vectors.sh [DATA_ROOT] [JOBS]     # default ../shared/data, 2 runs at a time
#   maskattn grid table benchmarks/results/table5_vectors/trec    # the table of one data set
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data}
JOBS=${2:-2}
OUT=benchmarks/results/table5_vectors
VECTORS=(--set "data.vectors=$DATA/glove/glove.6B.50d.txt" --set model.embed_dim=50
         --set optim.weight_decay_on=except_embeddings)
MODELS=(--variants benchmarks/grids/sentence_models.yaml --variant mtsa --variant mha --variant cnn_static
        --variant cnn_nonstatic)
source benchmarks/grids/table5_common.sh
table5 "$OUT" "${VECTORS[@]}" "${MODELS[@]}"
