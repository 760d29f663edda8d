#!/usr/bin/env bash
# docs/cluster.md's one-torchrun-per-node commands, run for real on the testbed: 2 hosts x 2
# processes (gloo, CPU), each host given a hostname of its own as cluster nodes have.
#   1. topology=hierarchical, checkpoints into a run directory both hosts see;
#   2. the same run directory with another topology: resharded from the global average;
#   3. a hang: one rank stopped (SIGSTOP) under dist.timeout_s=30, and py-spy's dump of a
#      rank that waits for it (PYSPY=path/to/py-spy; skipped without it).
# As root:  bash experiments/network/cluster_check.sh   (PREFIX=tbcl OUT=docs/results/cluster)
# Writes OUT/check.txt (this transcript) and OUT/runs/<run>/summary.json.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=$ROOT/.venv/bin/python
PREFIX=${PREFIX:-tbcl}
OUT=$(realpath -m "${OUT:-$ROOT/docs/results/cluster}")
SHARED=$(mktemp -d /tmp/cluster-check.XXXXXX)  # stands for the cluster's shared filesystem
PYSPY=${PYSPY:-$(command -v py-spy || true)}
mkdir -p "$OUT/runs"
cd "$ROOT"
export PYTHONPATH=$ROOT
$PY -m experiments.network.testbed --prefix "$PREFIX" up --hosts 2 --procs-per-host 2 --rate 1gbit || exit 1
trap '$PY -m experiments.network.testbed --prefix "$PREFIX" down; rm -rf "$SHARED"' EXIT

node() {  # node INDEX RDZV_ID LOG OVERRIDES...: the guide's command on one node, in the background
  local i=$1 id=$2 log=$3; shift 3
  ip netns exec "$PREFIX-h$i" unshare --uts sh -c "hostname $PREFIX-h$i; cd $ROOT; \
    export PYTHONPATH=$ROOT GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0; \
    exec $ROOT/.venv/bin/torchrun --nnodes 2 --nproc-per-node 2 \
      --rdzv-backend c10d --rdzv-endpoint $PREFIX-h0:29500 --rdzv-id $id train.py $*" >"$log" 2>&1 &
}
pair() {  # pair NAME OVERRIDES...: both nodes, then wait for both
  local name=$1; shift
  node 0 "$name" "$SHARED/$name-node0.log" "$@"; local p0=$!
  node 1 "$name" "$SHARED/$name-node1.log" "$@"; local p1=$!
  wait $p0; local r0=$?; wait $p1; local r1=$?
  echo "$name: node 0 exit $r0, node 1 exit $r1"
}
show() {  # show RUN_DIR NAME: summary keys and checkpoints; keep the summary
  $PY - "$1" <<'PY'
import json, pathlib, sys
run = pathlib.Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
keys = ("world_size", "topology", "train/steps", "resumed_from_step", "eval/acc", "comm/bytes_per_step")
print({k: s.get(k) for k in keys})
for d in sorted((run / "checkpoints").iterdir()):
    print(" ", d.name, sorted(p.name for p in d.iterdir()) if d.name.startswith("step_") else "")
PY
  mkdir -p "$OUT/runs/$2" && cp "$1/summary.json" "$OUT/runs/$2/summary.json"
}
Q="logger=none log.progress=false"
RUN=$SHARED/runs/demo
{
echo "## 1. topology=hierarchical, checkpoints in a run directory both hosts see"
pair demo $Q topology=hierarchical train.max_steps=40 checkpoint.every_steps=20 hydra.run.dir=$RUN
show "$RUN" hierarchical
echo
echo "## 2. the same run directory, topology=one-peer-exp checkpoint.allow_reshard=true"
pair reshard $Q topology=one-peer-exp train.max_steps=60 checkpoint.every_steps=20 \
  checkpoint.allow_reshard=true hydra.run.dir=$RUN
grep -h "resharded\|moved the checkpoints" "$SHARED/reshard-node0.log" | sed 's/^\[[^]]*\]//' | awk '!seen[$0]++'
show "$RUN" resharded
echo
echo "## 3. one rank stopped mid-run, dist.timeout_s=30"
HANG="$Q topology=hierarchical train.max_steps=100000 log.every=10 dist.timeout_s=30 hydra.run.dir=$SHARED/runs/hang"
node 0 hang "$SHARED/hang-node0.log" $HANG; p0=$!
node 1 hang "$SHARED/hang-node1.log" $HANG; p1=$!
for _ in $(seq 300); do
  [ "$( { wc -l < "$SHARED/runs/hang/metrics.jsonl"; } 2>/dev/null || echo 0)" -ge 3 ] && break
  sleep 1
done
workers() { ps -o pid=,args= -p "$(ip netns pids "$PREFIX-h$1" | paste -sd,)" | grep train.py | grep -v torchrun | awk '{print $1}'; }
victim=$(workers 1 | tail -1); waiter=$(workers 0 | head -1)
stopped=$(date +%s); kill -STOP "$victim"; echo "SIGSTOP to a rank of node 1"
sleep 8
if [ -n "$PYSPY" ]; then
  echo "py-spy dump --pid <a rank of node 0>, 8 s later (its main thread):"
  "$PYSPY" dump --pid "$waiter" | sed -n '/MainThread/,/^$/p' | head -9
fi
wait $p0; r0=$?; echo "node 0 exit $r0, $(( $(date +%s) - stopped )) s after the SIGSTOP"
kill -CONT "$victim" 2>/dev/null; wait $p1; echo "node 1 exit $?"
grep -h "error on rank" "$SHARED"/hang-node*.log | awk '!seen[$0]++'
} 2>&1 | tee "$OUT/check.txt"
