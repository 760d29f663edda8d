"""The timing model behind ``experiments.network.simulate``: a Monte Carlo over training steps.

Every worker runs the same step, ``compute_s`` long on average: a forward part
``(1 - backward_frac) * compute_s`` (forward pass, optimizer, data) and a backward
part ``backward_frac * compute_s`` during which the model's buckets become ready
one after the other, in proportion to their bytes. Each worker's step is scaled
by a random factor of mean 1 drawn afresh every step (:class:`Jitter`), so the
slowest worker changes from step to step.

Transfers are ring collectives timed by :mod:`experiments.network.sim_links`
(links, one NIC per node, buckets). A NIC carries one transfer after the other
(first come, first served), so a late bucket of one step delays the first
bucket of the next.

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
  An outer optimizer's rounds and their fragments are in
  :mod:`experiments.network.sim_rounds` (:class:`OuterRounds`).

The result is the mean step time over ``steps`` steps after ``warmup`` steps,
with a fixed seed (:class:`MonteCarlo`): the same inputs give the same numbers,
and the longest of those steps (``peak_step_s``).

This module is the model's public face: it re-exports the links' and rounds'
names, so callers import everything from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from decent_dp.topo import Edge
from experiments.network.sim_links import (
    MB,
    Cluster,
    Link,
    bucket_sizes,
    check_positive,
    collective_s,
)
from experiments.network.sim_rounds import (
    OuterRounds,
    bucket_rounds,
    comm_per_step,
    prepare_round,
)

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

JITTER_KINDS = ("none", "normal", "lognormal")


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
        check_positive("model_bytes", self.model_bytes)
        check_positive("compute_s", self.compute_s)
        if not 0 <= self.backward_frac <= 1:
            raise ValueError(
                f"backward_frac={self.backward_frac!r} is invalid; it must be in [0, 1]"
            )
        check_positive("bucket_mb", self.bucket_mb)
        if not 0 < self.gossip_ratio <= 1:
            raise ValueError(
                f"compression_ratio={self.gossip_ratio!r} is invalid; it must be in (0, 1]"
            )


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


def simulate_gossip(
    rounds: Sequence[Sequence[Edge]],
    work: Workload,
    cluster: Cluster,
    mc: MonteCarlo = MonteCarlo(),
    outer: OuterRounds | None = None,
    three_phase: bool = False,
) -> SimResult:
    """Mean step time of the wrapper: per-bucket gossip overlapping the next step.

    The launch of step ``t`` (0-based) carries the round of step ``t + 1`` of the
    wrapper's 1-based schedule (the topology's round ``t mod period``).

    Args:
        rounds: The topology's rounds (one list of :class:`Edge` per step of the period).
        outer: The outer optimizer's rounds, or ``None``.
        three_phase: A ``hierarchical`` topology: an edge of several nodes runs in three
            phases (:func:`experiments.network.sim_links.hierarchical_s`), of which only the
            exchange between nodes is compressed and holds the NICs (with
            ``collective_start="own"``, all three hold them).

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
    prepared = [prepare_round(edges, sizes, cluster, three_phase, full) for edges in rounds]
    world = None
    if outer is not None:  # an outer round: the world's all-reduce of the bucket's payload
        world = prepare_round([Edge(range(n), 1.0 / n)], [s * outer.ratio for s in full], cluster)
    fwd, bwd = mc.phases(work, n)
    own = cluster.collective_start == "own"
    nic_free = np.zeros(n if own else cluster.nodes)
    waits = np.full((len(sizes), n), -np.inf)
    x = np.zeros(n)
    ends = []
    for t in range(len(fwd)):
        chosen = bucket_rounds(prepared, world, outer, t + 1, len(sizes))
        x = x + fwd[t]
        for j, frac in enumerate(ready_frac):
            rnd = chosen[j]
            x = np.maximum(x + bwd[t] * frac, waits[j])  # the previous gossip of this bucket
            ready = np.maximum.reduceat(x[rnd.order], rnd.starts)  # last member to launch
            cost = rnd.cost[j]
            post = None
            if rnd.phases is not None and not own:
                # phase 1 inside the nodes first; phase 3 after the NICs are free again
                ready = ready + rnd.phases[0][j]
                cost, post = rnd.phases[1][j], rnd.phases[2][j]
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
            if post is not None:
                end = end + post
            waits[j] = end[rnd.group_of]
        ends.append(x.mean())
    per_step = comm_per_step(prepared, world, outer, n)
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
