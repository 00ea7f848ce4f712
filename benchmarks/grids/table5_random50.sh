#!/usr/bin/env bash
# The random-vector control of MTSA Table 5 with GloVe 50-d (issue 43): MTSA and multi-head attention trained with
# exactly the settings of benchmarks/grids/table5_vectors.sh — the 50-d embedding table projected to d_model, no L2
# on it, dropout on the vectors, the same budget and early stopping — but for data.vectors: the table starts from
# the model's own random initialisation (U(-0.05, 0.05)) instead of GloVe. The difference of the two grids' cells is
# what the vectors bought, nothing else. (model.embed_scale follows the library's rule, as in any run: √d_model before
# sinusoidal positions for vectors trained from scratch, 1 with pretrained ones; MTSA has no positions.)
# Grid folders: benchmarks/results/table5_random50/<data set>/, records committed as they finish.
#
#   bash benchmarks/grids/table5_random50.sh [DATA_ROOT] [JOBS]     # default ../shared/data, 2 runs at a time
#   maskattn grid compare benchmarks/results/table5_vectors/trec benchmarks/results/table5_random50/trec ...
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data}
JOBS=${2:-2}
OUT=benchmarks/results/table5_random50
RANDOM50=(--set model.embed_dim=50 --set optim.weight_decay_on=except_embeddings)
MODELS=(--variants benchmarks/grids/sentence_models.yaml --variant mtsa --variant mha)
P2=(--set model.d_model=300 --set model.num_heads=4 --set model.dropout=0.5 --set model.embed_dropout=0.2
    --set optim.name=adam --set optim.lr=0.001 --set train.max_steps=0 --set train.keep_last=false
    --set data.lowercase=false --set train.max_epochs=30 --set train.patience=8)
maskattn grid run --preset trec --data "$DATA/trec" --out "$OUT/trec" "${P2[@]}" --set train.eval_every=38 \
  "${RANDOM50[@]}" "${MODELS[@]}" --seeds 0-4 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
maskattn grid run --preset sst5 --data "$DATA/sst5" --out "$OUT/sst5" "${P2[@]}" --set train.eval_every=67 \
  "${RANDOM50[@]}" "${MODELS[@]}" --seeds 0-4 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
for ds in mpqa cr subj; do
  maskattn grid run --preset "$ds" --data "$DATA/$ds" --out "$OUT/$ds" --set 'data.fold=range(0,10)' \
    --set train.keep_last=false "${RANDOM50[@]}" "${MODELS[@]}" --seeds 0 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
done
