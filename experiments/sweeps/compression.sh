#!/usr/bin/env bash
# Compressed gossip on digits (CPU-sized, about 30 minutes on 2 cores): 4 gloo workers, 20 epochs
# (220 steps), ring and one-peer-exp at every compression level (none, bf16, int8, randk with
# ratio 0.1), 3 seeds, all under an emulated link (network=custom) of 5 Mb/s and 0.1 ms: the
# small CNN's uncompressed gossip (213 KB per step) then takes ~0.34 s, about 5x the compute of
# a step, so the link decides the step time and perf/samples_per_s shows what compression buys.
# The emulation only delays the gossip's completion: accuracy is that of an unemulated run.
# Writes docs/results/compression/ (report.md, plots, and the runs' metrics and summaries).
#   bash experiments/sweeps/compression.sh            # runs, then the report
#   SKIP_RUNS=1 bash experiments/sweeps/compression.sh # the report from existing runs
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-multirun/compression}
DOCS=${DOCS:-docs/results/compression}
BANDWIDTH_GBPS=${BANDWIDTH_GBPS:-0.005}
if [ "${SKIP_RUNS:-0}" != 1 ]; then
  OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=4 train.py -m \
    logger=none log.progress=false log.consensus_every=20 dataset=digits \
    train.seed=0,1,2 topology=ring,one-peer-exp compression=none,bf16,int8,randk \
    network=custom network.latency_ms=0.1 network.bandwidth_gbps="$BANDWIDTH_GBPS" \
    hydra.sweep.dir="$OUT" \
    'hydra.sweep.subdir=${topology.name}_${compression.name}_seed${train.seed}' "$@"
fi
.venv/bin/python -m experiments.report "$OUT"/* --out "$DOCS"
