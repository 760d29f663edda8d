#!/usr/bin/env bash
# The tuned language-model studies on experiment=lm_small (4 CPU gloo workers, 512 steps,
# 4.19M tokens), each arm tuned by experiments/sweeps/tune.sh: a 1-seed grid, then seeds 1
# and 2 at its best value. About 2.5 hours on 2 cores (about 3 minutes per run, 46 runs).
#   Part 3, topologies and local optimizers, optim.lr over 1e-3..8e-3 (x2):
#     allreduce, one-peer-exp and complete with AdamW (betas 0.9/0.95), and one-peer-exp with
#     AccumAdamW (betas 0.9/0.98, accum_iter 8); then accum_iter 1 and 4 at AccumAdamW's best
#     learning rate.
#   Part 4, DiLoCo: inner AdamW at allreduce's tuned learning rate, outer Nesterov SGD
#     (momentum 0.9) with outer.lr over {0.3, 0.5, 0.7, 1.0}, at H=16 and H=64, against plain
#     local-sgd at the same H (the same bytes: one world all-reduce every H steps).
# PART=lr|accum|outer|report|all (default all); OUT (multirun/lm_small); DOCS (docs/results).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-multirun/lm_small}
DOCS=${DOCS:-docs/results}
PART=${PART:-all}
DATA=data/stdlib-bpe-all
LRS=1e-3,2e-3,4e-3,8e-3
TUNE=experiments/sweeps/tune.sh
test -f "$DATA/train.bin" || .venv/bin/python -m experiments.data.prepare_tokens --stdlib \
  --out "$DATA" --max-bytes 16000000 --vocab-size 1024
best() { cat "$OUT/$1/best.txt"; }
ACCUM=(optim=accum_adamw 'optim.betas=[0.9,0.98]' optim.weight_decay=0.1)
if [ "$PART" = lr ] || [ "$PART" = all ]; then
  $TUNE allreduce-adamw optim.lr $LRS experiment=lm_small topology=allreduce
  $TUNE one-peer-exp-adamw optim.lr $LRS experiment=lm_small topology=one-peer-exp
  $TUNE complete-adamw optim.lr $LRS experiment=lm_small topology=complete
  $TUNE one-peer-exp-accum8 optim.lr $LRS experiment=lm_small topology=one-peer-exp \
    "${ACCUM[@]}" optim.accum_iter=8
fi
if [ "$PART" = accum ] || [ "$PART" = all ]; then
  # accum_iter 1 and 4 at the accum_iter=8 arm's learning rate; with the 8 of that arm's grid
  # they form the accum_iter grid, and the best of the three gets seeds 1 and 2
  lr=$(best one-peer-exp-accum8)
  STAGE=1 $TUNE one-peer-exp-accum optim.accum_iter 1,4 experiment=lm_small \
    topology=one-peer-exp "${ACCUM[@]}" optim.lr="$lr"
fi
if [ "$PART" = outer ] || [ "$PART" = all ]; then
  lr=$(best allreduce-adamw)
  for h in 16 64; do
    STAGE=all $TUNE "local-sgd-H$h" optim.lr "$lr" experiment=lm_small topology=local-sgd \
      topology.kwargs.period="$h"
    $TUNE "diloco-H$h" outer.lr 0.3,0.5,0.7,1.0 experiment=lm_small topology=local-sgd \
      topology.kwargs.period="$h" outer=diloco optim.lr="$lr"
  done
fi
if [ "$PART" = report ] || [ "$PART" = all ]; then
  # the runs' small files go into the repository, so that every report can be redrawn from it
  for summary in "$OUT"/*/*/*/summary.json; do
    dir=${summary%/summary.json}
    rel=${dir#"$OUT"/}
    case $rel in
      allreduce-*|one-peer-exp-*|complete-*) dest=$DOCS/lm/runs/$rel ;;
      *) dest=$DOCS/outer/lm_small/runs/$rel ;;
    esac
    mkdir -p "$dest/.hydra"
    cp "$dir/summary.json" "$dir/metrics.jsonl" "$dest/"
    cp "$dir/.hydra/overrides.yaml" "$dest/.hydra/"
  done
  R=(.venv/bin/python -m experiments.report)
  L=$DOCS/lm/runs O=$DOCS/outer/lm_small/runs
  # the comparison: each arm at its best value, 3 seeds
  "${R[@]}" "$L"/*/final --out "$DOCS/lm"
  # the grids: one seed per value
  "${R[@]}" "$L"/*-adamw/stage1 "$L"/one-peer-exp-accum8/stage1 --tune optim.lr \
    --out "$DOCS/lm/tune_lr"
  "${R[@]}" "$L"/one-peer-exp-accum*/stage1 --tune optim.accum_iter --out "$DOCS/lm/tune_accum"
  cp -r "$L/allreduce-adamw" "$O/" 2>/dev/null || true
  "${R[@]}" "$O"/*/final --out "$DOCS/outer/lm_small"
  "${R[@]}" "$O"/diloco-*/stage1 --tune outer.lr --out "$DOCS/outer/lm_small/tune_outer_lr"
fi
