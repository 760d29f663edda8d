"""Checkpoints of the wrapper over a device mesh, through ``torch.distributed.checkpoint``.

Each replica is a model of its own, so each is saved apart, under
``PATH/replica-<r>``, by its shard ranks together: the model's ``DTensor``
state dict (FSDP's) and the optimizer states of each parameter, made
``DTensor``s with the parameter's sharding, keyed by the parameter's name and
the state's name. The step counter and the LR scheduler's state go beside
them in ``extras.pt``. Nothing depends on the bucket layout or the shard
count, so a checkpoint loads into any shard count; a run of ``R'`` replicas
loads replica ``r`` from saved replica ``r mod R`` (replicas of a
decentralized run differ: none is averaged in), ``R`` being the save's own
count (a directory saved into again may hold an earlier save's other replicas),
and the saved replicas must all be of one step.

Gossip in flight is not saved: after a load, each bucket's gossip is launched
again from the loaded parameters before the next forward, so a resumed run of
the same mesh repeats an uninterrupted one exactly. Compressed gossip (whose
references would be lost) and outer optimizers (whose outer copies would) are
refused in one line.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["load_sharded_checkpoint", "save_sharded_checkpoint"]

_SEP = "/"  # between a parameter's name and its state's: names hold dots


def _check(wrapper: Any) -> None:
    if getattr(wrapper, "device_mesh", None) is None:
        raise ValueError(
            "this wrapper has no device_mesh; save it with its state_dict() and "
            "training_state_dict() instead"
        )
    engine = wrapper._engine
    if engine.gossip.compressor is not None:
        raise ValueError(
            f"compression={wrapper.compression.name!r}: sharded checkpoints do not keep the "
            "compressed gossip's references; use compression=None"
        )
    if engine.outer is not None:
        raise ValueError(
            "outer_optim_fn: sharded checkpoints do not keep the outer copies; train without "
            "an outer optimizer"
        )


def _replica_dir(path: str | os.PathLike[str], replica: int) -> str:
    return os.path.join(os.fspath(path), f"replica-{replica}")


def _saved_replica(path: str | os.PathLike[str], replica: int) -> tuple[str, dict[str, Any]]:
    """The directory replica ``replica`` loads from (saved replica ``replica mod R``), its extras.

    ``R`` is the replica count of the save in ``replica-0`` (every save writes it),
    not the number of ``replica-*`` folders: a directory saved into again by fewer
    replicas still holds the earlier save's others. Every replica of the save is
    checked to be of the same step on every rank, so that all ranks refuse alike.

    Raises:
        ValueError: No checkpoint, a replica missing, or replicas of different saves.
    """
    root = os.fspath(path)

    def extras_of(r: int) -> dict[str, Any] | None:
        file = os.path.join(_replica_dir(path, r), "extras.pt")
        return torch.load(file, weights_only=False) if os.path.isfile(file) else None

    head = extras_of(0)
    if head is None:
        raise ValueError(f"{root!r} holds no sharded checkpoint (replica-0 ...)")
    count = int(head["replicas"])
    for r in range(1, count):
        other = extras_of(r)
        if other is None or (other["step"], other["replicas"]) != (head["step"], count):
            what = "nothing" if other is None else f"step {other['step']} of {other['replicas']}"
            raise ValueError(
                f"{root!r}: replica-{r} holds {what}, replica-0 step {head['step']} of {count} "
                "replicas; these are not one save (save each checkpoint to a directory of its own)"
            )
    where = _replica_dir(path, replica % count)
    return where, extras_of(replica % count) or head


def _sharded_params(wrapper: Any) -> list[tuple[str, Any, torch.Tensor]]:
    """``(name, DTensor parameter, local leaf)`` of every trained parameter."""
    named = [(n, p) for n, p in wrapper._plain.named_parameters() if p.requires_grad]
    return [(n, p, leaf) for (n, p), leaf in zip(named, wrapper._engine.params)]


def _as_dtensor(local: torch.Tensor, like: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local,
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def _optimizers_by_leaf(engine: Any) -> dict[int, Any]:
    return {
        id(p): b.optimizer
        for b in engine.buckets or []
        for p in b.params
        if b.optimizer is not None
    }


def save_sharded_checkpoint(wrapper: Any, path: str | os.PathLike[str]) -> None:
    """Save a wrapper over a device mesh under ``path`` (every rank calls it).

    Args:
        wrapper: A :class:`~decent_dp.DecentralizedDataParallel` built with ``device_mesh``.
        path: A directory; replica ``r`` goes to ``path/replica-<r>``.

    Raises:
        ValueError: The wrapper has no device mesh, compresses its gossip or has an
            outer optimizer.
    """
    import torch.distributed.checkpoint as dcp

    _check(wrapper)
    engine = wrapper._engine
    engine.drain()
    state: dict[str, Any] = {"model": wrapper._plain.state_dict()}
    optims = _optimizers_by_leaf(engine)
    optim_state: dict[str, Any] = {}
    for name, param, leaf in _sharded_params(wrapper):
        opt = optims.get(id(leaf))
        for key, value in (opt.state.get(leaf, {}) if opt is not None else {}).items():
            if isinstance(value, torch.Tensor) and value.shape == leaf.shape and value.dim() > 0:
                optim_state[f"{name}{_SEP}{key}"] = _as_dtensor(value, param)
            elif isinstance(value, (torch.Tensor, int, float)):
                # a step count or another scalar: the same on every shard rank
                optim_state[f"{name}{_SEP}{key}"] = torch.as_tensor(value)
    state["optim"] = optim_state
    mesh = wrapper.device_mesh
    replica = mesh.get_local_rank("replicate")
    where = _replica_dir(path, replica)
    dcp.save(state, checkpoint_id=where, process_group=mesh["shard"].get_group())
    if mesh.get_local_rank("shard") == 0:
        buckets = engine.buckets or []
        scheduler = buckets[0].scheduler if buckets else None
        extras = {
            "step": engine.step_count,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "replicas": wrapper.replicas,
            "shards": wrapper.shards,
            "topology": wrapper.topology.name,
        }
        torch.save(extras, os.path.join(where, "extras.pt"))
    dist.barrier()


def load_sharded_checkpoint(wrapper: Any, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load :func:`save_sharded_checkpoint`'s ``path`` into a wrapper over a device mesh.

    Any shard count loads any other; replica ``r`` loads saved replica ``r mod R``.
    Call it on every rank, before the next forward; the gossip restarts from
    the loaded parameters.

    Args:
        wrapper: A :class:`~decent_dp.DecentralizedDataParallel` built with ``device_mesh``.
        path: The directory given to :func:`save_sharded_checkpoint`.

    Returns:
        The saved extras: ``step``, ``replicas``, ``shards``, ``topology``.

    Raises:
        ValueError: As :func:`save_sharded_checkpoint`, or ``path`` holds no replica, or
            replicas of different saves (another step or replica count than ``replica-0``).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    _check(wrapper)
    mesh = wrapper.device_mesh
    where, extras = _saved_replica(path, mesh.get_local_rank("replicate"))
    engine = wrapper._engine
    engine.drain()
    if engine.buckets is None:
        engine.build_buckets()  # the optimizers must exist to receive their states
    keys = dcp.FileSystemReader(where).read_metadata().state_dict_metadata
    params = _sharded_params(wrapper)
    optim_state: dict[str, Any] = {}
    by_name = {n: (p, leaf) for n, p, leaf in params}
    for key, meta in keys.items():
        if not key.startswith("optim.") or not isinstance(meta, TensorStorageMetadata):
            continue  # save_sharded_checkpoint writes tensors only
        name, _, skey = key[len("optim.") :].rpartition(_SEP)
        param, _ = by_name[name]
        if meta.size == param.shape and len(param.shape) > 0:
            optim_state[f"{name}{_SEP}{skey}"] = torch.zeros_like(param)
        else:
            optim_state[f"{name}{_SEP}{skey}"] = torch.zeros(meta.size, dtype=meta.properties.dtype)
    state = {"model": wrapper._plain.state_dict(), "optim": optim_state}
    dcp.load(state, checkpoint_id=where, process_group=mesh["shard"].get_group())
    with torch.no_grad():
        wrapper._plain.load_state_dict(state["model"])
    optims = _optimizers_by_leaf(engine)
    for key, value in state["optim"].items():
        name, _, skey = key.rpartition(_SEP)
        _, leaf = by_name[name]
        local = value.to_local() if hasattr(value, "to_local") else value
        optims[id(leaf)].state[leaf][skey] = local.clone()
    for b in engine.buckets or []:
        if b.scheduler is not None and extras["scheduler"] is not None:
            b.scheduler.load_state_dict(extras["scheduler"])
            # the groups' lr is not saved (only per-parameter states are): the schedule's last
            for group, lr in zip(b.optimizer.param_groups, b.scheduler.get_last_lr()):
                group["lr"] = lr
    engine.forget_gossip()
    engine.step_count = int(extras["step"])
    engine.relaunch = engine.step_count > 0
    return {k: extras[k] for k in ("step", "replicas", "shards", "topology")}
