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

from typing import Any

from torch import nn

__all__ = ["build_mesh", "check_shard_size", "shard_model"]


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
