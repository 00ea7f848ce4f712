#!/usr/bin/env bash
# MTSA Table 1 at this data scale (issue 34 item 3): the snli preset's sentence-encoding model with MTSA, Fast-DiSA,
# multi-head attention (+ sinusoidal positions) and Bi-LSTM encoders, GloVe 6B 50-d, 3 epochs over the 99,890
# training pairs, seeds 0-2, then the efficiency columns (`maskattn grid cost`). The grid folder
# benchmarks/results/snli_table1/ keeps its records in git and its weights out (benchmarks/results/.gitignore).
# Run again to continue: finished runs are kept, an interrupted run resumes from its last checkpoint.
# GRID_ARGS=--dry-run checks every run's configuration and trains none.
#
#   bash benchmarks/grids/table1_snli.sh [DATA_ROOT] [JOBS]     # default ../shared/data, 2 runs at a time
#   maskattn grid table benchmarks/results/snli_table1
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data}
JOBS=${2:-2}
GRID=(--preset snli --data "$DATA/snli" --out benchmarks/results/snli_table1
      --set data.tokenizer=word_punct --set "data.vectors=$DATA/glove/glove.6B.50d.txt" --set model.embed_dim=50
      --set optim.name=adam --set optim.lr=0.001 --set optim.weight_decay_on=except_embeddings
      --set train.max_steps=0 --set train.max_epochs=3 --set train.eval_every=390
      --variants benchmarks/grids/snli_models.yaml)
maskattn grid run "${GRID[@]}" --seeds 0-2 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
[[ "${GRID_ARGS:-}" == *--dry-run* ]] || maskattn grid cost --out benchmarks/results/snli_table1
