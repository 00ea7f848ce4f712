# The five data sets of MTSA Table 5 as grids, sourced by table5_vectors.sh and table5_random50.sh (which differ
# only in the settings and models they pass): `table5 OUT SETTINGS...` runs, with DATA, JOBS and GRID_ARGS of the
# caller, TREC and SST-5 with seeds 0-4 under the second protocol of docs/results.md (cased, d_model 300, Adam 1e-3,
# L2 1e-4, dropout 0.5, dropout 0.2 on the word vectors, up to 30 epochs: the best settings of the first tries on
# TREC) and CR / SUBJ / MPQA in 10-fold cross-validation under the presets' protocol (MTSA Appendix B: 1,000 steps,
# 2 heads, attention dropout 0.2 on CR and MPQA), seed 0.
P2=(--set model.d_model=300 --set model.num_heads=4 --set model.dropout=0.5 --set model.embed_dropout=0.2
    --set optim.name=adam --set optim.lr=0.001 --set train.max_steps=0 --set train.keep_last=false
    --set data.lowercase=false --set train.max_epochs=30 --set train.patience=8)

table5() {
  local out=$1
  shift
  maskattn grid run --preset trec --data "$DATA/trec" --out "$out/trec" "${P2[@]}" --set train.eval_every=38 \
    "$@" --seeds 0-4 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
  maskattn grid run --preset sst5 --data "$DATA/sst5" --out "$out/sst5" "${P2[@]}" --set train.eval_every=67 \
    "$@" --seeds 0-4 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
  local ds
  for ds in mpqa cr subj; do
    maskattn grid run --preset "$ds" --data "$DATA/$ds" --out "$out/$ds" --set 'data.fold=range(0,10)' \
      --set train.keep_last=false "$@" --seeds 0 --jobs "$JOBS" --threads 1 ${GRID_ARGS:-}
  done
}
