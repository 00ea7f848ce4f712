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
# the second protocol of docs/results.md (cased, d_model 300, Adam 1e-3, L2 1e-4 off the tables, dropout 0.5), with
# dropout 0.2 on the word vectors and up to 30 epochs: the best settings of the first tries on TREC (docs/results.md)
P2=(--set model.d_model=300 --set model.num_heads=4 --set model.dropout=0.5 --set model.embed_dropout=0.2
    --set optim.name=adam --set optim.lr=0.001 --set train.max_steps=0 --set train.keep_last=false
    --set data.lowercase=false --set train.max_epochs=30 --set train.patience=8)
maskattn grid run --preset trec --data "$DATA/trec" --out "$OUT/trec" "${P2[@]}" --set train.eval_every=38 \
  "${VECTORS[@]}" "${MODELS[@]}" --seeds 0-4 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
maskattn grid run --preset sst5 --data "$DATA/sst5" --out "$OUT/sst5" "${P2[@]}" --set train.eval_every=67 \
  "${VECTORS[@]}" "${MODELS[@]}" --seeds 0-4 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
# the presets' protocol (MTSA Appendix B: 1,000 steps, 2 heads, attention dropout 0.2 on CR and MPQA), ten folds
for ds in cr subj mpqa; do
  maskattn grid run --preset "$ds" --data "$DATA/$ds" --out "$OUT/$ds" --set 'data.fold=range(0,10)' \
    --set train.keep_last=false "${VECTORS[@]}" "${MODELS[@]}" --seeds 0 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
done
