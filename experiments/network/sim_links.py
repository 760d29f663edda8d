"""Links, nodes and buckets of the timing model: what one collective costs.

A collective over ``k`` members moves ``S`` bytes as a ring: it takes
``collective_ms`` + the latency of ``2 (k-1)`` hops + ``2 (k-1)/k * S / (efficiency * B)``
(:func:`collective_s`). ``efficiency`` is the fraction of line rate the
collective library reaches on that link type; ``collective_ms`` is the fixed
cost of one collective call. A group inside one node uses the intra-node link;
a group spanning nodes uses the network, and its ring crosses each spanned
node's NIC once. One NIC per node is shared: ``f`` node-spanning groups on one
NIC in the same round each get ``B / f`` (the ``share`` of :func:`collective_s`).

An edge of the ``hierarchical`` topology runs in three phases instead
(:func:`hierarchical_s`): a reduce-scatter inside each node, an all-reduce of
each ``1/L`` chunk across the nodes, an all-gather inside each node.

The steps that use these costs are in :mod:`experiments.network.sim_model`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MB",
    "Link",
    "Cluster",
    "collective_s",
    "hierarchical_s",
    "bucket_sizes",
    "check_positive",
]

MB = 1024 * 1024  # torch DDP and the wrapper count bucket sizes in MiB
START_RULES = ("all", "own")


def check_positive(name: str, value: Any, low: float = 0.0, high: float = math.inf) -> float:
    """``value`` as a float if it is a finite number in ``(low, high]``, else a ValueError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low < value <= high:
        bound = f"in ({low}, {high}]" if math.isfinite(high) else f"> {low}"
        raise ValueError(f"{name}={value!r} is invalid; it must be a number {bound}")
    return float(value)


@dataclass(frozen=True)
class Link:
    """A link type: bandwidth, per-hop latency, reachable fraction of line rate, call cost.

    Args:
        name: Label in tables.
        bandwidth_gbps: Line rate in Gb/s (per node for the network).
        latency_ms: One-way latency of one ring hop, in ms.
        efficiency: Fraction of line rate a collective reaches, in (0, 1].
        collective_ms: Fixed cost of one collective call (launch, handshake), in ms (>= 0).

    Raises:
        ValueError: A value out of range.

    Example::

        eth = Link("ethernet_25g", 25.0, 0.02, efficiency=0.9, collective_ms=0.2)
        eth.ring_s(25 * MB, 8)  # one 25 MiB bucket over a ring of 8 on this link
    """

    name: str
    bandwidth_gbps: float
    latency_ms: float
    efficiency: float = 1.0
    collective_ms: float = 0.0

    def __post_init__(self) -> None:
        check_positive(f"{self.name}.bandwidth_gbps", self.bandwidth_gbps)
        check_positive(f"{self.name}.efficiency", self.efficiency, high=1.0)
        for key in ("latency_ms", "collective_ms"):
            value = getattr(self, key)
            if not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            ) or not math.isfinite(value):
                raise ValueError(f"{self.name}.{key}={value!r} is invalid; it must be >= 0")

    @property
    def bytes_per_s(self) -> float:
        """Reachable bytes per second: ``efficiency * gbps * 1e9 / 8``."""
        return self.efficiency * self.bandwidth_gbps * 1e9 / 8.0

    def ring_s(self, nbytes: Any, members: int, share: int = 1) -> Any:
        """Seconds of one ring collective of ``nbytes`` over ``members`` on this link alone.

        ``collective_ms + 2 (k-1) latency_ms + 2 (k-1)/k * nbytes * share / B``.
        """
        if members <= 1:
            return 0.0 * nbytes
        hops = 2 * (members - 1)
        wire = hops / members * nbytes * share / self.bytes_per_s
        return (self.collective_ms + hops * self.latency_ms) * 1e-3 + wire

    def half_ring_s(self, nbytes: Any, members: int) -> Any:
        """Seconds of a ring reduce-scatter (or all-gather) of ``nbytes`` over ``members``.

        Half an all-reduce's hops and bytes, one call:
        ``collective_ms + (k-1) latency_ms + (k-1)/k * nbytes / B``.
        """
        if members <= 1:
            return 0.0 * nbytes
        hops = members - 1
        wire = hops / members * nbytes / self.bytes_per_s
        return (self.collective_ms + hops * self.latency_ms) * 1e-3 + wire

    def with_efficiency(self, efficiency: float) -> Link:
        """A copy with another efficiency."""
        return Link(self.name, self.bandwidth_gbps, self.latency_ms, efficiency, self.collective_ms)


def collective_s(
    nbytes: Any, members: int, nodes: int, network: Link, intra: Link, share: int = 1
) -> Any:
    """Seconds of one ring collective of ``nbytes`` over ``members`` ranks on ``nodes`` nodes.

    Inside one node: :meth:`Link.ring_s` on ``intra``. Across nodes the NIC is the
    bottleneck: ``network.collective_ms``, then a chunk's trip around the ring, whose
    ``2 (k-1)`` hops are ``nodes/k`` network hops and the rest intra-node hops
    (NCCL's latency model counts them the same way), then
    ``2 (k-1)/k * nbytes * share / B`` through the NIC at the network's reachable rate.

    Args:
        nbytes: Bytes each member reduces (a number or a numpy array).
        members: Ranks ``k`` in the group.
        nodes: Nodes the group spans.
        network: The link between nodes.
        intra: The link inside a node.
        share: Node-spanning groups sharing the busiest NIC at once (bandwidth ``B / share``).

    Returns:
        Seconds (an array for an array of sizes).
    """
    if members <= 1:
        return 0.0 * nbytes
    if nodes <= 1:
        return intra.ring_s(nbytes, members)
    hops = 2 * (members - 1)
    net_hops = hops * nodes / members
    latency = network.collective_ms + net_hops * network.latency_ms
    latency += (hops - net_hops) * intra.latency_ms
    return latency * 1e-3 + hops / members * nbytes * share / network.bytes_per_s


def hierarchical_s(
    nbytes: Any, hosts: int, local: int, network: Link, intra: Link, share: int = 1
) -> tuple[Any, Any, Any]:
    """Seconds of the three phases of a ``hierarchical`` edge over ``hosts`` nodes of ``local`` ranks.

    1. a reduce-scatter of ``nbytes`` inside the node (:meth:`Link.half_ring_s` on ``intra``);
    2. every local rank all-reduces its ``nbytes / local`` chunk with the same local rank
       of the partner nodes: ``local`` rings over ``hosts`` nodes share each NIC at once,
       so the NIC carries ``local`` chunks of ``1/local``, one model's worth
       (:func:`collective_s` with ``share * local``);
    3. an all-gather of ``nbytes`` inside the node.

    Args:
        share: Node-spanning edges on the busiest NIC of the edge in the same round.

    Returns:
        ``(phase 1, phase 2, phase 3)`` seconds, in order; only phase 2 uses the NIC.
    """
    side = intra.half_ring_s(nbytes, local)
    across = collective_s(nbytes / local, hosts, hosts, network, intra, share * local)
    return side, across, side


def bucket_sizes(nbytes: float, bucket_mb: float, first_mb: float | None = None) -> list[float]:
    """Bucket sizes in ready order: an optional small first bucket, then ``bucket_mb`` each.

    torch DDP puts the first 1 MiB of gradients in a bucket of its own so that
    communication starts early; the wrapper does not.
    """
    if bucket_mb <= 0:
        raise ValueError(f"bucket_mb={bucket_mb!r} is invalid; it must be > 0")
    sizes: list[float] = []
    left = float(nbytes)
    if first_mb is not None and first_mb > 0:
        first = min(left, first_mb * MB)
        sizes.append(first)
        left -= first
    cap = bucket_mb * MB
    if left > 1e-6 * cap:  # rounding of sizes given in MiB must not add an empty bucket
        count = max(1, math.ceil(left / cap - 1e-9))
        sizes += [cap] * (count - 1) + [left - cap * (count - 1)]
    return sizes or [0.0]


@dataclass(frozen=True)
class Cluster:
    """Workers, their grouping into nodes (one NIC each) and the links.

    Args:
        n: Number of workers.
        local_world_size: Workers per node ``L``; ranks ``r // L`` share a node and its NIC.
        network: The link between nodes.
        intra: The link inside a node.
        collective_start: ``all``: a collective starts once all members joined (NCCL, gloo);
            ``own``: each member's transfer is timed from its own launch and its link, which is
            how :mod:`experiments.network.netem` emulates a network (the real transfer still needs all).
    """

    n: int
    local_world_size: int
    network: Link
    intra: Link
    collective_start: str = "all"

    def __post_init__(self) -> None:
        for key in ("n", "local_world_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}={value!r} is invalid; it must be an integer >= 1")
        if self.collective_start not in START_RULES:
            raise ValueError(
                f"collective_start={self.collective_start!r} is invalid; known: {', '.join(START_RULES)}"
            )

    @property
    def nodes(self) -> int:
        """Number of nodes, ``ceil(n / L)``."""
        return -(-self.n // self.local_world_size)
