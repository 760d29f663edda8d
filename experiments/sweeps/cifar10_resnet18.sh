#!/usr/bin/env bash
# CIFAR-10 / ResNet-18: every topology plus the all-reduce baseline, at 8 and 16 workers,
# with torchrun on one or two 8-GPU nodes.
#
# GPU time: about 100 epochs x 5 runs x 2 sizes. One run is ~0.6 GPU-hours per 8 A100/H100
# GPUs (~5 GPU-hours); the whole sweep is ~75 GPU-hours (8 workers: 5 x 8 x ~0.9 h,
# 16 workers: 5 x 16 x ~0.5 h).
#
#   DATA=/data/cifar bash experiments/sweeps/cifar10_resnet18.sh            # 8 workers, this node
#   NNODES=2 HEAD=node001 DATA=/data/cifar bash experiments/sweeps/cifar10_resnet18.sh   # 16 workers
#                                                   (run the same command on both nodes)
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
DATA=${DATA:?set DATA to the CIFAR-10 root (with cifar-10-batches-py, or add dataset.download=true)}
NNODES=${NNODES:-1}
HEAD=${HEAD:-localhost}
TOPOLOGIES=${TOPOLOGIES:-complete,ring,one-peer-exp,alternating-exp-ring,allreduce}
if [ "$NNODES" = 1 ]; then
  # alternating-exp-ring needs at least two nodes: simulate 2 nodes of 4 GPUs on one machine
  LAUNCH=(--standalone --nproc_per_node=8)
  EXTRA=(topology.local_world_size=4)
else
  LAUNCH=(--nnodes="$NNODES" --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint="$HEAD:29500")
  EXTRA=()
fi
.venv/bin/torchrun "${LAUNCH[@]}" train.py -m experiment=cifar10_resnet18 \
  dataset.root="$DATA" topology="$TOPOLOGIES" "${EXTRA[@]}" "$@"
