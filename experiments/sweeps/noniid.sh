#!/usr/bin/env bash
# Non-IID sweep (CPU-sized, about 35 minutes on 2 cores): digits, 8 gloo workers, label-skewed
# Dirichlet shards with alpha in {0.1, 1.0}, 20 epochs (100 steps), 3 seeds.
#   ring, one-peer-exp and local-sgd (H=8) with SGD+momentum (optim=sgd) and with quasi-global
#   momentum (optim=qgm_sgd, same lr/momentum/decay), against the allreduce baseline (torch DDP, SGD).
# Writes docs/results/noniid/: summary.md (mean +- std over seeds, gap to allreduce per cell),
# and one experiments.report (table and plots) per alpha.
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
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
for a in 0.1 1.0; do
  .venv/bin/python -m experiments.report "$OUT"/gossip/*_alpha"$a"_* \
    "$OUT"/allreduce/*_alpha"$a"_* --target-acc 0.9 --out "$DOCS/alpha$a"
done
.venv/bin/python - "$OUT" "$DOCS/summary.md" <<'PY'
import json, statistics, sys
from pathlib import Path

out, dest = Path(sys.argv[1]), Path(sys.argv[2])
cells: dict = {}
for s in sorted(out.glob("*/*/summary.json")):
    topo, rest = s.parent.name.split("_", 1)
    optim, rest = rest.rsplit("_alpha", 1)
    alpha = rest.split("_seed")[0]
    cells.setdefault((alpha, topo, optim), []).append(json.loads(s.read_text())["eval/acc"])
ms = lambda v: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0)
lines = ["| alpha | topology | optim | seeds | eval/acc (mean ± std) | gap to allreduce (pts) |",
         "|---:|---|---|---:|---:|---:|"]
for alpha in sorted({k[0] for k in cells}, key=float):
    base = ms(cells[(alpha, "allreduce", "sgd")])[0]
    for (a, topo, optim), accs in sorted(cells.items(), key=lambda kv: (kv[0][1] != "allreduce", kv[0])):
        if a != alpha:
            continue
        m, sd = ms(accs)
        lines.append(f"| {a} | {topo} | {optim} | {len(accs)} | {100*m:.2f} ± {100*sd:.2f} | "
                     f"{100*(m-base):+.2f} |")
dest.write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
