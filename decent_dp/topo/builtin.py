"""The built-in topologies, registered under their names on import.

``complete``, ``ring``, ``one-peer-exp``, ``alternating-exp-ring``,
``random-matching``, ``local-sgd``, ``base-k`` and ``hierarchical``; public under
:mod:`decent_dp.topo`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from .base_k import _base_k_schedule
from .graph import Edge, Topology, TopologyReg, _world_from_env


def _positive_int(name: str, value: int, note: str = "") -> int:
    """``value``, or ``ValueError`` unless it is an integer ``>= 1`` (``bool`` is not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid; it must be an integer >= 1{note}")
    return value


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
        self._period_arg = _positive_int("period", period)
        super().__init__(world_size, local_world_size)

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self.world_size
        if n == 1:
            return _trivial()
        local = [Edge([i], 1.0) for i in range(n)]
        return [list(local) for _ in range(self._period_arg - 1)] + [[Edge(range(n), 1.0 / n)]]


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
        self._k = _positive_int("k", k, " (peers per round)")
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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@TopologyReg.register("hierarchical")
class HierarchicalTopology(Topology):
    """Exact averaging inside each host, another topology between hosts.

    Hosts are blocks of ``L = local_world_size`` consecutive ranks, as torchrun
    numbers them. The inter-host topology ``inter`` is built for the ``n / L``
    hosts, and each round's mixing matrix is the Kronecker product
    ``W(t) = W_inter(t) ⊗ J_L / L`` (``J_L`` the ``L x L`` matrix of ones):
    after a step every rank of a host holds the same mix of its host's average
    and its partner hosts' averages. As edges, an inter-host edge over hosts
    ``H`` becomes one edge over the union of their ranks with weight
    ``1 / (|H| L)``, and a host alone averages its own ranks (weight ``1 / L``).
    The wrapper runs an edge of several hosts in three phases, so that a host's
    link carries one model per step (:mod:`decent_dp._comm.hierarchical`).

    The inter-host topology's edges must average uniformly (weight ``1/k`` for
    ``k`` hosts): a non-uniform edge would give a rank's own host another
    weight than the partner hosts, which one uniform edge cannot express.

    Args:
        world_size: Number of workers ``n``.
        local_world_size: Ranks per host ``L``, a divisor of ``n``; from
            ``LOCAL_WORLD_SIZE`` when omitted.
        inter: The registered topology between hosts (default ``one-peer-exp``).
        inter_kwargs: Keyword arguments of ``inter``'s constructor.

    Raises:
        ValueError: ``L`` does not divide ``n``, ``inter`` is unknown, does not
            fit ``n / L`` hosts, or has an edge of non-uniform weight.

    Example::

        topo = HierarchicalTopology(world_size=16, local_world_size=4, inter="ring")
        # or DDP(model, optim_fn, topology="hierarchical", local_world_size=4,
        #        topology_kwargs={"inter": "ring"})
    """

    def __init__(
        self,
        world_size: int | None = None,
        local_world_size: int | None = None,
        inter: str = "one-peer-exp",
        inter_kwargs: dict[str, Any] | None = None,
    ):
        n, local = _world_from_env(world_size, local_world_size)
        if n >= 1 and (local < 1 or n % local != 0):
            raise ValueError(
                f"hierarchical: local_world_size={local} must divide world_size={n}; "
                f"allowed: {', '.join(map(str, _divisors(n)))}"
            )
        known = [name for name in TopologyReg.names() if name != self.name]
        if not isinstance(inter, str) or inter not in known:
            raise ValueError(
                f"hierarchical: inter={inter!r} is not a known topology; known: {', '.join(known)}"
            )
        hosts = max(n // max(local, 1), 1)
        try:
            self.inter = TopologyReg.create(inter, hosts, 1, **(inter_kwargs or {}))
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"hierarchical: inter={inter!r} does not fit {hosts} hosts "
                f"(world_size={n}, local_world_size={local}): {exc}"
            ) from None
        for r, edges in enumerate(self.inter.rounds):
            for edge in edges:
                k = len(edge.ranks)
                if k > 1 and not math.isclose(edge.weight, 1.0 / k, rel_tol=1e-12):
                    raise ValueError(
                        f"hierarchical: inter={inter!r} at {hosts} hosts has a non-uniform edge "
                        f"(round {r}, hosts {list(edge.ranks)}, weight {edge.weight:.6g} != 1/{k}); "
                        "a hierarchical edge averages its hosts uniformly"
                    )
        super().__init__(n, local)

    @property
    def hosts(self) -> int:
        """Number of hosts ``n / L``."""
        return self.world_size // self.local_world_size

    def _get_topo_edges(self) -> list[list[Edge]]:
        local = self.local_world_size

        def ranks(hosts: Sequence[int]) -> list[int]:
            return [h * local + i for h in sorted(hosts) for i in range(local)]

        return [
            [Edge(ranks(e.ranks), 1.0 / (len(e.ranks) * local)) for e in edges]
            for edges in self.inter.rounds
        ]
