#!/usr/bin/env bash
# MTSA Table 1's comparison at convergence (issue 45): MTSA, Bi-LSTM and multi-head attention (+ sinusoidal
# positions) sentence encoders on SNLI with exactly the settings of table1_snli.sh (GloVe 6B 50-d, Adam 0.001, dev
# accuracy every 390 steps = twice an epoch), but trained until dev accuracy has not improved for 3 evaluations, at
# most 15 epochs, under CPU bfloat16 autocast (train.amp=bf16: the fastest setting, docs/results.md "Faster CPU
# training", where the runs' dev accuracy over their first 3 epochs is compared with the float32 Table 1 grid's at the
# same steps; evaluation stays float32). Seeds 0-2.
# Records committed as each run finishes (benchmarks/results/snli_convergence/); run again to continue.
# GRID_ARGS=--dry-run checks every run's configuration and trains none.
#
#   bash benchmarks/grids/snli_convergence.sh [DATA_ROOT] [JOBS]     # default ../shared/data, 1 run at a time
#   maskattn grid compare benchmarks/results/snli_convergence --metric accuracy mtsa bilstm mha
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data}
JOBS=${2:-1}
maskattn grid run --preset snli --data "$DATA/snli" --out benchmarks/results/snli_convergence \
  --set data.tokenizer=word_punct --set "data.vectors=$DATA/glove/glove.6B.50d.txt" --set model.embed_dim=50 \
  --set optim.name=adam --set optim.lr=0.001 --set optim.weight_decay_on=except_embeddings \
  --set train.max_steps=0 --set train.max_epochs=15 --set train.eval_every=390 --set train.patience=3 \
  --set train.amp=bf16 --variants benchmarks/grids/snli_models.yaml --variant mtsa --variant bilstm --variant mha \
  --seeds 0-2 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
