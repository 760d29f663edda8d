#!/usr/bin/env bash
# The CPU-sized version of the paper sweeps (2 cores: about 20 minutes in all), 4 gloo workers,
# every topology plus allreduce; alternating-exp-ring as 2 simulated nodes of 2 ranks.
#  1. digits (embedded, real data): accuracy and consensus, without and with emulated 25 Gb/s Ethernet;
#  2. synthetic CIFAR-shaped throughput run (ResNet-18, 3x32x32, random labels: speed only),
#     without emulation, with emulated 25 Gb/s Ethernet, and with an emulated 0.5 Gb/s link.
#     A CPU step is ~50x slower than a GPU step, so 25 Gb/s hides behind CPU compute; 0.5 Gb/s
#     restores the communication/compute ratio that a GPU cluster sees on 25 Gb/s Ethernet.
# Writes report.md and the plots to docs/results/.
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
OUT=${OUT:-multirun/cpu_small}
TOPOS=complete,ring,one-peer-exp,alternating-exp-ring,random-matching,allreduce
run() {
  .venv/bin/torchrun --standalone --nproc_per_node=4 train.py -m logger=none log.progress=false \
    topology="$TOPOS" topology.local_world_size=2 "$@"
}
run hydra.sweep.dir="$OUT/digits" network=none,ethernet_25g log.consensus_every=5
SYN=(dataset=synthetic model=resnet18_cifar train.batch_size=16 train.max_steps=30
     log.every=5 log.consensus_every=10)
run hydra.sweep.dir="$OUT/synthetic" "${SYN[@]}" network=none,ethernet_25g
run hydra.sweep.dir="$OUT/synthetic_slow" "${SYN[@]}" network=custom network.latency_ms=0.02 \
  network.bandwidth_gbps=0.5
.venv/bin/python -m experiments.report "$OUT/digits" "$OUT/synthetic" "$OUT/synthetic_slow" \
  --out docs/results
