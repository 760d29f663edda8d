"""Comparing the per-rank models of two checkpoints."""

from __future__ import annotations

import torch

from experiments.train.checkpoint import CheckpointInfo, load_shard

__all__ = ["assert_same_models", "models"]


def models(info: CheckpointInfo) -> list[dict[str, torch.Tensor]]:
    """Every rank's model state dict in the checkpoint ``info``."""
    return [load_shard(info, rank)["model"] for rank in range(info.world_size)]


def assert_same_models(a: CheckpointInfo, b: CheckpointInfo) -> None:
    """Both checkpoints hold the same step, world size and, bit for bit, the same models."""
    assert a.step == b.step and a.world_size == b.world_size
    for rank, (sa, sb) in enumerate(zip(models(a), models(b))):
        assert sa.keys() == sb.keys()
        for key in sa:
            assert torch.equal(sa[key], sb[key]), f"rank {rank} {key}"
