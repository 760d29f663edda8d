#!/usr/bin/env bash
# Every topology's speed measured on a real network (as root): hosts as network namespaces with
# links capped by tbf (experiments/network/testbed), real TCP, one torchrun per host. For each
# shape and link rate, each arm trains on the testbed, then the same configuration runs on
# loopback under the emulator (network=custom at the same rate), and once without communication
# (the simulator's compute time). PART=calibrate first measures the models' calibration terms
# on the testbed's pair exchanges (calibration.json); once it exists, every cell is also
# emulated with them (calibrated/). Writes docs/results/network/ (table.md, table.json, plots,
# and each run's summary, metrics and link counters under runs/). A cell whose runs exist is
# skipped, so an interrupted sweep resumes; AGAIN=1 reruns them. About 2 hours on 2 cores
# for the whole grid; PART picks one piece:
#   bash experiments/sweeps/network.sh                  # every PART, then the table
#   PART=calibrate bash experiments/sweeps/network.sh   # the calibration terms (3-4 minutes)
#   PART=digits4 bash experiments/sweeps/network.sh     # digits, 4 hosts x 1, three rates
#   PART=repeats bash experiments/sweeps/network.sh     # 4 cells twice more: the wire's spread
#   PART=table bash experiments/sweeps/network.sh       # the table from the committed runs
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
PART=${PART:-all}
OUT=${OUT:-docs/results/network}
RATES=${RATES:-10mbit 100mbit 1gbit}
AGAIN=${AGAIN:+--again}
case "$PART" in all|calibrate)
  .venv/bin/python -m experiments.network.calibrate run --out "$OUT" ;; esac
CALIBRATED=$([ -f "$OUT/calibration.json" ] && echo --calibrated || true)
study() { .venv/bin/python -m experiments.network.wire_study run --out "$OUT" $AGAIN $CALIBRATED "$@"; }
ARMS="allreduce complete ring one-peer-exp local-sgd diloco streaming-diloco ring-int8 ring-bf16"
case "$PART" in all|digits4)
  study --model digits --hosts 4 --rates $RATES --arms $ARMS ;; esac
case "$PART" in all|digits8)
  study --model digits --hosts 8 --rates $RATES --arms allreduce ring one-peer-exp ;; esac
case "$PART" in all|digits4x2)
  study --model digits --hosts 4 --procs-per-host 2 --rates $RATES \
    --arms allreduce one-peer-exp alternating-exp-ring hierarchical ;; esac
case "$PART" in all|digits2x4)
  study --model digits --hosts 2 --procs-per-host 4 --rates $RATES \
    --arms allreduce one-peer-exp alternating-exp-ring hierarchical ;; esac
case "$PART" in all|lm4)
  [ -f data/stdlib-bpe/train.bin ] || .venv/bin/python -m experiments.data.prepare_tokens \
    --stdlib --out data/stdlib-bpe --max-bytes 2000000 --vocab-size 1024
  study --model lm_quick --hosts 4 --rates 100mbit 1gbit --arms allreduce one-peer-exp local-sgd diloco ;; esac
case "$PART" in all|repeats)  # the wire's own run-to-run spread: 100 Mb/s twice more, wire only
  for r in r1 r2; do
    study --out "$OUT/repeats/$r" --no-emulated --model digits --hosts 4 --rates 100mbit \
      --arms allreduce complete ring one-peer-exp
  done ;; esac
case "$PART" in all|digits4-5mbit)
  study --model digits --hosts 4 --rates 5mbit --arms allreduce ring one-peer-exp ring-int8 ;; esac
.venv/bin/python -m experiments.network.wire_study table --out "$OUT"
