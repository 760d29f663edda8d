#!/usr/bin/env bash
# CIFAR-10 / ResNet-18 on SLURM through Hydra's submitit launcher: one SLURM job per topology,
# each with NODES x 8 tasks (one rank per GPU). GPU time as in cifar10_resnet18.sh (~75 GPU-hours
# for both sizes).
#   DATA=/data/cifar NODES=1 PARTITION=gpu bash experiments/sweeps/cifar10_resnet18_slurm.sh   # 8 workers
#   DATA=/data/cifar NODES=2 PARTITION=gpu bash experiments/sweeps/cifar10_resnet18_slurm.sh   # 16 workers
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
DATA=${DATA:?set DATA to the CIFAR-10 root}
NODES=${NODES:-1}
PARTITION=${PARTITION:?set PARTITION to your SLURM partition}
TOPOLOGIES=${TOPOLOGIES:-complete,ring,one-peer-exp,alternating-exp-ring,allreduce}
EXTRA=()
[ "$NODES" = 1 ] && EXTRA=(topology.local_world_size=4)   # 2 simulated nodes for alternating-exp-ring
.venv/bin/python train.py -m hydra/launcher=slurm experiment=cifar10_resnet18 \
  dataset.root="$DATA" topology="$TOPOLOGIES" \
  hydra.launcher.nodes="$NODES" hydra.launcher.tasks_per_node=8 hydra.launcher.gpus_per_node=8 \
  hydra.launcher.timeout_min=720 hydra.launcher.partition="$PARTITION" "${EXTRA[@]}" "$@"
