"""What :class:`~decent_dp.ddp.DecentralizedDataParallel` reports of its communication.

Bytes per step, mean and peak, from the schedule, the buckets and the
compressor with the cost model of :mod:`decent_dp._comm_cost` (and
:func:`decent_dp._outer.schedule_bytes` for outer rounds), and the layout of
the buckets.
"""

from __future__ import annotations

from typing import Any

from ._bucket import aligned_offsets
from ._codecs import CompressionSpec
from ._comm_cost import bytes_per_step
from ._engine import Engine
from ._outer import schedule_bytes

__all__ = ["CommReportMixin"]


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
        :mod:`decent_dp._compression` (one payload per exchange for pairs). Before
        the first backward the trained parameters count as one block (so as one
        fragment of the outer optimizer).
        """
        numels, size = self._bucket_numels()
        edges, outer = self._engine.gossip.edges, self._engine.outer
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
        if outer is None:
            return max(bytes_per_step(self.compression, [e], numels, size) for e in edges)
        return max(schedule_bytes(outer, edges, numels, size, self.compression))

    @property
    def buckets_info(self) -> list[dict[str, Any]]:
        """Name list, element count (padding included) and dtype of each bucket (empty before the first backward)."""
        return [
            {"names": list(b.names), "numel": b.numel, "dtype": str(b.dtype)}
            for b in (self._engine.buckets or [])
        ]
