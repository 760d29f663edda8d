"""Communication topologies as pure data.

A topology is a periodic sequence of *rounds*. Each round partitions the ranks
``0..n-1`` into disjoint groups (:class:`Edge`); inside a group every member
keeps ``weight`` of its own model and takes ``(1 - weight) / (k - 1)`` of each
of the ``k - 1`` other members. Nothing here needs ``torch.distributed``: the
rounds and their mixing matrices can be computed for any world size, and only
:class:`~decent_dp.ddp.DecentralizedDataParallel` turns edges into process
groups.

Run ``python -m decent_dp.topo --world-size 64`` for a table of every
registered topology.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .mixing import consensus_rate, period_contraction, spectral_gap

__all__ = [
    "Edge",
    "Topology",
    "TopologyReg",
    "CompleteTopology",
    "RingTopology",
    "OnePeerExpTopology",
    "AlternatingExpRingTopology",
    "RandomMatchingTopology",
    "LocalSGDTopology",
    "BaseKTopology",
    "base_k_period_bound",
    "mixing_matrices",
    "spectral_gap",
    "period_contraction",
    "describe",
]


@dataclass
class Edge:
    """One averaging group of a round.

    Args:
        ranks: The global ranks in the group.
        weight: The share each member keeps of its own model, in ``[0, 1]``.
            The rest, ``1 - weight``, is split evenly among the other members,
            so ``W[i][i] = weight`` and ``W[i][j] = (1 - weight) / (k - 1)``.
            A group of one member keeps itself whatever the weight.
        group: Optional user data (e.g. a process group); the wrapper creates and keeps
            its own groups and leaves this untouched.

    Example::

        Edge([0, 1], 0.5)        # two ranks average uniformly
        Edge([0, 1, 2, 3], 0.25) # four ranks average uniformly
    """

    ranks: Sequence[int]
    weight: float
    group: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.ranks = tuple(int(r) for r in self.ranks)
        self.weight = float(self.weight)

    @property
    def self_weight(self) -> float:
        """``W[i][i]`` for every member (1.0 for a group of one)."""
        return 1.0 if len(self.ranks) == 1 else self.weight

    @property
    def peer_weight(self) -> float:
        """``W[i][j]`` for two distinct members (0.0 for a group of one)."""
        k = len(self.ranks)
        return 0.0 if k == 1 else (1.0 - self.weight) / (k - 1)


def _world_from_env(world_size: int | None, local_world_size: int | None) -> tuple[int, int]:
    if world_size is None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "world_size was not given and torch.distributed is not initialized; "
                "pass world_size=... or launch with torchrun and call decent_dp.utils.initialize_dist()"
            )
        world_size = dist.get_world_size()
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return int(world_size), int(local_world_size)


class Topology:
    """Base class: a periodic schedule of rounds, validated on construction.

    Subclasses override :meth:`_get_topo_edges` and return one list of
    :class:`Edge` per round of the period. Every rank must appear in exactly
    one edge of every round, and every weight must lie in ``[0, 1]``. Inside
    :meth:`_get_topo_edges`, as in decent-dp 0.2.x, ``self._world_size``,
    ``self._local_world_size`` and ``self._n_nodes`` (``world_size //
    local_world_size``, the number of whole nodes) are already set.

    Args:
        world_size: Number of workers ``n``; taken from ``torch.distributed``
            when omitted.
        local_world_size: Workers per node ``L``; taken from the
            ``LOCAL_WORLD_SIZE`` environment variable when omitted.

    Raises:
        ValueError: A round breaks a rule, or the sizes do not fit the topology.

    Example::

        @TopologyReg.register('pairs')
        class Pairs(Topology):
            def _get_topo_edges(self):
                n = self.world_size
                return [[Edge([i, i + 1], 0.5) for i in range(0, n, 2)]]
    """

    name: str = "custom"

    def __init__(self, world_size: int | None = None, local_world_size: int | None = None):
        n, local = _world_from_env(world_size, local_world_size)
        if n < 1:
            raise ValueError(f"world_size={n} is invalid; it must be >= 1")
        if local < 1:
            raise ValueError(f"local_world_size={local} is invalid; it must be >= 1")
        self._world_size = n
        self._local_world_size = local
        # decent-dp 0.2.x subclasses read these three in _get_topo_edges()
        self._n_nodes = n // local
        self._rounds = self._get_topo_edges()
        self._validate()

    @property
    def world_size(self) -> int:
        """Number of workers ``n``."""
        return self._world_size

    @property
    def local_world_size(self) -> int:
        """Workers per node ``L``."""
        return self._local_world_size

    @property
    def rounds(self) -> list[list[Edge]]:
        """The edges of every round of the period."""
        return self._rounds

    @property
    def period(self) -> int:
        """Number of rounds before the schedule repeats."""
        return len(self._rounds)

    def _get_topo_edges(self) -> list[list[Edge]]:
        raise NotImplementedError("a Topology subclass must override _get_topo_edges()")

    def get_edge(self, step: int, rank: int) -> Edge:
        """The edge that ``rank`` belongs to at ``step`` (rounds cycle with the period)."""
        for edge in self._rounds[step % self.period]:
            if rank in edge.ranks:
                return edge
        raise ValueError(
            f"rank {rank} is not in round {step % self.period}"
        )  # unreachable once validated

    def mixing_matrix(self, round_index: int) -> torch.Tensor:
        """The float64 ``n x n`` matrix ``W`` of one round."""
        n = self._world_size
        w = torch.zeros(n, n, dtype=torch.float64)
        for edge in self._rounds[round_index % self.period]:
            idx = torch.tensor(edge.ranks)
            w[idx.unsqueeze(1), idx.unsqueeze(0)] = edge.peer_weight
            w[idx, idx] = edge.self_weight
        return w

    def mixing_matrices(self) -> list[torch.Tensor]:
        """One float64 mixing matrix per round of the period."""
        return [self.mixing_matrix(r) for r in range(self.period)]

    def _validate(self) -> None:
        name, n = self.name, self._world_size
        if not isinstance(self._rounds, list) or not self._rounds:
            raise ValueError(
                f"topology '{name}': _get_topo_edges() must return a non-empty list of rounds"
            )
        for r, edges in enumerate(self._rounds):
            if not isinstance(edges, list) or not edges:
                raise ValueError(
                    f"topology '{name}' round {r}: a round must be a non-empty list of Edge"
                )
            seen: dict[int, int] = {}
            for e, edge in enumerate(edges):
                if not isinstance(edge, Edge):
                    raise ValueError(
                        f"topology '{name}' round {r}: item {e} is {type(edge).__name__}, not Edge"
                    )
                if not (math.isfinite(edge.weight) and 0.0 <= edge.weight <= 1.0):
                    raise ValueError(
                        f"topology '{name}' round {r}: edge {list(edge.ranks)} has weight {edge.weight}; "
                        "weights must lie in [0, 1]"
                    )
                if not edge.ranks:
                    raise ValueError(f"topology '{name}' round {r}: edge {e} has no ranks")
                for rank in edge.ranks:
                    if not 0 <= rank < n:
                        raise ValueError(
                            f"topology '{name}' round {r}: rank {rank} is out of range; ranks must be in 0..{n - 1}"
                        )
                    if rank in seen:
                        raise ValueError(
                            f"topology '{name}' round {r}: rank {rank} appears in more than one edge "
                            "(or twice in one); each rank must be in exactly one edge per round"
                        )
                    seen[rank] = e
            missing = [rank for rank in range(n) if rank not in seen]
            if missing:
                raise ValueError(
                    f"topology '{name}' round {r}: rank {missing[0]} is in no edge; "
                    "every rank must take part in every round"
                )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(world_size={self._world_size}, local_world_size={self._local_world_size})"


class TopologyReg:
    """Name registry of :class:`Topology` subclasses.

    Example::

        @TopologyReg.register('my-topology')
        class MyTopology(Topology):
            def _get_topo_edges(self): ...

        topo = TopologyReg.create('my-topology', world_size=8)
    """

    registry: dict[str, type[Topology]] = {}

    @classmethod
    def register(cls, name: str) -> Callable[[type[Topology]], type[Topology]]:
        """Class decorator that registers a topology under ``name``.

        Raises:
            ValueError: ``name`` is already registered.
            TypeError: The decorated class does not subclass :class:`Topology`.
        """
        if name in cls.registry:
            raise ValueError(
                f"topology name '{name}' is already registered (by {cls.registry[name].__name__})"
            )

        def decorator(klass: type[Topology]) -> type[Topology]:
            if not (isinstance(klass, type) and issubclass(klass, Topology)):
                raise TypeError(
                    f"@TopologyReg.register('{name}') needs a Topology subclass, got {klass!r}"
                )
            if name in cls.registry:
                raise ValueError(f"topology name '{name}' is already registered")
            klass.name = name
            cls.registry[name] = klass
            return klass

        return decorator

    @classmethod
    def names(cls) -> list[str]:
        """The registered names, in registration order."""
        return list(cls.registry)

    @classmethod
    def get(cls, name: str) -> type[Topology]:
        """The class registered as ``name``.

        Raises:
            ValueError: Unknown name; the message lists the known ones.
        """
        if name not in cls.registry:
            raise ValueError(
                f"unknown topology '{name}'; known topologies: {', '.join(cls.registry)}"
            )
        return cls.registry[name]

    @classmethod
    def create(
        cls,
        topology: str | Topology | type[Topology],
        world_size: int | None = None,
        local_world_size: int | None = None,
        **kwargs: Any,
    ) -> Topology:
        """Build a topology from a registered name, a class, or pass an instance through."""
        if isinstance(topology, Topology):
            return topology
        if isinstance(topology, str):
            klass = cls.get(topology)
        elif isinstance(topology, type) and issubclass(topology, Topology):
            klass = topology
        else:
            raise ValueError(
                f"topology={topology!r} is invalid; give a registered name ({', '.join(cls.registry)}) "
                "or a Topology instance"
            )
        return klass(world_size, local_world_size, **kwargs)


def _trivial() -> list[list[Edge]]:
    return [[Edge([0], 1.0)]]


@TopologyReg.register("complete")
class CompleteTopology(Topology):
    """All ranks average uniformly every step (one round, weight ``1/n``)."""

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self.world_size
        return [[Edge(range(n), 1.0 / n)]]


@TopologyReg.register("ring")
class RingTopology(Topology):
    """Alternating pairs on a ring: even ranks pair right, then left (weight 0.5).

    Round 0 pairs ``(i, i+1)`` and round 1 pairs ``(i, i-1 mod n)`` for even
    ``i``. For odd ``n`` the last three ranks of round 0, and ranks
    ``n-2, n-1, 0`` of round 1, form one uniformly averaging group of three,
    so each round stays a partition and both rounds together connect the ring.
    """

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self.world_size
        if n == 1:
            return _trivial()
        if n % 2 == 0:
            r0 = [Edge([i, i + 1], 0.5) for i in range(0, n, 2)]
            r1 = [Edge([i, (i - 1) % n], 0.5) for i in range(0, n, 2)]
            return [r0, r1]
        r0 = [Edge([i, i + 1], 0.5) for i in range(0, n - 3, 2)] + [
            Edge([n - 3, n - 2, n - 1], 1.0 / 3)
        ]
        r1 = [Edge([i, i + 1], 0.5) for i in range(1, n - 3, 2)] + [
            Edge([n - 2, n - 1, 0], 1.0 / 3)
        ]
        return [r0, r1]


def _greedy_shift_pairs(count: int, shift: int) -> list[tuple[int, int]]:
    """Pair every still-unpaired ``j`` with ``j + shift mod count``, in order of ``j``."""
    paired = [False] * count
    pairs = []
    for j in range(count):
        if paired[j]:
            continue
        k = (j + shift) % count
        if paired[k] or k == j:
            raise ValueError(f"no perfect matching for {count} with shift {shift}")
        paired[j] = paired[k] = True
        pairs.append((j, k))
    return pairs


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@TopologyReg.register("one-peer-exp")
class OnePeerExpTopology(Topology):
    """One-peer exponential graph: round ``r`` pairs ``j`` with ``j + 2^r``.

    The period is ``log2(n)`` rounds and reaches exact consensus once per
    period. ``n`` must be a power of two.
    """

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self.world_size
        if n == 1:
            return _trivial()
        if not _is_power_of_two(n):
            raise ValueError(
                f"one-peer-exp needs a power-of-two world size, got n={n}; use 'base-k' (one "
                "peer, exact average for any n) or 'ring' for other sizes"
            )
        return [
            [Edge(pair, 0.5) for pair in _greedy_shift_pairs(n, 2**r)]
            for r in range(int(math.log2(n)))
        ]


@TopologyReg.register("alternating-exp-ring")
class AlternatingExpRingTopology(Topology):
    """Exponential pairing of nodes, alternating intra- and inter-node rounds.

    With ``N = n / L`` nodes (a power of two, at least 2), exponential round
    ``r`` pairs node ``j`` with node ``j + 2^r mod N``. Each node pair spends
    two consecutive rounds: an intra-node round (each node's ``L`` ranks
    average, weight ``1/L``) and an inter-node round (the ``2L`` ranks of both
    nodes average, weight ``1/(2L)``). Successive pairs, counted across all
    ``r``, alternate which of the two comes first, so that at any time only
    half of the node pairs load the inter-node network. The period is
    ``2 log2(N)``.
    """

    def _get_topo_edges(self) -> list[list[Edge]]:
        n, local = self.world_size, self.local_world_size
        if n == 1:
            return _trivial()
        if n % local != 0:
            raise ValueError(
                f"alternating-exp-ring needs world_size divisible by local_world_size, got n={n}, L={local}"
            )
        nodes = n // local
        if nodes < 2:
            raise ValueError(
                f"alternating-exp-ring needs at least 2 nodes, got {n} ranks on 1 node (L={local}); "
                "run several nodes (e.g. torchrun --nnodes=2 --nproc_per_node=...) or pass a smaller "
                "local_world_size"
            )
        if not _is_power_of_two(nodes):
            raise ValueError(
                f"alternating-exp-ring needs a power-of-two number of nodes, got N={nodes} (n={n}, L={local})"
            )

        def node(j: int) -> list[int]:
            return list(range(j * local, (j + 1) * local))

        rounds: list[list[Edge]] = []
        counter = 0
        for r in range(int(math.log2(nodes))):
            first: list[Edge] = []
            second: list[Edge] = []
            for a, b in _greedy_shift_pairs(nodes, 2**r):
                intra = [Edge(node(a), 1.0 / local), Edge(node(b), 1.0 / local)]
                inter = [Edge(node(a) + node(b), 1.0 / (2 * local))]
                if counter % 2 == 0:
                    first += intra
                    second += inter
                else:
                    first += inter
                    second += intra
                counter += 1
            rounds += [first, second]
        return rounds


@TopologyReg.register("random-matching")
class RandomMatchingTopology(Topology):
    """A fixed sequence of random perfect matchings (weight 0.5).

    Args:
        world_size: Number of workers.
        local_world_size: Workers per node (unused).
        period: Number of distinct random rounds before repeating.
        seed: Seed shared by all ranks, so every rank sees the same schedule.

    For odd ``n`` one group of three averages uniformly in each round.
    """

    def __init__(
        self,
        world_size: int | None = None,
        local_world_size: int | None = None,
        period: int = 8,
        seed: int = 0,
    ):
        if period < 1:
            raise ValueError(f"period={period} is invalid; it must be >= 1")
        self._period_arg, self._seed = int(period), int(seed)
        super().__init__(world_size, local_world_size)

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self.world_size
        if n == 1:
            return _trivial()
        rng = random.Random(self._seed)
        rounds = []
        for _ in range(self._period_arg):
            perm = list(range(n))
            rng.shuffle(perm)
            cut = n - 3 if n % 2 else n
            edges = [Edge(sorted(perm[i : i + 2]), 0.5) for i in range(0, cut, 2)]
            if n % 2:
                edges.append(Edge(sorted(perm[cut:]), 1.0 / 3))
            rounds.append(edges)
        return rounds


@TopologyReg.register("local-sgd")
class LocalSGDTopology(Topology):
    """Periodic global averaging (local SGD): ``period - 1`` local rounds, then one complete round.

    Rounds ``0 .. period-2`` are singletons: every rank keeps its own model and
    nothing is sent (the wrapper skips both the copy and the collective for a
    group of one). Round ``period-1`` is one group of all ranks, weight
    ``1/n``. In ``x(t) = W(t) x(t-1) + d(t)`` the workers therefore take
    ``period`` local steps between averages, which is the inner loop of
    DiLoCo and the schedule of torch's ``PostLocalSGDOptimizer``. With
    ``period=1`` it is :class:`CompleteTopology`.

    Args:
        world_size: Number of workers.
        local_world_size: Workers per node (unused).
        period: Steps between global averages ``H``, an integer ``>= 1``.

    Raises:
        ValueError: ``period`` is not an integer ``>= 1``.

    Example::

        topo = LocalSGDTopology(world_size=8, period=4)   # or TopologyReg.create("local-sgd", 8, period=4)
        [len(edges) for edges in topo.rounds]              # [8, 8, 8, 1]
    """

    def __init__(
        self,
        world_size: int | None = None,
        local_world_size: int | None = None,
        period: int = 8,
    ):
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"period={period!r} is invalid; it must be an integer >= 1")
        self._period_arg = period
        super().__init__(world_size, local_world_size)

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self.world_size
        if n == 1:
            return _trivial()
        local = [Edge([i], 1.0) for i in range(n)]
        return [list(local) for _ in range(self._period_arg - 1)] + [[Edge(range(n), 1.0 / n)]]


# --------------------------------------------------------------------------- base-(k+1)

# a group as (ranks, weight) and a round as a tuple of groups: hashable, so schedules are cached
_Group = tuple[tuple[int, ...], float]
_Sched = tuple[tuple[_Group, ...], ...]


def _leading_digit(n: int, base: int) -> tuple[int, int]:
    """``(a, p)`` with ``a * base**p <= n < (a + 1) * base**p`` and ``1 <= a < base``."""
    p = 0
    while base ** (p + 1) <= n:
        p += 1
    return n // base**p, p


@functools.cache
def _smooth_factors(n: int, base: int) -> tuple[int, ...] | None:
    """Fewest factors, each in ``2..base``, whose product is ``n``; ``None`` if there are none."""
    if n == 1:
        return ()
    options = [
        (d, *rest)
        for d in range(min(base, n), 1, -1)
        if n % d == 0 and (rest := _smooth_factors(n // d, base)) is not None
    ]
    return min(options, key=len) if options else None


def _hyper_hypercube(nodes: Sequence[int], factors: Sequence[int]) -> _Sched:
    """Exact averaging of ``nodes`` in ``len(factors)`` rounds.

    Node ``i`` is written in the mixed radix ``factors``; round ``j`` averages
    uniformly each group of nodes that differ only in digit ``j``.
    """
    rounds = []
    stride = 1
    for f in factors:
        groups = tuple(
            (tuple(nodes[i + d * stride] for d in range(f)), 1.0 / f)
            for i in range(len(nodes))
            if (i // stride) % f == 0
        )
        rounds.append(groups)
        stride *= f
    return tuple(rounds)


def _side_by_side(*schedules: _Sched) -> _Sched:
    """Run schedules on disjoint nodes in parallel; a finished one leaves its nodes alone."""
    length = max((len(s) for s in schedules), default=0)
    return tuple(tuple(g for s in schedules if r < len(s) for g in s[r]) for r in range(length))


def _relabel(schedule: _Sched, offset: int) -> _Sched:
    return tuple(
        tuple((tuple(r + offset for r in ranks), w) for ranks, w in groups) for groups in schedule
    )


def _deferred(nodes: tuple[int, ...], base: int) -> tuple[_Sched, _Sched]:
    """Split exact averaging of ``nodes`` into phases ``(A, B)``.

    After phase A every node holds a value whose *block* (a group that phase B
    averages exactly) has the mean of all ``nodes``; nodes outside every block
    already hold that mean. Phase B averages each block. Hence any step that
    replaces every value ``y`` by ``(1 - c) y + c z``, with one ``z`` for all
    of ``nodes``, may sit between the phases: the result is still the mean,
    shifted the same way. This lets the exchange of an enclosing level
    overlap phase B of the levels below it.
    """
    m = len(nodes)
    a, p = _leading_digit(m, base)
    factors = _smooth_factors(m, base)
    # one pass when it is no longer than the leading block's (64 = 2^6 for k=2 is not)
    if factors is not None and len(factors) <= p + (a > 1):
        return (), _hyper_hypercube(nodes, factors)
    v = a * base**p
    block, tail = nodes[:v], nodes[v:]
    block_pass = _hyper_hypercube(block, _smooth_factors(v, base) or ())
    tail_a, tail_b = _deferred(tail, base)
    before = _side_by_side(block_pass, tail_a)
    # each tail node meets its own block node (len(tail) < base**p <= v); both keep s/m, with
    # s = len(tail): the tail moves to (s y + v A) / m, and the block's mean becomes
    # (v A + s B) / m, with A the block's and B the tail's mean
    s = len(tail)
    exchange = tuple(((t, b), s / m) for t, b in zip(tail, block))
    return before + (exchange,), _side_by_side(block_pass, tail_b)


@functools.cache
def _base_k_schedule(n: int, base: int) -> _Sched:
    """The shortest of: hyper-hypercube (smooth ``n``), the digit chain, and products."""
    phase_a, phase_b = _deferred(tuple(range(n)), base)
    best = phase_a + phase_b
    factors = _smooth_factors(n, base)
    if factors is not None and len(factors) < len(best):
        best = _hyper_hypercube(range(n), factors)
    # n = c * m with c smooth: average m-rank rows side by side, then each c-rank column
    for c in range(2, n // 2 + 1):
        col = _smooth_factors(c, base) if n % c == 0 else None
        if col is None:
            continue
        m = n // c
        row = _base_k_schedule(m, base)
        if len(row) + len(col) >= len(best):
            continue
        rows = _side_by_side(*[_relabel(row, q * m) for q in range(c)])
        cols = _side_by_side(
            *[_hyper_hypercube([q * m + j for q in range(c)], col) for j in range(m)]
        )
        best = rows + cols
    return best


def base_k_period_bound(n: int, k: int) -> int:
    """The period :class:`BaseKTopology` never exceeds: ``2p + 2 + [a > 1]``.

    With ``n = a (k+1)^p + r``, ``1 <= a <= k`` and ``0 <= r < (k+1)^p`` (``a``
    is the leading base-``(k+1)`` digit), and ``0`` for ``n = 1``. A world
    size that factors into numbers ``<= k+1`` needs only its hyper-hypercube
    (at most ``p + 1`` rounds). For ``k <= 3`` the bound is at most
    ``2 log_{k+1}(n) + 2``, the bound of Takezawa et al. (NeurIPS 2023).
    """
    if n == 1:
        return 0
    a, p = _leading_digit(n, k + 1)
    return 2 * p + 2 + (1 if a > 1 else 0)


@TopologyReg.register("base-k")
class BaseKTopology(Topology):
    """Base-(k+1) graph: exact averaging after a finite period, any world size, ``<= k`` peers.

    After Takezawa et al., "Beyond Exponential Graph: Communication-Efficient
    Topologies for Decentralized Learning via Finite-time Convergence",
    NeurIPS 2023. The product of one period's mixing matrices is exactly
    ``11^T / n`` and no rank talks to more than ``k`` peers in a round. This
    answers "one-peer-exp needs a power of two": ``base-k`` with ``k=1`` is a
    one-peer topology with exact consensus for every ``n``.

    Construction, with ``b = k + 1``:

    - If ``n`` factors into numbers ``f_1 ... f_L <= b``, the *hyper-hypercube*:
      write each rank in the mixed radix ``(f_1, ..., f_L)``; round ``j``
      averages uniformly the ``f_j`` ranks that differ only in digit ``j``.
      ``L`` rounds (the fewest factors).
    - Otherwise split ``n`` by its leading base-``b`` digit, ``n = v + s`` with
      ``v = a b^p`` and ``s < b^p``. The first ``v`` ranks run the
      hyper-hypercube of ``v`` (average ``A``) while the other ``s`` ranks run
      the first phase of the same construction for ``s`` (recursively). Then
      one exchange round pairs each of the ``s`` ranks with its own rank of the
      first ``v``; both keep ``s/n`` and take ``v/n`` (a uniform two-rank
      edge). The ``s`` ranks now hold ``(s y + v A) / n``, whose mean over every
      block still to be averaged is the global mean, and the ``v`` ranks hold
      values whose mean is the global mean. Finally the ``v`` ranks run their
      hyper-hypercube again while the ``s`` ranks finish theirs. Every edge is
      uniform, with at most ``b`` members.
    - If ``n = c m`` with ``c`` factoring into numbers ``<= b``, also consider
      running the construction for ``m`` on ``c`` rows side by side and then
      the hyper-hypercube of ``c`` on each column; the shortest wins.

    Period bound (checked for every ``n`` up to 1024 and ``k`` up to 7): with
    leading digit ``a`` and exponent ``p`` of ``n`` in base ``b``, the period is
    at most ``2p + 2 + [a > 1]`` (:func:`base_k_period_bound`): the exchange at
    level ``l`` happens after ``max(p_l + 1, p_{l+1} + 2) <= p_l + 2`` rounds of
    its level, and the final pass adds ``p_1 + [a > 1]``. For ``k <= 3`` this
    is at most ``2 log_{k+1}(n) + 2`` (``a >= 2 >= sqrt(k+1)``), the length
    the paper states for its Base-(k+1) graph.

    Args:
        world_size: Number of workers.
        local_world_size: Workers per node (unused).
        k: Maximum number of peers per round, an integer ``>= 1``.

    Raises:
        ValueError: ``k`` is not an integer ``>= 1``.

    Example::

        topo = BaseKTopology(world_size=6, k=1)    # or TopologyReg.create("base-k", 6, k=1)
        topo.period                                 # 4; exact average after every 4 steps
    """

    def __init__(
        self,
        world_size: int | None = None,
        local_world_size: int | None = None,
        k: int = 1,
    ):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} is invalid; it must be an integer >= 1 (peers per round)")
        self._k = k
        super().__init__(world_size, local_world_size)

    @property
    def k(self) -> int:
        """Maximum number of peers per round."""
        return self._k

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self.world_size
        if n == 1:
            return _trivial()
        rounds = []
        for groups in _base_k_schedule(n, self._k + 1):
            busy = {r for ranks, _ in groups for r in ranks}
            # ranks a round leaves alone keep their own model
            rest = [((r,), 1.0) for r in range(n) if r not in busy]
            rounds.append([Edge(ranks, w) for ranks, w in sorted([*groups, *rest])])
        return rounds


def mixing_matrices(
    topology: str | type[Topology] | Topology,
    world_size: int,
    local_world_size: int = 1,
    **kwargs: Any,
) -> list[torch.Tensor]:
    """One float64 ``n x n`` mixing matrix per round of the topology's period.

    Args:
        topology: A registered name, a :class:`Topology` subclass or an instance.
        world_size: Number of workers ``n``.
        local_world_size: Workers per node ``L``.
        **kwargs: Extra arguments of the topology's constructor.

    Returns:
        A list of ``period`` symmetric, doubly stochastic matrices.
    """
    return TopologyReg.create(topology, world_size, local_world_size, **kwargs).mixing_matrices()


def describe(name: str, world_size: int, local_world_size: int = 1) -> dict[str, Any]:
    """Summary row of one registered topology: period, peers, gap, contraction.

    Where the size does not fit, the row has ``error`` with the reason.
    """
    try:
        topo = TopologyReg.create(name, world_size, local_world_size)
    except ValueError as exc:
        return {"name": name, "error": str(exc)}
    mats = topo.mixing_matrices()
    peers = max(len(e.ranks) - 1 for edges in topo.rounds for e in edges)
    contraction = period_contraction(mats)
    return {
        "name": name,
        "period": topo.period,
        "peers_per_round": peers,
        "worst_gap": min(spectral_gap(w) for w in mats),
        "contraction": contraction,
        "rate_per_step": consensus_rate(mats),
    }


def _table(world_size: int, local_world_size: int) -> str:
    head = "| topology | period | peers/round | worst-round spectral gap | period contraction | per-step rate |"
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for name in TopologyReg.names():
        row = describe(name, world_size, local_world_size)
        if "error" in row:
            lines.append(f"| {name} | n/a: {row['error']} | | | | |")
        else:
            lines.append(
                f"| {name} | {row['period']} | {row['peers_per_round']} | "
                f"{row['worst_gap']:.4f} | {row['contraction']:.3e} | {row['rate_per_step']:.4f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the topology table (``python -m decent_dp.topo --world-size 64``)."""
    parser = argparse.ArgumentParser(
        description="Print every registered topology's mixing properties."
    )
    parser.add_argument("--world-size", "-n", type=int, default=64)
    parser.add_argument(
        "--local-world-size",
        "-l",
        type=int,
        default=8,
        help="ranks per node (for alternating-exp-ring)",
    )
    args = parser.parse_args(argv)
    if args.world_size < 1 or args.local_world_size < 1:
        parser.error(
            f"--world-size={args.world_size} and --local-world-size={args.local_world_size} must be >= 1"
        )
    print(f"world size n={args.world_size}, local world size L={args.local_world_size}")
    print(
        "spectral gap = 1 - max(|λ2|, |λn|) of one round's W; period contraction = ||W(P-1)...W(0) - 11ᵀ/n||₂;"
    )
    print(
        "per-step rate = 1 - contraction^(1/period), the average shrink of the disagreement per step"
    )
    print(_table(args.world_size, args.local_world_size))


if __name__ == "__main__":
    main()
