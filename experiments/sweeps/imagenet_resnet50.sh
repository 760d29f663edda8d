#!/usr/bin/env bash
# ImageNet / ResNet-50, the published recipe on 32 workers (4 nodes x 8 GPUs): AccumAdam on
# alternating-exp-ring vs the all-reduce baseline (Adam lr 1e-3).
#
# GPU time: 90 epochs of ResNet-50 at global batch 1024 is ~6-8 h on 32 A100s, i.e. about
# 200-260 GPU-hours per run, ~500 GPU-hours for the pair (less on H100).
#
# Run the same command on each of the 4 nodes (torchrun's c10d rendezvous finds the others):
#   HEAD=node001 DATA=/data/imagenet bash experiments/sweeps/imagenet_resnet50.sh
set -euo pipefail
[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"  # edits mid-sweep are safe
cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
DATA=${DATA:?set DATA to the ImageNet root with train/ and val/ class folders}
HEAD=${HEAD:?set HEAD to the rendezvous host (the first node)}
NNODES=${NNODES:-4}
for exp in imagenet_resnet50 imagenet_resnet50_allreduce; do
  .venv/bin/torchrun --nnodes="$NNODES" --nproc_per_node=8 --rdzv-backend=c10d \
    --rdzv-endpoint="$HEAD:29500" --rdzv-id="$exp" --max-restarts=3 \
    train.py experiment="$exp" dataset.root="$DATA" checkpoint.every_steps=2000 "$@"
done
