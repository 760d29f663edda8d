"""What the wrapper does once, across ranks: agree, broadcast, create groups, plan buckets.

Every function here issues its collectives in the same order on every rank,
so each must be called by every rank at the same point.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .topo import Edge, Topology

__all__ = ["broadcast_from_rank0", "check_ranks_agree", "make_groups", "plan_buckets"]


def check_ranks_agree(
    named: list[tuple[str, nn.Parameter]], topology: Topology, world_size: int
) -> None:
    """Raise ``ValueError`` on every rank if any rank has another model or topology."""
    sig = {
        "params": [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in named],
        "topology": (topology.name, topology.world_size, topology.period),
    }
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, sig)
    ref = gathered[0]
    for r, other in enumerate(gathered):
        if other == ref:
            continue
        if other["topology"] != ref["topology"]:
            raise ValueError(
                f"ranks disagree on the topology: rank 0 has {ref['topology']}, rank {r} has {other['topology']}"
            )
        a, b = ref["params"], other["params"]
        for i in range(max(len(a), len(b))):
            pa = a[i] if i < len(a) else None
            pb = b[i] if i < len(b) else None
            if pa != pb:
                raise ValueError(
                    f"model parameters differ across ranks: rank 0 has {pa}, rank {r} has {pb} "
                    f"(parameter #{i}: name, shape, dtype, requires_grad); every rank must "
                    "build the same model"
                )


@torch.no_grad()
def broadcast_from_rank0(module: nn.Module, world_size: int) -> None:
    """Start every rank from rank 0's parameters and buffers."""
    if world_size == 1:
        return
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=0)


def make_groups(
    topology: Topology, rank: int, world_size: int
) -> tuple[list[Any], list[Edge], list[Any]]:
    """One process group per distinct multi-rank edge, created in the same order on every rank.

    Returns:
        The groups created here (to destroy on release), this rank's edge in
        each round of the period, and the group of each of those edges
        (``None`` for an edge of one rank).
    """
    groups: dict[tuple[int, ...], Any] = {}
    created: list[Any] = []
    full = tuple(range(world_size))
    for edges in topology.rounds:
        for edge in edges:
            key = tuple(sorted(edge.ranks))
            if len(key) < 2 or key in groups:
                continue
            if key == full:
                groups[key] = dist.group.WORLD
            else:
                groups[key] = dist.new_group(list(key))
                created.append(groups[key])
    my_edges = [topology.get_edge(r, rank) for r in range(topology.period)]
    # kept beside the edges: the user's Topology object is not modified
    my_groups = [groups.get(tuple(sorted(e.ranks))) for e in my_edges]
    return created, my_edges, my_groups


def plan_buckets(
    order: list[int], params: list[nn.Parameter], bucket_bytes: int, world_size: int
) -> list[list[int]]:
    """Parameter indices per bucket, in rank 0's gradient order, cut at the size target.

    Args:
        order: The parameter indices in the order this rank's first backward
            produced their gradients.
        params: The trained parameters.
        bucket_bytes: Target bucket size in bytes; 0 gives one bucket per parameter.
        world_size: The number of ranks.
    """
    # the gradient order can differ between ranks (rank-dependent branches): use rank 0's
    shared: list[Any] = [order]
    if world_size > 1:
        dist.broadcast_object_list(shared, src=0)
    recorded = list(shared[0])
    seen = set(recorded)
    full_order = recorded + [i for i in reversed(range(len(params))) if i not in seen]
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in full_order:
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if current:
            head = params[current[0]]
            if head.dtype != p.dtype or head.device != p.device or size + nbytes > bucket_bytes:
                groups.append(current)
                current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        groups.append(current)
    return groups
