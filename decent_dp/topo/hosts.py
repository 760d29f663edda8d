"""Hosts of a topology: which ranks share one, and which edges span several.

Hosts are blocks of ``local_world_size`` consecutive ranks, as torchrun numbers
them. A ``hierarchical`` topology (:class:`~decent_dp.topo.HierarchicalTopology`)
has edges over whole hosts; the wrapper runs an edge of more than one host in
three phases on process groups of its own (reduce-scatter inside each host,
the chunk's all-reduce across hosts, all-gather inside each host). Which edges
those are is pure data, computed here for any world size.
"""

from __future__ import annotations

from .builtin import HierarchicalTopology
from .graph import Edge, Topology

__all__ = ["hierarchical_keys", "host_size", "is_hierarchical"]


def host_size(topology: Topology) -> int:
    """Ranks per host of a ``hierarchical`` topology; 1 for any other.

    Args:
        topology: Any topology.

    Returns:
        ``local_world_size`` for a :class:`~decent_dp.topo.HierarchicalTopology`,
        else 1 (no edge of that topology runs across hosts in phases).

    Example::

        host_size(TopologyReg.create("hierarchical", 16, 4))  # 4
    """
    return topology.local_world_size if isinstance(topology, HierarchicalTopology) else 1


def is_hierarchical(edge: Edge, local: int) -> bool:
    """Whether ``edge``, a union of whole hosts, spans more than one host.

    Args:
        edge: An edge of a ``hierarchical`` topology.
        local: Ranks per host (:func:`host_size`).

    Returns:
        ``True`` when hosts have more than one rank and the edge has more ranks than one host.
    """
    return local > 1 and len(edge.ranks) > local


def hierarchical_keys(topology: Topology) -> set[tuple[int, ...]]:
    """The edges that run in three phases: those of more than one host of several ranks.

    The wrapper's flat path creates no process group for them.

    Args:
        topology: Any topology (none but a ``hierarchical`` one has such edges).

    Returns:
        The sorted ranks of each such edge over the period; empty for any other topology.
    """
    local = host_size(topology)
    return {
        tuple(sorted(e.ranks))
        for edges in topology.rounds
        for e in edges
        if is_hierarchical(e, local)
    }
