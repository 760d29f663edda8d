#!/usr/bin/env bash
# Streaming outer rounds on experiment=lm_small (4 CPU gloo workers, 512 steps, 4.19M tokens),
# against the tuned allreduce and DiLoCo H=16 arms of experiments/sweeps/lm_small.sh.
# Inner AdamW at allreduce's tuned lr (4e-3), H=16, F=4 fragments, buckets of 0.5 MB (8 buckets,
# so each fragment holds 2 of them). Each arm tunes outer.lr with experiments/sweeps/tune.sh
# (1 seed per value, one more value beyond an edge), then runs seeds 1 and 2 at its best:
#   streaming-f4       streaming DiLoCo (local-sgd, period 16, outer Nesterov), float32
#   streaming-f4-int8  the same with the outer gradients sent in int8
#   slowmo-ope-f4      streaming SlowMo: one-peer-exp gossip, outer SGD (momentum 0.5) every 16
#   slowmo-ope-f4-scaled  the same with SlowMo's own update under the cosine schedule
#                      (outer.scale_by_inner_lr=true: Delta / gamma_t, the step times gamma_t)
# PART=link then runs each arm's best configuration for 64 steps on an emulated slow link
# (network=custom, $LINK_GBPS Gb/s, $LINK_MS ms per message) for its step time; the report
# (experiments/report/link_time.py) puts those step times on the 512-step loss curves.
# About 50 minutes on 2 cores (15 runs of about 3 minutes, then 5 short ones).
# PART=grid|seeds|link|report|all (default all); OUT (multirun/streaming); LM (the lm_small
# runs, docs/results/lm/runs); DOCS (docs/results/streaming); ONLY (space-separated arm names:
# run only those in grid, seeds and link, e.g. ONLY=slowmo-ope-f4-scaled).
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
export OUT=${OUT:-multirun/streaming}
LM=${LM:-docs/results/lm/runs}
OUTER=${OUTER:-docs/results/outer/lm_small/runs}
DOCS=${DOCS:-docs/results/streaming}
PART=${PART:-all}
LINK_GBPS=${LINK_GBPS:-0.05}
LINK_MS=${LINK_MS:-10}
DATA=data/stdlib-bpe-all
TUNE=experiments/sweeps/tune.sh
test -f "$DATA/train.bin" || .venv/bin/python -m experiments.data.prepare_tokens --stdlib \
  --out "$DATA" --max-bytes 16000000 --vocab-size 1024
BASE=(experiment=lm_small optim.lr=0.004 topology.bucket_size_in_mb=0.5 outer.fragments=4)
DILOCO=(topology=local-sgd topology.kwargs.period=16 outer=diloco)
SLOWMO=(topology=one-peer-exp outer=slowmo outer.every=16)
# NAME|GRID|OVERRIDES (the overrides split on spaces)
ARMS=(
  "streaming-f4|0.3,0.5,0.7|${DILOCO[*]} ${BASE[*]}"
  "streaming-f4-int8|0.3,0.5,0.7|${DILOCO[*]} ${BASE[*]} outer.compression=int8"
  "slowmo-ope-f4|0.5,1.0,1.5|${SLOWMO[*]} ${BASE[*]}"
  "slowmo-ope-f4-scaled|0.5,1.0,1.5|${SLOWMO[*]} ${BASE[*]} outer.scale_by_inner_lr=true"
)
ONLY=${ONLY:-}
chosen() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }
. experiments/sweeps/_lib.sh  # best, keep_runs
if [ "$PART" = grid ] || [ "$PART" = all ]; then
  for arm in "${ARMS[@]}"; do
    IFS='|' read -r name grid overrides <<<"$arm"
    chosen "$name" || continue
    # shellcheck disable=SC2086  # the overrides are words
    STAGE=1 $TUNE "$name" outer.lr "$grid" $overrides
    read -r v side < <(best "$OUT/$name/stage1" outer.lr)
    case $side in
      low) extra=$(.venv/bin/python -c "import sys; print(float(sys.argv[1]) / 2)" "$v") ;;
      high) extra=$(.venv/bin/python -c "import sys; print(round(float(sys.argv[1]) + 0.5, 3))" "$v") ;;
      *) continue ;;
    esac
    echo "$name: the best outer.lr $v is at an edge of the grid; adding $extra"
    # shellcheck disable=SC2086
    STAGE=1 SUBDIR="lr$extra" $TUNE "$name" outer.lr "$extra" $overrides
  done
fi
if [ "$PART" = seeds ] || [ "$PART" = all ]; then
  for arm in "${ARMS[@]}"; do
    IFS='|' read -r name _ overrides <<<"$arm"
    chosen "$name" || continue
    # shellcheck disable=SC2086
    STAGE=2 $TUNE "$name" outer.lr - $overrides
  done
fi
link() {  # link NAME OVERRIDE...: 64 steps of NAME's configuration on the emulated link
  local name=$1
  shift
  OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=4 train.py \
    log.progress=false "$@" train.max_steps=64 network=custom \
    network.bandwidth_gbps="$LINK_GBPS" network.latency_ms="$LINK_MS" \
    hydra.run.dir="$OUT/link/$name"
}
if [ "$PART" = link ] || [ "$PART" = all ]; then
  if [ -z "$ONLY" ]; then
    link allreduce-adamw experiment=lm_small topology=allreduce optim.lr=0.004
    # DiLoCo H=16's best outer lr (docs/results/outer/lm_small/tune_outer_lr)
    link diloco-H16 experiment=lm_small "${DILOCO[@]}" optim.lr=0.004 outer.lr=0.5
  fi
  for arm in "${ARMS[@]}"; do
    IFS='|' read -r name _ overrides <<<"$arm"
    chosen "$name" || continue
    # shellcheck disable=SC2086
    link "$name" $overrides outer.lr="$(cat "$OUT/$name/best.txt")"
  done
fi
if [ "$PART" = report ] || [ "$PART" = all ]; then
  # the runs' small files go into the repository, with the two arms they are compared against
  R=$DOCS/runs
  dest_of() { echo "$R/$1"; }
  # without sweep output, the committed runs alone
  keep_runs dest_of "$OUT"/*/*/*/summary.json "$OUT"/link/*/summary.json
  for name in "$OUT"/*/best.txt; do [ -f "$name" ] && cp "$name" "$R/$(basename "${name%/best.txt}")/"; done
  mkdir -p "$R/allreduce-adamw" "$R/diloco-H16"
  cp -r "$LM/allreduce-adamw/final" "$R/allreduce-adamw/"
  cp -r "$OUTER/diloco-H16/final" "$OUTER/diloco-H16/stage1" "$R/diloco-H16/"
  P=(.venv/bin/python -m experiments.report)
  "${P[@]}" "$R"/*/final --out "$DOCS"
  "${P[@]}" "$R"/*/stage1 --tune outer.lr --out "$DOCS/tune_outer_lr"
  .venv/bin/python -m experiments.report.link_time "$R" --out "$DOCS/link" \
    --gbps "$LINK_GBPS" --latency-ms "$LINK_MS"
fi
