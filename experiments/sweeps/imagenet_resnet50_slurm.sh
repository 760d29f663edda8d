#!/usr/bin/env bash
# ImageNet / ResNet-50 recipe on SLURM via the submitit launcher: 4 nodes x 8 GPUs = 32 ranks per
# job, one job per experiment. ~500 GPU-hours for the pair (see imagenet_resnet50.sh).
# Requeued or pre-empted jobs resume from the latest complete checkpoint in the same run dir.
#   DATA=/data/imagenet PARTITION=gpu bash experiments/sweeps/imagenet_resnet50_slurm.sh
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
DATA=${DATA:?set DATA to the ImageNet root}
PARTITION=${PARTITION:?set PARTITION to your SLURM partition}
.venv/bin/python train.py -m hydra/launcher=slurm \
  experiment=imagenet_resnet50,imagenet_resnet50_allreduce dataset.root="$DATA" \
  checkpoint.every_steps=2000 hydra.launcher.nodes=4 hydra.launcher.tasks_per_node=8 \
  hydra.launcher.gpus_per_node=8 hydra.launcher.partition="$PARTITION" "$@"
