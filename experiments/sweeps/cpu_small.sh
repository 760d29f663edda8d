#!/usr/bin/env bash
# The CPU-sized version of the paper sweeps, runnable on a laptop (2 cores: ~15 minutes in all).
# 4 workers with gloo; every topology plus allreduce; each with and without emulated 25 Gb/s
# Ethernet; on the embedded digits dataset and on a CIFAR-shaped synthetic throughput run.
# alternating-exp-ring runs as 2 simulated nodes of 2 ranks (topology.local_world_size=2).
# Writes the report to docs/results/ (report.md + PNGs).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-multirun/cpu_small}
TOPOS=complete,ring,one-peer-exp,alternating-exp-ring,random-matching,allreduce
run() { .venv/bin/torchrun --standalone --nproc_per_node=4 train.py -m logger=none log.progress=false \
  topology="$TOPOS" topology.local_world_size=2 "$@"; }
run hydra.sweep.dir="$OUT/digits" network=none,ethernet_25g
run hydra.sweep.dir="$OUT/synthetic" dataset=synthetic model=resnet18_cifar train.batch_size=16 \
  train.max_steps=30 log.every=5 log.consensus_every=10 network=none,ethernet_25g
.venv/bin/python -m experiments.report "$OUT/digits" "$OUT/synthetic" --out docs/results
