"""A member lost between quorums: the rest of its edge averages among themselves.

At each rebuild the elastic wrapper makes, for every edge of more than two
processes, the group of its members less each one (:func:`survivor_groups`).
When an exchange of such an edge fails (a member died), its survivors agree on
the quorum's store which member is lost (:func:`find_lost`) and exchange
``x(t-1)`` again on the group without it (:func:`exchange_again`). The lost
member's weight goes to the survivors of its edge: with ``s`` and ``p`` the
edge's weights over ``k`` members, each of the ``k - 1`` survivors keeps
``s + p / (k - 1)`` and gives every other survivor as much
(:func:`survivors_of`), so ``W`` stays symmetric and doubly stochastic over
them; a uniform edge's survivors average. :mod:`decent_dp._engine.gossip` calls these
from its ``on_lost`` path, exact gossip only.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch
import torch.distributed as dist

from ..topo import Edge, Topology

__all__ = ["exchange_again", "find_lost", "survivor_groups", "survivors_for", "survivors_of"]


def survivor_groups(
    topology: Topology, world: int, timeout: datetime.timedelta
) -> dict[tuple[int, ...], dict[int, Any]]:
    """Each edge of more than two ranks (sorted), and its groups less one member, by that member.

    ``new_group`` is a collective of the default group: every process calls this at the
    same point, and makes the groups in the same order.
    """
    edges = {
        tuple(sorted(topology.get_edge(r, i).ranks))
        for r in range(topology.period)
        for i in range(world)
    }
    return {
        e: {m: dist.new_group([r for r in e if r != m], timeout=timeout) for m in e}
        for e in sorted(edges)
        if len(e) > 2
    }


def find_lost(store: Any, ranks: tuple[int, ...], rank: int, timeout_s: float) -> int | None:
    """The one member of ``ranks`` that did not note itself on ``store`` within ``timeout_s``.

    Each survivor notes itself and waits for all but one member to have done so:
    every survivor then names the same lost member.

    Returns:
        Its rank; ``None`` where two are lost or the store is gone (with its host).
    """
    try:
        store.set(str(rank), "1")
        deadline = time.monotonic() + timeout_s
        while True:
            here = [r for r in ranks if store.check([str(r)])]
            if len(here) == len(ranks) - 1:
                return next(r for r in ranks if r not in here)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
    except (RuntimeError, OSError):
        return None


def survivors_of(edge: Edge, gone: int) -> Edge:
    """The edge's live members, the lost member's weight shared among them."""
    live = tuple(r for r in edge.ranks if r != gone)
    return Edge(live, edge.self_weight + edge.peer_weight / len(live))


def survivors_for(state: Any, edge: Edge, bucket: Any) -> tuple[Edge, Any] | None:
    """A failed edge's live members and their group, from a gossip state's ``regroup``; or ``None``.

    The agreement is on this exchange (the bucket and the step it is for): where a
    member's own exchange went through (the lost one's part came before it died),
    the others wait out ``timeout_s`` and mix nothing for this step, and meet it at
    the next exchange, where it fails too (:func:`decent_dp._engine.gossip._launch`).
    Exact gossip only: compressed references, a hierarchical edge's phases, gossiped
    optimizer states and outer rounds keep the step mixing nothing.
    """
    plain = state.compressor is None and state.hosts is None and state.state_sync is None
    outer = state.outer is not None and edge is state.outer.edge
    if state.regroup is None or len(edge.ranks) < 3 or not plain or outer:
        return None
    found = state.regroup(edge, f"{bucket.index}/{bucket.gossip_step}")
    return None if found is None else (survivors_of(edge, found[0]), found[1])


def exchange_again(bucket: Any, survivors: Edge, group: Any) -> bool:
    """Send the bucket's ``x(t-1)`` to the survivors, weighted as the launch does; whether it went.

    ``bucket.comm`` then holds ``peer_w * sum_j x_j`` over the survivors, which the
    bucket's step mixes as it mixes any exchange.
    """
    peer_w = survivors.peer_weight
    for c, v in zip(bucket.comm_views, bucket.values()):  # what the failed launch sent
        torch.mul(v, peer_w, out=c)
    try:
        dist.all_reduce(bucket.comm, group=group)
    except Exception:  # another member is gone too
        return False
    bucket.pending = (survivors, survivors.self_weight, peer_w)
    return True
