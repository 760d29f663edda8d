"""Global averaging across all workers: the exact mean model, and how far the workers are from it.

:class:`GlobalAverager` does the work behind
:meth:`DecentralizedDataParallel.global_avg`,
:meth:`~DecentralizedDataParallel.revert_global_avg`,
:meth:`~DecentralizedDataParallel.averaged` and
:meth:`~DecentralizedDataParallel.consensus_distance`, which
:class:`AveragingMixin` gives the wrapper. Each first drains the gossip in
flight, so that the values it reads are the current ``x(t)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..metrics import count_sketch
from .engine import Engine

__all__ = ["AveragingMixin", "GlobalAverager"]


class GlobalAverager:
    """All-reduce averaging of an engine's parameters, with what ``revert`` needs to undo it.

    Args:
        engine: The engine whose parameters are averaged.
        module: The wrapped module, for its buffers.
        sync_buffers: Average floating-point buffers too.
        group: The group averaged over (``None``: every rank); a sharded model's
            replicate group, whose ranks hold the same shard of each replica.
        size: The number of models averaged (``group``'s size; the world's by default).
        norm_group: Where the parts of one model are summed for a distance (a
            replica's shard ranks), or ``None`` when each rank holds a whole model.
    """

    def __init__(
        self,
        engine: Engine,
        module: nn.Module,
        sync_buffers: bool,
        group: Any = None,
        size: int | None = None,
        norm_group: Any = None,
    ):
        self._engine = engine
        self._module = module
        self._sync_buffers = sync_buffers
        self._group = group
        self._norm_group = norm_group
        self._world_size = size if size is not None else engine.world_size
        self._backup: tuple[int, list[torch.Tensor], list[Any]] | None = None

    def _targets(self) -> list[torch.Tensor]:
        """The parameters, and float buffers if enabled."""
        buffers = (
            [b for b in self._module.buffers() if b.is_floating_point()]
            if self._sync_buffers
            else []
        )
        return self._engine.values() + buffers

    @torch.no_grad()
    def _average_in_place(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            dist.all_reduce(t, group=self._group)
            t.div_(self._world_size)

    @torch.no_grad()
    def average(self, will_revert: bool, return_d2c: bool) -> float | None:
        """Replace the values by the global mean, setting the drained gossip aside."""
        engine = self._engine
        engine.drain()
        targets = self._targets()
        saved = [t.clone() for t in targets] if (will_revert or return_d2c) else []
        self._average_in_place(targets)
        dropped = engine.forget_gossip()
        # identical workers mix to themselves, except that an outer round must still take place
        engine.relaunch_outer_rounds()
        self._backup = (engine.step_count, saved, dropped) if will_revert else None
        if not return_d2c:
            return None
        n = len(engine.values())
        sq = torch.as_tensor(
            sum((t.double() - s.double()).pow(2).sum() for t, s in zip(targets[:n], saved[:n]))
        )
        if self._norm_group is not None:  # this rank holds a part of its model
            dist.all_reduce(sq, group=self._norm_group)
        return float(sq.sqrt().item())

    @torch.no_grad()
    def revert(self) -> None:
        """Restore the values (and, before any further step, the gossip) saved by :meth:`average`."""
        if self._backup is None:
            raise RuntimeError("no global average to revert; call global_avg(will_revert=True)")
        step, saved, dropped = self._backup
        engine = self._engine
        engine.drain()
        for t, s in zip(self._targets(), saved):
            t.copy_(s)
        if step == engine.step_count:
            for b, (pending, states) in zip(engine.buckets or [], dropped):
                b.pending, b.state_pending = pending, states
        self._backup = None

    @contextlib.contextmanager
    def averaged(self) -> Iterator[None]:
        """The global mean in place of the values, inside the ``with`` block only."""
        self._engine.drain()
        targets = self._targets()
        with torch.no_grad():
            saved = [t.clone() for t in targets]
        self._average_in_place(targets)
        try:
            yield
        finally:
            with torch.no_grad():
                for t, s in zip(targets, saved):
                    t.copy_(s)

    @torch.no_grad()
    def consensus_distance(self, sketch: int | None) -> float:
        """``(1/n) sum_i ||x_i - xbar||^2``, exact or by a count sketch of ``sketch`` numbers."""
        self._engine.drain()
        values = self._engine.values()
        device = values[0].device
        if sketch is None:
            local = torch.zeros(1, dtype=torch.float64, device=device)
            for v in values:
                mean = v.clone()
                dist.all_reduce(mean, group=self._group)
                mean.div_(self._world_size)
                local += (v.double() - mean.double()).pow(2).sum()
        else:
            y = count_sketch(values, int(sketch), seed=self._engine.step_count)
            ybar = y.clone()
            dist.all_reduce(ybar, group=self._group)
            ybar.div_(self._world_size)
            local = (y - ybar).pow(2).sum().reshape(1)
        dist.all_reduce(local)  # every rank's part of every model's distance
        return float(local.item()) / self._world_size


class AveragingMixin:
    """The averaging methods of :class:`~decent_dp.ddp.DecentralizedDataParallel`."""

    _engine: Engine
    _averager: GlobalAverager
    module: nn.Module

    def _drain(self) -> None:
        """Finish in-flight gossip (the results stay pending for the next step)."""
        self._engine.drain()

    @torch.no_grad()
    def global_avg(self, will_revert: bool = True, return_d2c: bool = False) -> float | None:
        """Replace every worker's parameters (and float buffers, if enabled) by the global mean.

        Gossip in flight is drained and set aside: all workers are identical
        afterwards, so the next step mixes the identity.

        Args:
            will_revert: Keep a copy of the current values (and the gossip set
                aside) for :meth:`revert_global_avg`, as decent-dp 0.2.x does.
            return_d2c: Return this worker's distance to the centre,
                ``||x_i - xbar||`` (the Euclidean norm over all parameters).

        Returns:
            The distance to the centre when ``return_d2c``, else ``None``.
        """
        return self._averager.average(will_revert, return_d2c)

    @torch.no_grad()
    def revert_global_avg(self) -> None:
        """Restore the values saved by the last ``global_avg(will_revert=True)``.

        Called before any further step, the gossip that was set aside is
        restored too, so training continues as if nothing happened.

        Raises:
            RuntimeError: There is nothing to revert.
        """
        self._averager.revert()

    @contextlib.contextmanager
    def averaged(self) -> Iterator[nn.Module]:
        """Swap in the global mean model (e.g. for evaluation); restore on exit.

        Example::

            with model.averaged():
                acc = evaluate(model)
        """
        with self._averager.averaged():
            yield self.module

    def consensus_distance(self, sketch: int | None = None) -> float:
        """``(1/n) sum_i ||x_i - xbar||^2`` over all parameters, identical on every rank.

        Args:
            sketch: ``None`` for the exact value (one all-reduce of the model);
                an integer ``k`` for an unbiased count-sketch estimate whose
                communication is ``k`` numbers, independent of the model size.
                Its relative standard error is at most ``sqrt(2/k)``.

        Returns:
            The consensus distance (a Python float).
        """
        return self._averager.consensus_distance(sketch)
