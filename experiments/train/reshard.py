"""Resuming with another world size or topology: the global average of a checkpoint.

Per-rank shards fit only the layout that wrote them. :func:`check_compatible`
says whether a run can resume each rank from its own shard; when it cannot and
``checkpoint.allow_reshard`` is set, every worker starts from
:func:`global_average_from_checkpoint` instead.

Example::

    info = latest_checkpoint(root)
    if check_compatible(info, world_size=ws, topology="ring", allow_reshard=True):
        model.load_state_dict(global_average_from_checkpoint(info))
    else:
        model.load_state_dict(load_shard(info, rank)["model"])
"""

from __future__ import annotations

from typing import Any

import torch

from experiments.train.checkpoint import CheckpointInfo, load_shard

__all__ = ["check_compatible", "global_average_from_checkpoint"]


def check_compatible(
    info: CheckpointInfo, *, world_size: int, topology: str, allow_reshard: bool
) -> bool:
    """Check that this run can resume each rank from its own shard.

    Args:
        info: The checkpoint to resume from.
        world_size: This run's world size.
        topology: This run's topology name.
        allow_reshard: Whether a mismatch may be resolved by restarting every worker from
            the global average (:func:`global_average_from_checkpoint`).

    Returns:
        ``False`` when world size and topology match (load per-rank shards); ``True``
        when they differ and ``allow_reshard`` is set (load the global average).

    Raises:
        ValueError: If they differ and ``allow_reshard`` is false.
    """
    ckpt_world_size = info.meta.get("world_size")
    ckpt_topology = info.meta.get("topology")
    if ckpt_world_size == world_size and ckpt_topology == topology:
        return False
    if allow_reshard:
        return True
    raise ValueError(
        f"checkpoint at {info.path} was written by world_size={ckpt_world_size} "
        f"topology={ckpt_topology}; this run has world_size={world_size} "
        f"topology={topology}; set checkpoint.allow_reshard=true to restart the workers "
        "from the global average"
    )


def global_average_from_checkpoint(info: CheckpointInfo, key: str = "model") -> dict[str, Any]:
    """Average the ``shard[key]`` state dicts of every rank of a checkpoint.

    Floating-point (and complex) tensors are averaged elementwise, accumulating in at
    least float32 and cast back to their dtype; other entries (integer buffers such as
    ``num_batches_tracked``, non-tensors) are taken from rank 0. Shards are loaded one at
    a time, so memory holds one shard plus the running sum.

    Args:
        info: The checkpoint to average.
        key: The entry of each shard that holds the state dict.

    Returns:
        The averaged state dict, in rank 0's key order.

    Raises:
        ValueError: If a shard lacks ``key``, or the shards' keys, shapes or dtypes differ,
            or a shard cannot be loaded (see :func:`load_shard`).
    """
    total: dict[str, Any] = {}
    dtypes: dict[str, torch.dtype] = {}
    for rank in range(info.world_size):
        state = _state_of(info, rank, key)
        if rank == 0:
            for name, value in state.items():
                if _averaged(value):
                    dtypes[name] = value.dtype
                    total[name] = value.to(_accumulation_dtype(value.dtype), copy=True)
                else:
                    total[name] = value
            continue
        if set(state) != set(total):
            missing = sorted(set(total) ^ set(state))[:5]
            raise ValueError(
                f"shard {rank} of {info.path} has different {key!r} keys than shard 0 "
                f"(e.g. {missing})"
            )
        for name in dtypes:
            value = state[name]
            if not isinstance(value, torch.Tensor) or value.shape != total[name].shape:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
                raise ValueError(
                    f"{key}[{name!r}] of shard {rank} in {info.path} is {shape}, "
                    f"shard 0 has {tuple(total[name].shape)}"
                )
            if value.dtype != dtypes[name]:
                raise ValueError(
                    f"{key}[{name!r}] of shard {rank} in {info.path} is {value.dtype}, "
                    f"shard 0 has {dtypes[name]}"
                )
            total[name].add_(value)
        del state
    for name, dtype in dtypes.items():
        total[name] = total[name].div_(info.world_size).to(dtype)
    return total


def _state_of(info: CheckpointInfo, rank: int, key: str) -> dict[str, Any]:
    shard = load_shard(info, rank)
    if key not in shard:
        raise ValueError(
            f"shard {rank} of {info.path} has no {key!r} entry; it has {sorted(shard)}"
        )
    state = shard[key]
    if not isinstance(state, dict):
        raise ValueError(
            f"{key!r} of shard {rank} in {info.path} is a {type(state).__name__}, not a dict"
        )
    return state


def _averaged(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_complex:
        return torch.promote_types(dtype, torch.complex64)
    return torch.promote_types(dtype, torch.float32)
