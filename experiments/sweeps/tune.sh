#!/usr/bin/env bash
# Two-stage tuning of one arm: a grid over one key with one seed, then more seeds at the best.
#   experiments/sweeps/tune.sh NAME KEY V1,V2,... [OVERRIDE ...]
#   e.g. experiments/sweeps/tune.sh ring-adamw optim.lr 1e-3,2e-3,4e-3,8e-3 \
#          experiment=lm_small topology=ring
# Stage 1 runs KEY=V1,V2,... with train.seed=0 into $OUT/NAME/stage1/. Stage 2 asks
# `python -m experiments.report.tune --best` for the best value (best mean final eval/loss, or
# eval/acc for images), copies that run's small files to $OUT/NAME/final/seed0 and runs seeds
# $SEEDS there with KEY at that value, so final/ holds one configuration with every seed.
# Report the arms with `python -m experiments.report $OUT/*/final` (the comparison) and
# `python -m experiments.report $OUT/*/stage1 --tune KEY` (the grids).
# Environment: OUT (multirun/tune), STAGE (1, 2 or all), SEEDS (1,2), NPROC (4 workers),
# WORKERS (set: that many workers packed in one process, engine=packed, instead of NPROC's),
# BEST (stage 2 at this value instead of the best of stage 1), SUBDIR (stage 1's run folder
# names, default the job number; another name adds values to a finished grid).
# A value or seed whose run has ended already (it has a summary.json) is not run again, so a
# cut-short sweep resumes where it stopped.
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
if [ $# -lt 3 ]; then
  echo "usage: experiments/sweeps/tune.sh NAME KEY V1,V2,... [OVERRIDE ...]" >&2
  exit 2
fi
NAME=$1 KEY=$2 VALUES=$3
shift 3
OUT=${OUT:-multirun/tune}
STAGE=${STAGE:-all}
SEEDS=${SEEDS:-1,2}
NPROC=${NPROC:-4}
case $STAGE in 1|2|all) ;; *) echo "STAGE=$STAGE: use 1, 2 or all" >&2; exit 2 ;; esac
train() {
  if [ -n "${WORKERS:-}" ]; then  # every worker in this one process (engine=packed)
    .venv/bin/python train.py -m engine=packed engine.workers="$WORKERS" log.progress=false "$@"
  else
    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node="$NPROC" train.py -m \
      log.progress=false "$@"
  fi
}
finished() {  # finished DIR KEY=VALUE [--self]: a run under DIR (or DIR) with it that ended
  .venv/bin/python -m experiments.report.find_run "$@" >/dev/null
}
if [ "$STAGE" != 2 ]; then
  todo=()
  for v in ${VALUES//,/ }; do
    if finished "$OUT/$NAME/stage1" "$KEY=$v"; then
      echo "$NAME: $KEY=$v has run already; skipped"
    else
      todo+=("$v")
    fi
  done
  if [ ${#todo[@]} = "$(tr ',' '\n' <<<"$VALUES" | wc -l)" ]; then  # the whole grid, one launch
    train "$@" "$KEY=$VALUES" hydra.sweep.dir="$OUT/$NAME/stage1" \
      "hydra.sweep.subdir=${SUBDIR:-\${hydra.job.num\}}"
  else  # the rest of a grid cut short: named folders, so as not to reuse its job numbers
    for v in "${todo[@]}"; do
      train "$@" "$KEY=$v" hydra.sweep.dir="$OUT/$NAME/stage1" \
        "hydra.sweep.subdir=${SUBDIR:-${KEY##*.}$v}"
    done
  fi
fi
if [ "$STAGE" != 1 ]; then
  best=${BEST:-$(.venv/bin/python -m experiments.report.tune "$OUT/$NAME/stage1" --key "$KEY" --best)}
  echo "$best" > "$OUT/$NAME/best.txt"
  # a run of that value that ended (not one cut short before its summary)
  src=$(.venv/bin/python -m experiments.report.find_run "$OUT/$NAME/stage1" "$KEY=$best") || src=
  [ -n "$src" ] || { echo "$NAME: no finished run with $KEY=$best in $OUT/$NAME/stage1" >&2; exit 1; }
  dest="$OUT/$NAME/final/seed0"
  mkdir -p "$dest/.hydra"
  cp "$src/summary.json" "$src/metrics.jsonl" "$dest/"
  cp "$src"/.hydra/*.yaml "$dest/.hydra/"
  todo=()
  for seed in ${SEEDS//,/ }; do
    finished "$OUT/$NAME/final/seed$seed" "$KEY=$best" --self || todo+=("$seed")
  done
  echo "$NAME: $KEY=$best (from $src); seeds $SEEDS, to run: ${todo[*]:-none}"
  if [ ${#todo[@]} -gt 0 ]; then
    seeds=$(IFS=,; echo "${todo[*]}")
    train "$@" "$KEY=$best" "train.seed=$seeds" hydra.sweep.dir="$OUT/$NAME/final" \
      'hydra.sweep.subdir=seed${train.seed}'
  fi
fi
