"""A round's groups laid out for the gossip simulation, and the outer optimizer's rounds.

An outer optimizer (:class:`OuterRounds`, the wrapper's ``outer_every`` and
``outer_fragments``) replaces, for each bucket, the round of its outer steps by
an all-reduce of the whole world. With ``F`` fragments bucket ``j`` belongs to
fragment ``j % F``, whose schedule is shifted by ``(j % F) H / F`` steps: each
outer round moves ``1/F`` of the model, and like any gossip it overlaps what
follows its launch until its bucket is needed again one step later, so its time
is hidden behind that compute unless it is longer. With ``F = 1`` every bucket
of one step is all-reduced at once and the NICs carry them one after the other.

:func:`prepare_round` turns one round's groups into index arrays and per-bucket
costs (:func:`experiments.network.sim_links.collective_s`), so that
:func:`experiments.network.sim_model.simulate_gossip` takes the maxima over
groups and NICs vectorized; :func:`bucket_rounds` picks each bucket's round of a
step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decent_dp.topo import Edge
from experiments.network.sim_links import Cluster, check_positive, collective_s, hierarchical_s

__all__ = ["OuterRounds", "Round", "prepare_round", "bucket_rounds", "comm_per_step"]


@dataclass(frozen=True)
class OuterRounds:
    """The outer optimizer's rounds: per bucket, an all-reduce of the world every ``every`` steps.

    Args:
        every: ``H``, the steps between a bucket's outer rounds.
        fragments: ``F``, a divisor of ``H``: bucket ``j`` belongs to fragment ``j % F``,
            whose schedule (outer rounds and topology rounds) is shifted by
            ``(j % F) H / F`` steps.
        ratio: An outer round's bytes over those of the fp32 buckets (the wrapper's
            ``outer_compression``: bf16 0.5, int8 about 0.25).

    Raises:
        ValueError: ``every`` or ``fragments`` not an integer >= 1, ``fragments`` not a
            divisor of ``every``, or ``ratio`` outside ``(0, 1]``.
    """

    every: int
    fragments: int = 1
    ratio: float = 1.0

    def __post_init__(self) -> None:
        for key in ("every", "fragments"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"outer_{key}={value!r} is invalid; it must be an integer >= 1")
        if self.every % self.fragments:
            raise ValueError(
                f"outer_fragments={self.fragments} is invalid; it must divide "
                f"outer_every={self.every}"
            )
        check_positive("outer_compression_ratio", self.ratio, high=1.0)

    def shift(self, bucket: int) -> int:
        """The steps by which the bucket's fragment's schedule is shifted."""
        return (bucket % self.fragments) * (self.every // self.fragments)

    def due(self, step: int, bucket: int) -> bool:
        """Whether the bucket's round of ``step`` (1-based) is an outer round."""
        return (step - self.shift(bucket)) % self.every == 0


@dataclass
class Round:
    """One round's groups as index arrays for vectorized maxima."""

    order: np.ndarray  # ranks sorted by group
    starts: np.ndarray  # first position of each group in ``order``
    group_of: np.ndarray  # group index of every rank
    cross: np.ndarray  # per group: spans nodes
    node_order: np.ndarray  # nodes of every cross group, concatenated
    node_starts: np.ndarray  # first position of each cross group in ``node_order``
    node_group: np.ndarray  # cross group index of every entry of ``node_order``
    cross_ids: np.ndarray  # indices of the node-spanning groups
    nic_sort: np.ndarray  # sorts ``node_order`` by node
    nic_starts: np.ndarray  # first position of each node in the sorted order
    nic_nodes: np.ndarray  # the nodes whose NIC this round uses
    cost: np.ndarray  # (buckets, groups) seconds
    # three-phase edges: (before, on the NIC, after), each (buckets, groups); None without
    phases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def prepare_round(
    edges: Sequence[Edge],
    sizes: Sequence[float],
    cluster: Cluster,
    three_phase: bool = False,
    exact_sizes: Sequence[float] | None = None,
) -> Round:
    """One round's groups as index arrays, with each bucket's cost per group.

    Args:
        edges: The round's groups.
        sizes: Each bucket's bytes.
        cluster: The workers, nodes and links.
        three_phase: Whether an edge of several whole nodes runs in the three phases of a
            ``hierarchical`` topology (:func:`experiments.network.sim_links.hierarchical_s`);
            its ``cost`` is then the sum of the phases and ``phases`` holds them apart.
        exact_sizes: Each bucket's uncompressed bytes, which the phases inside the nodes
            move (only phase 2 is compressed); ``sizes`` when ``None``.
    """
    local = cluster.local_world_size
    order = np.concatenate([np.asarray(e.ranks, dtype=np.int64) for e in edges])
    lens = np.array([len(e.ranks) for e in edges])
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    group_of = np.empty(cluster.n, dtype=np.int64)
    group_of[order] = np.repeat(np.arange(len(edges)), lens)
    nodes = [sorted({r // local for r in e.ranks}) for e in edges]
    cross = np.array([len(x) > 1 for x in nodes])
    flows: dict[int, int] = {}
    for x in nodes:
        if len(x) > 1:
            for node in x:
                flows[node] = flows.get(node, 0) + 1
    cost = np.zeros((len(sizes), len(edges)))
    by_shape: dict[tuple[int, int, int], np.ndarray] = {}  # groups of one shape cost the same
    nbytes = np.asarray(sizes, dtype=float)
    # an edge of several whole nodes (of L > 1 ranks) runs in three phases
    split = [three_phase and local > 1 and len(x) > 1 for x in nodes]
    phases = None
    if any(split):
        phases = (np.zeros_like(cost), np.zeros_like(cost), np.zeros_like(cost))
    for g, (edge, x) in enumerate(zip(edges, nodes)):
        key = (len(edge.ranks), len(x), max((flows.get(node, 1) for node in x), default=1))
        if phases is not None and split[g]:
            exact = nbytes if exact_sizes is None else np.asarray(exact_sizes, dtype=float)
            parts = hierarchical_s(exact, len(x), local, cluster.network, cluster.intra, key[2])
            if exact_sizes is not None:  # phase 2 moves the compressed chunk
                across = hierarchical_s(
                    nbytes, len(x), local, cluster.network, cluster.intra, key[2]
                )
                parts = (parts[0], across[1], parts[2])
            for mine, part in zip(phases, parts):
                mine[:, g] = part
            cost[:, g] = parts[0] + parts[1] + parts[2]
            continue
        if key not in by_shape:
            by_shape[key] = np.broadcast_to(
                collective_s(nbytes, key[0], key[1], cluster.network, cluster.intra, key[2]),
                nbytes.shape,
            )
        cost[:, g] = by_shape[key]
    if phases is not None:  # any other group's whole cost is its one phase
        flat = ~np.asarray(split)
        phases[1][:, flat] = cost[:, flat]
    cross_ids = np.flatnonzero(cross)
    node_lists = [np.asarray(nodes[g], dtype=np.int64) for g in cross_ids]
    node_order = np.concatenate(node_lists) if node_lists else np.zeros(0, dtype=np.int64)
    node_lens = np.array([len(x) for x in node_lists], dtype=np.int64)
    node_starts = np.concatenate([[0], np.cumsum(node_lens)[:-1]]) if node_lists else node_lens
    node_group = np.repeat(cross_ids, node_lens) if node_lists else node_lens
    nic_sort = np.argsort(node_order, kind="stable")
    nic_nodes, nic_starts = np.unique(node_order[nic_sort], return_index=True)
    return Round(
        order,
        starts,
        group_of,
        cross,
        node_order,
        node_starts,
        node_group,
        cross_ids,
        nic_sort,
        nic_starts,
        nic_nodes,
        cost,
        phases,
    )


def bucket_rounds(
    prepared: Sequence[Round],
    world: Round | None,
    outer: OuterRounds | None,
    step: int,
    count: int,
) -> list[Round]:
    """The round each of ``count`` buckets takes at ``step`` (1-based): its fragment's."""
    period = len(prepared)
    if outer is None or world is None:
        return [prepared[(step - 1) % period]] * count
    return [
        world if outer.due(step, j) else prepared[(step - outer.shift(j) - 1) % period]
        for j in range(count)
    ]


def comm_per_step(
    prepared: Sequence[Round], world: Round | None, outer: OuterRounds | None, n: int
) -> list[float]:
    """Seconds of transfers of each step of the schedule: the busiest rank's, over its buckets."""
    if outer is None:
        return [float(r.cost.sum(axis=0).max()) for r in prepared]
    count = prepared[0].cost.shape[0]
    steps = []
    for step in range(1, math.lcm(len(prepared), outer.every) + 1):
        per_rank = np.zeros(n)
        for j, rnd in enumerate(bucket_rounds(prepared, world, outer, step, count)):
            per_rank += rnd.cost[j][rnd.group_of]
        steps.append(float(per_rank.max()))
    return steps
