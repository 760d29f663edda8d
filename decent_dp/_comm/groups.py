"""The process groups of a topology's edges, created once, in the same order on every rank.

Only the wrapper creates process groups; a topology is pure data
(:mod:`decent_dp.topo`). Every function here that creates groups must be
called by every rank at the same point. :func:`communicators_per_rank` counts
them without creating any.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection
from typing import Any

import torch.distributed as dist

from ..topo import Edge, Topology

__all__ = [
    "communicators_per_rank",
    "default_group_timeout",
    "make_groups",
    "make_second_groups",
]


def _can_split() -> bool:
    """Whether each round's groups can come from one ``split_group`` of the default group.

    torch splits only NCCL communicators, and only from a default group bound to
    a device (``init_process_group(..., device_id=...)``, as
    :func:`decent_dp.utils.initialize_dist` does). ``new_group(...,
    use_local_synchronization=True)`` is no alternative: its non-members return
    before the group counter that salts the group names advances, so members of
    a later group can disagree on its name.
    """
    if not hasattr(dist, "split_group") or dist.get_backend() != "nccl":
        return False
    default = dist.distributed_c10d._get_default_group()
    return getattr(default, "bound_device_id", None) is not None


def default_group_timeout() -> datetime.timedelta | None:
    """The default group's timeout (``init_process_group(timeout=...)``), or ``None`` if unknown.

    torch gives a group made by ``new_group`` or ``split_group`` without a
    ``timeout`` torch's own default (30 min, 10 on NCCL), not the default
    group's: a lost peer of a gossip group would then block for that long.
    """
    default = dist.distributed_c10d._get_default_group()
    for device in getattr(default, "_device_types", []):
        try:
            return default._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return None


def make_groups(
    topology: Topology, rank: int, world_size: int, skip: Collection[tuple[int, ...]] = ()
) -> tuple[list[Any], list[Edge], list[Any]]:
    """The process group of every distinct multi-rank edge, created in the same order on every rank.

    Each round's edges are taken in sorted order (that of
    :func:`check_ranks_agree`'s digest), so a custom topology that lists the same
    edges in a rank-dependent order still creates its groups in one order.

    On NCCL with a bound device, the new edges of each round (disjoint, as
    every rank is in one edge per round) come from one ``split_group`` call,
    which splits the default communicator instead of building one per group
    from scratch; otherwise one ``new_group`` per distinct edge. Either way a
    rank holds a communicator only for the edges it belongs to:
    :func:`communicators_per_rank`.

    Every group gets the default group's timeout (:func:`default_group_timeout`).

    Args:
        topology: The topology.
        rank: This rank.
        world_size: The number of ranks.
        skip: The sorted ranks of edges that get no group here (those that
            :mod:`decent_dp._comm.hierarchical` exchanges on groups of its own).

    Returns:
        The groups created here (to destroy on release), this rank's edge in
        each round of the period, and the group of each of those edges
        (``None`` for an edge of one rank or a skipped one).
    """
    groups: dict[tuple[int, ...], Any] = {}
    created: list[Any] = []
    full = tuple(range(world_size))
    split = _can_split()
    timeout = default_group_timeout()
    for edges in topology.rounds:
        new: list[tuple[int, ...]] = []
        # in the canonical order the cross-rank digest checks, not the order the topology lists
        for key in sorted(tuple(sorted(e.ranks)) for e in edges):
            if len(key) < 2 or key in groups or key in skip:
                continue
            if key == full:
                groups[key] = dist.group.WORLD
            else:
                new.append(key)
                groups[key] = None
        if not new:
            continue
        if split:
            group = dist.split_group(split_ranks=[list(k) for k in new], timeout=timeout)
            mine = [k for k in new if rank in k]
            if mine:
                groups[mine[0]] = group
                created.append(group)
        else:
            for key in new:
                groups[key] = dist.new_group(list(key), timeout=timeout)
                created.append(groups[key])
    my_edges = [topology.get_edge(r, rank) for r in range(topology.period)]
    # kept beside the edges: the user's Topology object is not modified
    my_groups = [groups.get(tuple(sorted(e.ranks))) for e in my_edges]
    return created, my_edges, my_groups


def make_second_groups(
    topology: Topology | None,
    world_size: int,
    edges: list[Edge],
    groups: list[Any],
    with_world: bool,
) -> tuple[list[Any], dict[Any, Any]]:
    """A second process group of the same members for every group of more than two ranks.

    Two-phase exchanges (:mod:`decent_dp._comm.compressed`) on a backend other
    than NCCL start their second phase when their result is first waited
    for. When buckets of one step take different kinds of rounds on one group
    (the fragments of the outer optimizer), that wait can fall before or after
    another bucket's launch on the group depending on timing; the second
    phases therefore run on a group of their own, where they keep the order of
    their first phases. Created in one (sorted) order on every rank.

    Args:
        topology: The topology whose multi-rank edges get one, or ``None`` for none.
        world_size: The number of ranks.
        edges: This rank's edge in each round (from :func:`make_groups`).
        groups: Their process groups.
        with_world: Also give the default group (the outer rounds') one.

    Returns:
        The groups created (to destroy on release), and for each of this rank's
        groups that has one, its second group.
    """
    full = tuple(range(world_size))
    keys: set[tuple[int, ...]] = set()
    for round_edges in topology.rounds if topology is not None else []:
        keys.update(tuple(sorted(e.ranks)) for e in round_edges if len(e.ranks) > 2)
    if with_world and world_size > 2:
        keys.add(full)
    timeout = default_group_timeout()
    made = {key: dist.new_group(list(key), timeout=timeout) for key in sorted(keys)}
    seconds: dict[Any, Any] = {}
    for edge, group in zip(edges, groups):
        key = tuple(sorted(edge.ranks))
        if key in made and group is not None:
            seconds[group] = made[key]
    if full in made:
        seconds[dist.group.WORLD] = made[full]
    return list(made.values()), seconds


def communicators_per_rank(topology: Topology) -> list[int]:
    """How many process groups (communicators on NCCL) each rank belongs to for ``topology``.

    Counts the distinct multi-rank edges of the period that contain the rank,
    the whole world counted once (as the default group, which exists anyway).
    """
    mine: list[set[tuple[int, ...]]] = [set() for _ in range(topology.world_size)]
    for edges in topology.rounds:
        for edge in edges:
            key = tuple(sorted(edge.ranks))
            if len(key) >= 2:
                for r in key:
                    mine[r].add(key)
    return [len(s) for s in mine]
