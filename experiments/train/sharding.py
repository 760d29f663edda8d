"""``train.shard_size``: the 2-D device mesh and FSDP2 over its shard dimension.

With ``train.shard_size=S`` (``S > 1``, dividing the world size) the ranks form
a ``DeviceMesh`` of ``(world / S, S)`` with dimensions ``("replicate",
"shard")``: replica ``r`` is ranks ``r S .. r S + S - 1``, consecutive local
ranks, so that a replica stays on one host when ``S`` divides the processes per
host and FSDP's all-gathers and reduce-scatters stay on the host's links. The
model is ``fully_shard``-ed over ``mesh["shard"]`` (each of its Transformer
blocks, or each child holding parameters, then the root) and the wrapper gets
``device_mesh=mesh``: the topology acts between the replicas.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from decent_dp import save_sharded_checkpoint

__all__ = [
    "SHARDED_DIR",
    "build_mesh",
    "check_shard_size",
    "check_sharded_resume",
    "save_replicas",
    "shard_model",
    "sharded_layout",
]


def check_shard_size(shard_size: Any, world_size: int) -> None:
    """One line naming ``train.shard_size`` unless it is an int >= 1 dividing the world size.

    Raises:
        ValueError: Otherwise.
    """
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(
            f"train.shard_size={shard_size!r} is invalid; it must be an integer >= 1 "
            "(1: every rank holds the whole model)"
        )
    if world_size % shard_size:
        raise ValueError(
            f"train.shard_size={shard_size} does not divide the world size {world_size}; "
            "allowed: a divisor of the number of ranks"
        )


def build_mesh(shard_size: int, world_size: int, device_type: str) -> Any:
    """The ``(world / S, S)`` mesh with dimensions ``("replicate", "shard")``."""
    from torch.distributed.device_mesh import init_device_mesh

    check_shard_size(shard_size, world_size)
    return init_device_mesh(
        device_type,
        (world_size // shard_size, shard_size),
        mesh_dim_names=("replicate", "shard"),
    )


def shard_model(model: nn.Module, mesh: Any, hsdp: bool = False) -> nn.Module:
    """``fully_shard`` over ``mesh["shard"]``: each block (or child with parameters), then the root.

    A model with a ``blocks`` list (the GPT) has each block sharded; any other
    has each direct child that holds parameters sharded. The root takes the
    rest (embeddings, tied heads, final norms).

    Args:
        model: The model, on its device.
        mesh: The ``("replicate", "shard")`` mesh.
        hsdp: Shard over the whole 2-D mesh instead: torch's HSDP, which also
            all-reduces the gradients between the replicas (``topology=allreduce``).
    """
    from torch.distributed.fsdp import fully_shard

    shard = mesh if hsdp else mesh["shard"]
    blocks = getattr(model, "blocks", None)
    units = list(blocks) if isinstance(blocks, nn.ModuleList) else list(model.children())
    for unit in units:
        if any(True for _ in unit.parameters()):
            fully_shard(unit, mesh=shard)
    fully_shard(model, mesh=shard)
    return model


# ------------------------------------------------------------------ checkpoints

SHARDED_DIR = "dcp"  # a checkpoint's replicas, beside its per-rank shards


def sharded_layout(train_step: Any) -> dict[str, Any] | None:
    """``{"replicas": R, "shards": S}`` of a wrapper over a mesh; ``None`` for whole models."""
    mesh = getattr(train_step, "device_mesh", None)
    if mesh is None or not train_step.decentralized:
        return None
    shards = int(mesh["shard"].size())
    return {"replicas": int(mesh.size()) // shards, "shards": shards}


def save_replicas(wrapper: Any, path: Path) -> None:
    """Write every replica of ``wrapper`` under ``path`` (every rank calls it), durably.

    ``torch.distributed.checkpoint`` fsyncs its own files; the extras beside them
    (step, scheduler) are fsynced here, so that once the caller's index is written
    everything it points at is on disk.
    """
    save_sharded_checkpoint(wrapper, path)
    mesh = wrapper.device_mesh
    if mesh.get_local_rank("shard") == 0:
        where = path / f"replica-{mesh.get_local_rank('replicate')}"
        for file in where.iterdir():
            if file.is_file():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        for folder in (where, path):
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def check_sharded_resume(
    saved: dict[str, Any] | None,
    here: dict[str, Any] | None,
    where: Path,
    allow_reshard: bool,
    topologies: tuple[str, str] = ("", ""),
) -> bool:
    """Whether a checkpoint's replicas load into this run's; one line when they cannot.

    Args:
        saved: The checkpoint's layout (``meta["sharded"]``), ``None`` for whole models.
        here: This run's layout (:func:`sharded_layout`).
        where: The checkpoint directory, for the messages.
        allow_reshard: ``checkpoint.allow_reshard``.
        topologies: The checkpoint's topology and this run's.

    Returns:
        ``False`` for the same layout and topology (each rank resumes bit for bit),
        ``True`` for another replica or shard count or topology, which
        ``load_sharded_checkpoint`` reshards into.

    Raises:
        ValueError: One format into the other, or another layout without ``allow_reshard``.
    """
    if saved is None and here is not None:
        raise ValueError(
            f"checkpoint at {where} holds whole models per rank; train.shard_size > 1 cannot "
            "resume it: allowed: train.shard_size=1, or a new checkpoint.dir"
        )
    if saved is not None and here is None:
        raise ValueError(
            f"checkpoint at {where} holds sharded replicas (train.shard_size="
            f"{saved['shards']}); allowed: train.shard_size > 1 with a decentralized topology"
        )
    if saved is None or here is None:
        return False
    was = (int(saved["replicas"]), int(saved["shards"]), topologies[0])
    now = (int(here["replicas"]), int(here["shards"]), topologies[1])
    if was == now:
        return False
    if not allow_reshard:
        raise ValueError(
            f"checkpoint at {where} was written by {was[0]} replicas x {was[1]} shards "
            f"topology={was[2]}; this run has {now[0]} x {now[1]} topology={now[2]}; set "
            f"checkpoint.allow_reshard=true to load replica r from saved replica r mod {was[0]}"
        )
    return True
