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
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
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
.venv/bin/python -m experiments.report "$OUT"/*/ --out "$DOCS"
# the headline table: each compression level against uncompressed gossip on the same topology
.venv/bin/python - "$OUT" "$DOCS/summary.md" "$BANDWIDTH_GBPS" <<'PY'
import json, statistics, sys
from pathlib import Path

out, dest, bw = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
cells: dict = {}
for s in sorted(out.glob("*/summary.json")):
    d = json.loads(s.read_text())
    cells.setdefault((d["topology"], d["compression"]), []).append(d)
ms = lambda v: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0)
order = ["none", "bf16", "int8", "randk:0.1"]
lines = [
    "# Compressed gossip on digits: accuracy, bytes and emulated-link throughput",
    "",
    f"4 gloo workers, small CNN, 20 epochs (220 steps), emulated link {bw} Gb/s and 0.1 ms "
    "(network=custom); mean ± std over the seeds. Accuracy gap and ratios are against "
    "uncompressed gossip (`none`) on the same topology.",
    "",
    "| topology | compression | seeds | final eval/acc | gap (points) | comm/bytes_per_step "
    "| bytes vs none | samples/s | throughput vs none |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
]
for topo in sorted({t for t, _ in cells}):
    base = cells.get((topo, "none"), [])
    acc0 = statistics.mean(d["eval/acc"] for d in base) if base else None
    b0 = statistics.mean(d["comm/bytes_per_step"] for d in base) if base else None
    s0 = statistics.mean(d["perf/samples_per_s"] for d in base) if base else None
    for comp in order:
        runs = cells.get((topo, comp))
        if not runs:
            continue
        acc, acc_sd = ms([d["eval/acc"] for d in runs])
        b = statistics.mean(d["comm/bytes_per_step"] for d in runs)
        sps, sps_sd = ms([d["perf/samples_per_s"] for d in runs])
        gap = f"{100 * (acc - acc0):+.2f}" if acc0 is not None else "n/a"
        br = f"{b / b0:.3f}x" if b0 else "n/a"
        sr = f"{sps / s0:.2f}x" if s0 else "n/a"
        lines.append(
            f"| {topo} | {comp} | {len(runs)} | {acc:.4f} ± {acc_sd:.4f} | {gap} | {b:,.0f} "
            f"| {br} | {sps:.0f} ± {sps_sd:.0f} | {sr} |"
        )
dest.parent.mkdir(parents=True, exist_ok=True)
dest.write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
# the runs' small files, so the report can be redrawn (SKIP_RUNS=1 OUT=docs/results/compression/runs)
if [ "$OUT" != "$DOCS/runs" ]; then
  mkdir -p "$DOCS/runs"
  for d in "$OUT"/*/; do
    name=$(basename "$d")
    mkdir -p "$DOCS/runs/$name/.hydra"
    cp "$d/summary.json" "$d/metrics.jsonl" "$DOCS/runs/$name/"
    cp "$d/.hydra/overrides.yaml" "$DOCS/runs/$name/.hydra/"
  done
fi
