"""The timing model behind ``experiments.network.simulate``: a Monte Carlo over training steps.

Every worker runs the same step, ``compute_s`` long on average: a forward part
``(1 - backward_frac) * compute_s`` (forward pass, optimizer, data) and a backward
part ``backward_frac * compute_s`` during which the model's buckets become ready
one after the other, in proportion to their bytes. Each worker's step is scaled
by a random factor of mean 1 drawn afresh every step (:class:`Jitter`), so the
slowest worker changes from step to step.

Transfers. A collective over ``k`` members moves ``S`` bytes as a ring: it takes
``collective_ms`` + the latency of ``2 (k-1)`` hops + ``2 (k-1)/k * S / (efficiency * B)``
(:func:`collective_s`). ``efficiency`` is the fraction of line rate the
collective library reaches on that link type; ``collective_ms`` is the fixed
cost of one collective call. A group inside one node uses the intra-node link;
a group spanning nodes uses the network, and its ring crosses each spanned
node's NIC once. One NIC per node is shared: ``f`` node-spanning groups on one
NIC in the same round each get ``B / f``, and a NIC carries one transfer after
the other (first come, first served), so a late bucket of one step delays the
first bucket of the next.

Two ways of training:

* all-reduce (torch DDP, :func:`simulate_allreduce`): bucket ``j``'s all-reduce
  starts when the slowest worker has that bucket ready and the NICs are free;
  the step ends when the last all-reduce is done. The slowest of ``n`` workers
  is paid every step, and only the backward pass overlaps communication.
* gossip (the wrapper, :func:`simulate_gossip`): when bucket ``j`` is ready, the
  worker waits for that bucket's gossip of the previous step, then launches this
  step's. The gossip starts when every member of its group has launched it
  (``collective_start="all"``, as real collectives do), so a straggler delays
  only its current group, and the delay reaches others only through later groups.

An outer optimizer (:class:`OuterRounds`, the wrapper's ``outer_every`` and
``outer_fragments``) replaces, for each bucket, the round of its outer steps by
an all-reduce of the whole world. With ``F`` fragments bucket ``j`` belongs to
fragment ``j % F``, whose schedule is shifted by ``(j % F) H / F`` steps: each
outer round moves ``1/F`` of the model, and like any gossip it overlaps what
follows its launch until its bucket is needed again one step later, so its time
is hidden behind that compute unless it is longer. With ``F = 1`` every bucket
of one step is all-reduced at once and the NICs carry them one after the other.

The result is the mean step time over ``steps`` steps after ``warmup`` steps,
with a fixed seed (:class:`MonteCarlo`): the same inputs give the same numbers,
and the longest of those steps (``peak_step_s``).

The module is one model, kept in one file on purpose: the two simulations share
every definition above them (links, buckets, workload, nodes, sampling), and the
tests check each formula against numbers worked out by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from decent_dp.topo import Edge

__all__ = [
    "MB",
    "Link",
    "Jitter",
    "Workload",
    "Cluster",
    "MonteCarlo",
    "OuterRounds",
    "SimResult",
    "collective_s",
    "bucket_sizes",
    "simulate_allreduce",
    "simulate_gossip",
    "fit_efficiency",
]

MB = 1024 * 1024  # torch DDP and the wrapper count bucket sizes in MiB
START_RULES = ("all", "own")
JITTER_KINDS = ("none", "normal", "lognormal")


def _positive(name: str, value: Any, low: float = 0.0, high: float = math.inf) -> float:
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
        _positive(f"{self.name}.bandwidth_gbps", self.bandwidth_gbps)
        _positive(f"{self.name}.efficiency", self.efficiency, high=1.0)
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


@dataclass(frozen=True)
class Jitter:
    """Per-worker, per-step compute-time factors of mean 1.

    Args:
        kind: ``none``, ``normal`` (clipped at 0.05) or ``lognormal``.
        cv: Coefficient of variation (standard deviation over mean), >= 0.

    Raises:
        ValueError: Unknown kind or negative ``cv``.
    """

    kind: str = "none"
    cv: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in JITTER_KINDS:
            raise ValueError(
                f"jitter.kind={self.kind!r} is invalid; known: {', '.join(JITTER_KINDS)}"
            )
        ok = isinstance(self.cv, (int, float)) and not isinstance(self.cv, bool)
        if not ok or not math.isfinite(self.cv) or self.cv < 0:
            raise ValueError(f"jitter.cv={self.cv!r} is invalid; it must be a number >= 0")

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Factors of the given shape."""
        if self.kind == "none" or self.cv == 0:
            return np.ones(shape)
        if self.kind == "normal":
            return np.maximum(0.05, 1.0 + self.cv * rng.standard_normal(shape))
        sigma2 = math.log1p(self.cv**2)
        return np.exp(rng.normal(-sigma2 / 2, math.sqrt(sigma2), shape))


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
class Workload:
    """One training step of one worker.

    Args:
        model_bytes: Bytes all-reduced (gradients) or gossiped (parameters) per step.
        compute_s: Mean seconds of one step without communication.
        backward_frac: Share of ``compute_s`` in which buckets become ready.
        bucket_mb: Bucket size in MiB (torch DDP's ``bucket_cap_mb``, the wrapper's buckets).
        ddp_first_bucket_mb: torch DDP's small first bucket (MiB); ``None`` for none.
        gossip_ratio: The bytes one gossip exchange sends over those of the fp32 model
            (compressed gossip: bf16 0.5, int8 about 0.25, randk its ratio); the
            all-reduce baseline is not compressed.
    """

    model_bytes: float
    compute_s: float
    backward_frac: float
    bucket_mb: float = 25.0
    ddp_first_bucket_mb: float | None = 1.0
    gossip_ratio: float = 1.0

    def __post_init__(self) -> None:
        _positive("model_bytes", self.model_bytes)
        _positive("compute_s", self.compute_s)
        if not 0 <= self.backward_frac <= 1:
            raise ValueError(
                f"backward_frac={self.backward_frac!r} is invalid; it must be in [0, 1]"
            )
        _positive("bucket_mb", self.bucket_mb)
        if not 0 < self.gossip_ratio <= 1:
            raise ValueError(
                f"compression_ratio={self.gossip_ratio!r} is invalid; it must be in (0, 1]"
            )


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
        _positive("outer_compression_ratio", self.ratio, high=1.0)

    def shift(self, bucket: int) -> int:
        """The steps by which the bucket's fragment's schedule is shifted."""
        return (bucket % self.fragments) * (self.every // self.fragments)

    def due(self, step: int, bucket: int) -> bool:
        """Whether the bucket's round of ``step`` (1-based) is an outer round."""
        return (step - self.shift(bucket)) % self.every == 0


@dataclass
class SimResult:
    """Mean seconds per step and what the transfers cost.

    Attributes:
        t_iter_s: Mean step time after warm-up.
        comm_s: Mean seconds of one step's transfers (all buckets), before any waiting.
        step_s: Every measured step's time (the mean over workers).
        peak_comm_s: The most seconds of transfers of any one step of the schedule.
    """

    t_iter_s: float
    comm_s: float
    step_s: list[float] = field(default_factory=list)
    peak_comm_s: float = 0.0

    @property
    def peak_step_s(self) -> float:
        """The longest measured step."""
        return max(self.step_s) if self.step_s else self.t_iter_s


@dataclass(frozen=True)
class MonteCarlo:
    """How the steps are sampled: compute jitter, steps measured, warm-up and seed.

    Args:
        jitter: The per-worker, per-step compute-time factors.
        steps: Steps averaged over, after the warm-up.
        warmup: Steps simulated first and not counted, while the pipeline fills.
        seed: Seed of the jitter's factors: the same inputs give the same numbers.

    Example::

        mc = MonteCarlo(Jitter("lognormal", 0.1), steps=200)
        simulate_allreduce(work, cluster, mc).t_iter_s
    """

    jitter: Jitter = Jitter()
    steps: int = 100
    warmup: int = 10
    seed: int = 0

    def phases(self, work: Workload, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward seconds of ``n`` workers, one row per step, warm-up included."""
        shape = (self.warmup + self.steps, n)
        c = work.compute_s * self.jitter.sample(np.random.default_rng(self.seed), shape)
        return (1 - work.backward_frac) * c, work.backward_frac * c

    def result(
        self, ends: Sequence[float], comm: float, peak_comm: float | None = None
    ) -> SimResult:
        """The mean step after the warm-up, from the time each step ended."""
        e = np.asarray(ends)
        if self.warmup > 0:
            steps = np.diff(e[self.warmup - 1 :])
        else:
            steps = np.diff(np.concatenate([[0.0], e]))
        peak = comm if peak_comm is None else peak_comm
        return SimResult(float(steps.mean()), comm, [float(x) for x in steps], peak)


def simulate_allreduce(
    work: Workload, cluster: Cluster, mc: MonteCarlo = MonteCarlo()
) -> SimResult:
    """Mean step time of torch DDP: bucketed all-reduce overlapping the backward pass.

    Returns:
        :class:`SimResult`; ``comm_s`` is the sum of the buckets' all-reduce times.
    """
    n = cluster.n
    sizes = bucket_sizes(work.model_bytes, work.bucket_mb, work.ddp_first_bucket_mb)
    nbytes = np.asarray(sizes, dtype=float)
    cost = np.broadcast_to(
        collective_s(nbytes, n, cluster.nodes, cluster.network, cluster.intra), nbytes.shape
    )
    ready_frac = np.cumsum(sizes) / sum(sizes)
    fwd, bwd = mc.phases(work, n)
    own = cluster.collective_start == "own"
    start = np.zeros(n)
    link_free = np.zeros(n) if own else np.zeros(1)
    ends = []
    for t in range(len(fwd)):
        base = start + fwd[t]
        done = base + bwd[t]
        for j, frac in enumerate(ready_frac):
            ready = base + bwd[t] * frac
            if own:  # netem: each worker's link from its own launch; the data needs everyone
                link_free = np.maximum(ready, link_free) + cost[j]
                finish = np.maximum(link_free, ready.max())
            else:
                link_free = np.maximum(ready.max(), link_free) + cost[j]
                finish = link_free
            done = np.maximum(done, finish)
        # DDP's backward returns once every bucket is reduced, on every worker
        start = np.full(n, done.max()) if not own else done
        ends.append(start.mean())
    return mc.result(ends, float(cost.sum()))


@dataclass
class _Round:
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


def _prepare(edges: Sequence[Edge], sizes: Sequence[float], cluster: Cluster) -> _Round:
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
    for g, (edge, x) in enumerate(zip(edges, nodes)):
        key = (len(edge.ranks), len(x), max((flows.get(node, 1) for node in x), default=1))
        if key not in by_shape:
            by_shape[key] = np.broadcast_to(
                collective_s(nbytes, key[0], key[1], cluster.network, cluster.intra, key[2]),
                nbytes.shape,
            )
        cost[:, g] = by_shape[key]
    cross_ids = np.flatnonzero(cross)
    node_lists = [np.asarray(nodes[g], dtype=np.int64) for g in cross_ids]
    node_order = np.concatenate(node_lists) if node_lists else np.zeros(0, dtype=np.int64)
    node_lens = np.array([len(x) for x in node_lists], dtype=np.int64)
    node_starts = np.concatenate([[0], np.cumsum(node_lens)[:-1]]) if node_lists else node_lens
    node_group = np.repeat(cross_ids, node_lens) if node_lists else node_lens
    nic_sort = np.argsort(node_order, kind="stable")
    nic_nodes, nic_starts = np.unique(node_order[nic_sort], return_index=True)
    return _Round(
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
    )


def _bucket_rounds(
    prepared: Sequence[_Round],
    world: _Round | None,
    outer: OuterRounds | None,
    step: int,
    count: int,
) -> list[_Round]:
    """The round each of ``count`` buckets takes at ``step`` (1-based): its fragment's."""
    period = len(prepared)
    if outer is None or world is None:
        return [prepared[(step - 1) % period]] * count
    return [
        world if outer.due(step, j) else prepared[(step - outer.shift(j) - 1) % period]
        for j in range(count)
    ]


def _comm_per_step(
    prepared: Sequence[_Round], world: _Round | None, outer: OuterRounds | None, n: int
) -> list[float]:
    """Seconds of transfers of each step of the schedule: the busiest rank's, over its buckets."""
    if outer is None:
        return [float(r.cost.sum(axis=0).max()) for r in prepared]
    count = prepared[0].cost.shape[0]
    steps = []
    for step in range(1, math.lcm(len(prepared), outer.every) + 1):
        per_rank = np.zeros(n)
        for j, rnd in enumerate(_bucket_rounds(prepared, world, outer, step, count)):
            per_rank += rnd.cost[j][rnd.group_of]
        steps.append(float(per_rank.max()))
    return steps


def simulate_gossip(
    rounds: Sequence[Sequence[Edge]],
    work: Workload,
    cluster: Cluster,
    mc: MonteCarlo = MonteCarlo(),
    outer: OuterRounds | None = None,
) -> SimResult:
    """Mean step time of the wrapper: per-bucket gossip overlapping the next step.

    The launch of step ``t`` (0-based) carries the round of step ``t + 1`` of the
    wrapper's 1-based schedule (the topology's round ``t mod period``).

    Args:
        rounds: The topology's rounds (one list of :class:`Edge` per step of the period).
        outer: The outer optimizer's rounds, or ``None``.

    Returns:
        :class:`SimResult`; ``comm_s`` is the mean over the schedule (the period, or
        its lcm with ``outer.every``) of the busiest rank's transfer time summed
        over buckets, ``peak_comm_s`` its largest step.
    """
    n = cluster.n
    sizes = bucket_sizes(work.model_bytes, work.bucket_mb)
    ready_frac = np.diff(np.concatenate([[0.0], np.cumsum(sizes) / sum(sizes)]))
    full = list(sizes)
    sizes = [s * work.gossip_ratio for s in sizes]  # each bucket's compressed payload
    prepared = [_prepare(edges, sizes, cluster) for edges in rounds]
    world = None
    if outer is not None:  # an outer round: the world's all-reduce of the bucket's payload
        world = _prepare([Edge(range(n), 1.0 / n)], [s * outer.ratio for s in full], cluster)
    fwd, bwd = mc.phases(work, n)
    own = cluster.collective_start == "own"
    nic_free = np.zeros(n if own else cluster.nodes)
    waits = np.full((len(sizes), n), -np.inf)
    x = np.zeros(n)
    ends = []
    for t in range(len(fwd)):
        chosen = _bucket_rounds(prepared, world, outer, t + 1, len(sizes))
        x = x + fwd[t]
        for j, frac in enumerate(ready_frac):
            rnd = chosen[j]
            x = np.maximum(x + bwd[t] * frac, waits[j])  # the previous gossip of this bucket
            ready = np.maximum.reduceat(x[rnd.order], rnd.starts)  # last member to launch
            cost = rnd.cost[j]
            if own:
                link = rnd.cross[rnd.group_of]  # only node-spanning transfers use the link
                begin = np.where(link, np.maximum(x, nic_free), x)
                end = begin + cost[rnd.group_of]
                nic_free = np.where(link, end, nic_free)
                waits[j] = np.maximum(end, ready[rnd.group_of])
                continue
            begin = ready
            if rnd.node_order.size:
                # a node-spanning transfer waits until every NIC it crosses is free
                busy = np.maximum.reduceat(nic_free[rnd.node_order], rnd.node_starts)
                begin = ready.copy()
                begin[rnd.cross_ids] = np.maximum(ready[rnd.cross_ids], busy)
            end = begin + cost
            if rnd.node_order.size:
                last = np.maximum.reduceat(end[rnd.node_group][rnd.nic_sort], rnd.nic_starts)
                nic_free[rnd.nic_nodes] = np.maximum(nic_free[rnd.nic_nodes], last)
            waits[j] = end[rnd.group_of]
        ends.append(x.mean())
    per_step = _comm_per_step(prepared, world, outer, n)
    return mc.result(ends, float(np.mean(per_step)), max(per_step))


def fit_efficiency(
    target_s: float,
    work: Workload,
    cluster: Cluster,
    mc: MonteCarlo = MonteCarlo(),
    tol: float = 1e-10,
) -> tuple[float, float]:
    """The network efficiency at which the simulated all-reduce step equals ``target_s``.

    The step time falls as the efficiency rises (same random factors for every
    trial), so a bisection on ``(0, 1]`` finds it.

    Returns:
        ``(efficiency, simulated step at that efficiency)``.

    Raises:
        ValueError: Even line rate (efficiency 1) is slower than ``target_s``: the other
            inputs already explain more time than was measured.
    """

    def step(eff: float) -> float:
        c = replace(cluster, network=cluster.network.with_efficiency(eff))
        return simulate_allreduce(work, c, mc).t_iter_s

    best = step(1.0)
    if best > target_s:
        raise ValueError(
            f"the all-reduce takes {best * 1e3:.1f} ms even at line rate, more than the "
            f"{target_s * 1e3:.1f} ms to fit; compute, latency or jitter inputs are too large"
        )
    low, high = 1e-4, 1.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if step(mid) > target_s:
            low = mid
        else:
            high = mid
        if high - low < tol:
            break
    return high, step(high)
