#!/usr/bin/env bash
# Non-IID sweep (CPU-sized, about 35 minutes on 2 cores): digits, 8 gloo workers, label-skewed
# Dirichlet shards with alpha in {0.1, 1.0}, 20 epochs (100 steps), 3 seeds.
#   ring, one-peer-exp and local-sgd (H=8) with SGD+momentum (optim=sgd) and with quasi-global
#   momentum (optim=qgm_sgd, same lr/momentum/decay), against the allreduce baseline (torch DDP, SGD).
# Writes docs/results/noniid/: runs/ (each run's summary.json, metrics.jsonl and
# .hydra/overrides.yaml), summary.md (mean +- std over seeds, gap to allreduce per cell) and one
# experiments.report (table and plots) per alpha, both from runs/. SKIP_RUNS=1 only rebuilds them
# from the runs committed there.
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
. experiments/sweeps/_lib.sh  # keep_runs
OUT=${OUT:-multirun/noniid}
DOCS=${DOCS:-docs/results/noniid}
COMMON=(logger=none log.progress=false log.consensus_every=10 dataset=digits
        dataset.partition=dirichlet dataset.alpha=0.1,1.0 train.seed=0,1,2
        'hydra.sweep.subdir=${topology.name}_${optim.name}_alpha${dataset.alpha}_seed${train.seed}')
run() { .venv/bin/torchrun --standalone --nproc_per_node=8 train.py -m "${COMMON[@]}" "$@"; }
if [ "${SKIP_RUNS:-0}" != 1 ]; then
  run hydra.sweep.dir="$OUT/gossip" topology=ring,one-peer-exp,local-sgd optim=sgd,qgm_sgd
  run hydra.sweep.dir="$OUT/allreduce" topology=allreduce optim=sgd
fi
# the runs' small files go under $DOCS/runs/ (<sweep>/<subdir>/), so that the reports and the
# summary can be written again from the repository
dest_of() { echo "$DOCS/runs/$1"; }
keep_runs dest_of "$OUT"/*/*/summary.json
compgen -G "$DOCS/runs/*/*/summary.json" >/dev/null || {
  echo "noniid.sh: no runs under $OUT or $DOCS/runs" >&2
  exit 1
}
for a in 0.1 1.0; do
  .venv/bin/python -m experiments.report "$DOCS"/runs/gossip/*_alpha"$a"_* \
    "$DOCS"/runs/allreduce/*_alpha"$a"_* --target-acc 0.9 --out "$DOCS/alpha$a"
done
.venv/bin/python -m experiments.report.noniid_summary "$DOCS/runs" --out "$DOCS/summary.md"
