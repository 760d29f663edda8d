"""The topology base: :class:`Edge`, :class:`Topology` and the name registry :class:`TopologyReg`.

Public under :mod:`decent_dp.topo`; kept apart from the built-in topologies
so that ``python -m decent_dp.topo`` and ``import decent_dp.topo`` share one
registry.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Edge", "Topology", "TopologyReg"]


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
