"""What :class:`~decent_dp.ddp.DecentralizedDataParallel` reports of its communication.

Bytes per step, mean and peak, from the schedule, the buckets and the
compressor with the cost model of :mod:`decent_dp.compression.cost` (and
:func:`schedule_bytes` for outer rounds), and the layout of
the buckets.
"""

from __future__ import annotations

import math
from typing import Any

from .._comm.hierarchical import link_bytes
from ..compression.codecs import CompressionSpec
from ..compression.cost import bytes_per_step, exchange_bytes
from ..topo import Edge
from .bucket import aligned_offsets
from .engine import Engine
from .outer import OuterOptimizer
from .state_sync import StateSync

__all__ = ["CommReportMixin", "schedule_bytes", "state_sync_bytes"]


class CommReportMixin:
    """The communication report of :class:`~decent_dp.ddp.DecentralizedDataParallel`."""

    _engine: Engine
    compression: CompressionSpec

    def _bucket_numels(self) -> tuple[list[int], int]:
        """Each bucket's element count and the element size (one block before the buckets exist)."""
        engine = self._engine
        if engine.buckets is not None:
            return [b.numel for b in engine.buckets], engine.buckets[0].comm.element_size()
        size = engine.params[0].element_size()
        return [aligned_offsets(engine.params, size)[1]], size

    def comm_bytes_per_step(self) -> float:
        """Bytes this rank sends per step for gossip, averaged over the period (and outer rounds).

        From the schedule, the buckets and the compressor, with the cost model of
        :mod:`decent_dp._comm.compressed` (one payload per exchange for pairs). Before
        the first backward the trained parameters count as one block (so as one
        fragment of the outer optimizer).
        """
        numels, size = self._bucket_numels()
        edges, outer = self._engine.gossip.edges, self._engine.outer
        if self._engine.gossip.hosts is not None:  # three-phase edges: their phases' bytes
            steps = [a + b for a, b in self._link_steps()]
            return sum(steps) / len(steps)
        sync = self._engine.gossip.state_sync
        if sync is not None:  # the states' rounds: the span is lcm(period, every K)
            steps = state_sync_bytes(sync, edges, numels, size, self.compression)
            return sum(steps) / len(steps)
        if outer is None:
            return bytes_per_step(self.compression, edges, numels, size)
        # the outer rounds replace the topology's: the span is lcm(period, H)
        steps = schedule_bytes(outer, edges, numels, size, self.compression)
        return sum(steps) / len(steps)

    def comm_peak_bytes_per_step(self) -> float:
        """The most bytes this rank sends at any one step of the schedule (lcm of period and ``H``).

        Counted as :meth:`comm_bytes_per_step` counts them, per step instead of
        averaged: with ``outer_fragments=F`` an outer round moves about ``1/F``
        of the model at a time, which lowers the peak but not the mean.
        """
        numels, size = self._bucket_numels()
        edges, outer = self._engine.gossip.edges, self._engine.outer
        if self._engine.gossip.hosts is not None:
            return max(a + b for a, b in self._link_steps())
        sync = self._engine.gossip.state_sync
        if sync is not None:
            return max(state_sync_bytes(sync, edges, numels, size, self.compression))
        if outer is None:
            return max(bytes_per_step(self.compression, [e], numels, size) for e in edges)
        return max(schedule_bytes(outer, edges, numels, size, self.compression))

    def _link_steps(self) -> list[tuple[float, float]]:
        numels, size = self._bucket_numels()
        engine = self._engine
        return link_bytes(
            engine.gossip.edges,
            numels,
            size,
            engine.topology.local_world_size,
            engine.gossip.hosts is not None,
            self.compression,
            engine.outer,
        )

    def comm_bytes_by_link(self, peak: bool = False) -> dict[str, float]:
        """:meth:`comm_bytes_per_step` split into bytes inside this rank's host and between hosts.

        Hosts are blocks of ``local_world_size`` ranks. The phases of a
        ``hierarchical`` topology's edges count apart (the reduce-scatter and
        all-gather inside the host, the chunk's all-reduce between hosts); any
        other group counts inside when its ranks share a host, else between.

        Args:
            peak: The busiest step of the schedule for each, instead of the mean.

        Returns:
            ``{"intra_host": bytes, "inter_host": bytes}``; their sum is
            :meth:`comm_bytes_per_step` (the mean).
        """
        steps = self._link_steps()
        intra, inter = [a for a, _ in steps], [b for _, b in steps]
        if peak:
            return {"intra_host": max(intra), "inter_host": max(inter)}
        return {"intra_host": sum(intra) / len(steps), "inter_host": sum(inter) / len(steps)}

    @property
    def buckets_info(self) -> list[dict[str, Any]]:
        """Name list, element count (padding included) and dtype of each bucket (empty before the first backward)."""
        return [
            {"names": list(b.names), "numel": b.numel, "dtype": str(b.dtype)}
            for b in (self._engine.buckets or [])
        ]


def schedule_bytes(
    outer: OuterOptimizer,
    edges: list[Edge],
    numels: list[int],
    element_size: int,
    gossip: CompressionSpec,
) -> list[float]:
    """Bytes this rank sends at each step ``t = 1 .. lcm(period, H)``, outer rounds included.

    Each bucket's step is its fragment's: the all-reduce of the world at its
    outer rounds (compressed by the outer optimizer's compression), else its
    shifted topology round, compressed by ``gossip`` (the cost model of
    :func:`decent_dp.compression.cost.exchange_bytes`).

    Args:
        outer: The outer optimizer (its schedule and fragments).
        edges: This rank's edge in each round of the topology's period.
        numels: The element count of each bucket, in bucket order.
        element_size: Bytes per element of the buckets.
        gossip: The gossip's compressor.
    """
    period = len(edges)
    span = math.lcm(period, outer.every)
    spec = CompressionSpec(outer.compression)
    k_outer = len(outer.edge.ranks)
    steps = []
    for t in range(1, span + 1):
        sent = 0.0
        for b, n in enumerate(numels):
            if outer.due(t, b):
                sent += exchange_bytes(spec, n, element_size, k_outer)
            else:
                edge = edges[(t - outer.shift(b) - 1) % period]
                sent += exchange_bytes(gossip, n, element_size, len(edge.ranks))
        steps.append(sent)
    return steps


def state_sync_bytes(
    sync: StateSync,
    edges: list[Edge],
    numels: list[int],
    element_size: int,
    gossip: CompressionSpec,
) -> list[float]:
    """Bytes this rank sends at each step ``t = 1 .. lcm(period, every K)``, states included.

    The parameters' exchange of each bucket as :func:`decent_dp.compression.cost.exchange_bytes`
    counts it, plus, at the steps where names are due, one exact all-reduce of
    that many blocks of the bucket's size on the same group.

    Args:
        sync: The states gossiped and their periods.
        edges: This rank's edge in each round of the topology's period.
        numels: The element count of each bucket, in bucket order.
        element_size: Bytes per element of the buckets (and of their states).
        gossip: The gossip's compressor.
    """
    period = len(edges)
    span = math.lcm(period, *sync.spec.values())
    exact = CompressionSpec("none")
    steps = []
    for t, m in zip(range(1, span + 1), sync.rounds_in(span)):
        k = len(edges[(t - 1) % period].ranks)
        sent = sum(exchange_bytes(gossip, n, element_size, k) for n in numels)
        if m:
            sent += sum(exchange_bytes(exact, n * m, element_size, k) for n in numels)
        steps.append(sent)
    return steps
