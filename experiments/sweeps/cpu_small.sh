#!/usr/bin/env bash
# The CPU-sized version of the paper sweeps (2 cores: about 20 minutes in all), 4 gloo workers,
# every topology plus allreduce; alternating-exp-ring as 2 simulated nodes of 2 ranks.
#  1. digits (embedded, real data): accuracy and consensus, without and with emulated 25 Gb/s Ethernet;
#  2. synthetic CIFAR-shaped throughput run (ResNet-18, 3x32x32, random labels: speed only),
#     without emulation, with emulated 25 Gb/s Ethernet, and with an emulated 0.5 Gb/s link.
#     A CPU step is ~50x slower than a GPU step, so 25 Gb/s hides behind CPU compute; 0.5 Gb/s
#     restores the communication/compute ratio that a GPU cluster sees on 25 Gb/s Ethernet.
# Keeps each run's summary.json, metrics.jsonl and .hydra/overrides.yaml under
# docs/results/cpu_small/runs/<sweep>/<job>/ and writes report.md and the plots from them into
# docs/results/digits/ (1.) and docs/results/synthetic/ (2.). SKIP_RUNS=1 only rebuilds the
# reports from the runs committed there.
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
. experiments/sweeps/_lib.sh  # keep_runs
OUT=${OUT:-multirun/cpu_small}
DOCS=${DOCS:-docs/results}
RUNS=$DOCS/cpu_small/runs
TOPOS=complete,ring,one-peer-exp,alternating-exp-ring,random-matching,allreduce
run() {
  .venv/bin/torchrun --standalone --nproc_per_node=4 train.py -m logger=none log.progress=false \
    topology="$TOPOS" topology.local_world_size=2 "$@"
}
if [ "${SKIP_RUNS:-0}" != 1 ]; then
  run hydra.sweep.dir="$OUT/digits" network=none,ethernet_25g log.consensus_every=5
  SYN=(dataset=synthetic model=resnet18_cifar train.batch_size=16 train.max_steps=30
       log.every=5 log.consensus_every=10)
  run hydra.sweep.dir="$OUT/synthetic" "${SYN[@]}" network=none,ethernet_25g
  run hydra.sweep.dir="$OUT/synthetic_slow" "${SYN[@]}" network=custom network.latency_ms=0.02 \
    network.bandwidth_gbps=0.5
fi
# the runs' small files go into the repository, so that the reports can be redrawn from it
dest_of() { echo "$RUNS/$1"; }
keep_runs dest_of "$OUT"/*/*/summary.json
for sweep in digits synthetic synthetic_slow; do
  compgen -G "$RUNS/$sweep/*/summary.json" >/dev/null || {
    echo "cpu_small.sh: no runs of $sweep under $OUT or $RUNS" >&2
    exit 1
  }
done
.venv/bin/python -m experiments.report "$RUNS/digits" --out "$DOCS/digits"
.venv/bin/python -m experiments.report "$RUNS/synthetic" "$RUNS/synthetic_slow" \
  --out "$DOCS/synthetic"
