"""The per-bucket lists that decent-dp 0.2.x scripts read, and loading what they saved.

Scripts written for 0.2.x read ``model._optims`` and ``model._lr_schedulers``
(one optimizer and one scheduler per bucket) to log the learning rate and to
checkpoint. Both are empty until the first backward pass has cut the
parameters into buckets. :func:`load_bucket_states` puts such a checkpoint
back, into the existing buckets or, in a fresh wrapper, into the buckets its
first backward pass builds. :class:`LegacyMixin` gives the wrapper these
names.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from torch.optim import Optimizer

from ..optim._kernels import restore_fused
from .bucket import Bucket
from .engine import Engine

__all__ = ["LegacyMixin", "bucket_optimizers", "bucket_schedulers", "load_bucket_states"]


def bucket_optimizers(engine: Engine) -> list[Optimizer]:
    """Each bucket's optimizer, in bucket order; ``[]`` before the first backward."""
    return [b.optimizer for b in engine.buckets or [] if b.optimizer is not None]


def bucket_schedulers(engine: Engine) -> list[Any]:
    """Each bucket's LR scheduler (``None`` without ``lr_scheduler_fn``); ``[]`` before the first backward."""
    return [b.scheduler for b in engine.buckets or []]


def _load_into(
    optimizers: Sequence[dict[str, Any]],
    schedulers: Sequence[dict[str, Any]],
    buckets: list[Bucket],
) -> None:
    if len(optimizers) != len(buckets):
        raise ValueError(
            f"{len(optimizers)} saved optimizer states for {len(buckets)} buckets; load them into "
            "a wrapper of the same model with the same bucket_size_in_mb"
        )
    with_sched = [b for b in buckets if b.scheduler is not None]
    if len(schedulers) != len(with_sched):
        raise ValueError(
            f"{len(schedulers)} saved scheduler states for {len(with_sched)} bucket schedulers; "
            "pass the same lr_scheduler_fn (or None) as the run that saved them"
        )
    for b, state in zip(buckets, optimizers):
        assert b.optimizer is not None
        b.optimizer.load_state_dict(state)
        if b.fused:
            restore_fused(b.optimizer)  # the loaded groups replace the ones the wrapper set
    for b, state in zip(with_sched, schedulers):
        b.scheduler.load_state_dict(state)


def load_bucket_states(
    engine: Engine,
    optimizers: Sequence[dict[str, Any]],
    lr_schedulers: Sequence[dict[str, Any] | None],
    step: int,
) -> None:
    """Restore per-bucket optimizer and scheduler states and the step counter.

    With buckets, the states load now and the gossip restarts from the current
    parameters before the next forward pass, as after ``load_state_dict``.
    Without (a fresh wrapper), they load when the first backward pass has
    built the buckets, before that pass steps; that step mixes nothing in,
    exactly as the step after :meth:`global_avg` does.

    Raises:
        ValueError: ``step`` is not an integer ``>= 0``, or the states do not
            fit the buckets (checked when the buckets exist).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r} is invalid; it must be the integer step count (>= 0)")
    opts = list(optimizers)
    scheds = [s for s in lr_schedulers if s is not None]  # 0.2.x scripts drop the Nones
    engine.drain()
    if engine.buckets is not None:
        _load_into(opts, scheds, engine.buckets)
        engine.forget_gossip()
        engine.relaunch = step > 0
    else:
        engine.after_build = partial(_load_into, opts, scheds)
    engine.step_count = step


class LegacyMixin:
    """decent-dp 0.2.x's per-bucket names on :class:`~decent_dp.ddp.DecentralizedDataParallel`."""

    _engine: Engine

    @property
    def _optims(self) -> list[Optimizer]:
        """decent-dp 0.2.x's per-bucket optimizers, in bucket order (``[]`` before the first backward)."""
        return bucket_optimizers(self._engine)

    @property
    def _lr_schedulers(self) -> list[Any]:
        """decent-dp 0.2.x's per-bucket LR schedulers (``None`` without ``lr_scheduler_fn``; ``[]`` at first)."""
        return bucket_schedulers(self._engine)

    def load_bucket_states(
        self,
        optimizers: list[dict[str, Any]],
        lr_schedulers: list[dict[str, Any] | None],
        step: int,
    ) -> None:
        """Restore the states a 0.2.x-style script saved through :attr:`_optims` and :attr:`_lr_schedulers`.

        Load the model's ``state_dict`` too. A fresh wrapper applies them once
        its first backward has built the buckets; that step mixes nothing in,
        as after :meth:`global_avg`, so a checkpoint saved then resumes exactly.

        Args:
            optimizers: ``[opt.state_dict() for opt in model._optims]``.
            lr_schedulers: ``[s.state_dict() for s in model._lr_schedulers if s is not None]``.
            step: The number of optimizer steps taken when they were saved
                (:attr:`step_count`), which selects the topology's round.

        Raises:
            ValueError: ``step`` is not an integer ``>= 0``, or the states do
                not fit this wrapper's buckets.
        """
        load_bucket_states(self._engine, optimizers, lr_schedulers, step)
