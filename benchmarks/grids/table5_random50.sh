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
source benchmarks/grids/table5_common.sh
table5 "$OUT" "${RANDOM50[@]}" "${MODELS[@]}"
