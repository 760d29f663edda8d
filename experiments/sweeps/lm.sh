#!/usr/bin/env bash
# Language models on the embedded corpus (the Python standard library's own sources, BPE 1024):
# a tiny GPT (experiment=lm_quick) on 4 CPU gloo workers, 6 topologies x 3 seeds at the same
# token budget. About 25 minutes on 2 cores. Writes report.md and the plots to docs/results/lm_quick/.
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
OUT=${OUT:-multirun/lm}
DATA=data/stdlib-bpe
test -f "$DATA/train.bin" || .venv/bin/python -m experiments.data.prepare_tokens --stdlib \
  --out "$DATA" --max-bytes 2000000 --vocab-size 1024
.venv/bin/torchrun --standalone --nproc_per_node=4 train.py -m experiment=lm_quick \
  log.progress=false topology=allreduce,complete,ring,one-peer-exp,local-sgd,base-k \
  train.seed=0,1,2 hydra.sweep.dir="$OUT"
.venv/bin/python -m experiments.report "$OUT" --out docs/results/lm_quick
