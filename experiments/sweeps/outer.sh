#!/usr/bin/env bash
# Outer optimizer (DiLoCo: local-sgd + outer Nesterov SGD lr 0.7 momentum 0.9) against plain
# local-sgd with the same H, allreduce and one-peer-exp, 4 CPU gloo workers, 3 seeds, the same
# step budget per task:
#   digits IID and digits Dirichlet alpha=0.1 (small_cnn, 20 epochs), and the tiny GPT
#   (experiment=lm_quick, 128 steps) on the embedded corpus.
# H in {8, 32} on digits; H=8 only on the LM (LM_HS="8 32" adds H=32: its 128 steps hold just
# four outer steps at H=32). About 60 minutes on 2 cores shared with other jobs.
# SlowMo over gossip (one-peer-exp, slow momentum 0.5, slow lr 1, every 8 steps) on digits.
# PART=base runs the configurations without an outer optimizer, PART=outer the DiLoCo and SlowMo
# ones (PART=slowmo only SlowMo), PART=all (default) all; SKIP_RUNS=1 only rebuilds the reports in docs/results/outer/ from
# the runs' files committed there (runs/<task>/<configuration>/seed<k>/).
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
. experiments/sweeps/_lib.sh  # keep_runs
OUT=${OUT:-multirun/outer}
DOCS=${DOCS:-docs/results/outer}
PART=${PART:-all}
DATA=data/stdlib-bpe
VOCAB=1024  # the corpus's vocabulary; the summary counts the tiny GPT's parameters with it
SUB='hydra.sweep.subdir=seed${train.seed}'
run() {  # run <task> <config name> <overrides...>
  local task=$1 name=$2
  shift 2
  local common=(log.progress=false train.seed=0,1,2 "$SUB" hydra.sweep.dir="$OUT/$task/$name")
  case $task in
    digits) common+=(logger=none dataset=digits log.consensus_every=10) ;;
    noniid) common+=(logger=none dataset=digits dataset.partition=dirichlet dataset.alpha=0.1
                     log.consensus_every=10) ;;
    lm) common+=(experiment=lm_quick) ;;
  esac
  OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=4 train.py -m \
    "${common[@]}" "$@"
}
if [ "${SKIP_RUNS:-0}" != 1 ]; then
  test -f "$DATA/train.bin" || .venv/bin/python -m experiments.data.prepare_tokens --stdlib \
    --out "$DATA" --max-bytes 2000000 --vocab-size "$VOCAB"
  .venv/bin/python -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["vocab_size"] != int(sys.argv[2]))' \
    "$DATA/meta.json" "$VOCAB" || { echo "outer.sh: $DATA was prepared with another vocabulary than $VOCAB" >&2; exit 1; }
  for task in ${TASKS:-digits noniid lm}; do
    hs=${HS:-8 32}
    [ "$task" = lm ] && hs=${LM_HS:-8}
    if [ "$PART" != outer ] && [ "$PART" != slowmo ]; then
      run "$task" allreduce topology=allreduce
      run "$task" one-peer-exp topology=one-peer-exp
      for h in $hs; do
        run "$task" "local-sgd-H$h" topology=local-sgd topology.kwargs.period="$h"
      done
    fi
    if [ "$PART" != base ] && [ "$task" != lm ]; then  # SlowMo over gossip: one-peer-exp
      run "$task" slowmo-one-peer-exp-H8 topology=one-peer-exp outer=slowmo outer.every=8
    fi
    if [ "$PART" != base ] && [ "$PART" != slowmo ]; then
      for h in $hs; do
        run "$task" "diloco-H$h" topology=local-sgd topology.kwargs.period="$h" outer=diloco \
          outer.every="$h"
      done
    fi
  done
fi
# the runs' small files go next to the report, so that it can be redrawn from the repository
dest_of() { echo "$DOCS/runs/$1"; }
keep_runs dest_of "$OUT"/*/*/seed*/summary.json
for task in digits noniid lm; do
  if compgen -G "$DOCS/runs/$task/*/seed0" >/dev/null; then
    .venv/bin/python -m experiments.report "$DOCS/runs/$task" --out "$DOCS/$task"
  fi
done
# summary.md: the final metric per configuration (mean +- std over seeds) and the bytes each rank
# sends per step, computed from the model size and the schedule (see the table's note)
.venv/bin/python -m experiments.report.outer_summary "$DOCS/runs" --out "$DOCS/summary.md" \
  --vocab-size "$VOCAB"
