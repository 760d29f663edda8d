"""Outer rounds (DiLoCo, SlowMo) over an elastic membership.

An outer round averages every member's model, which needs every member alive.
Elastic gossip knows that only right after a quorum, so outer rounds fall on
quorum steps: ``outer_every`` must be a multiple of ``quorum_every``, and step
``t`` is an outer round when ``t > 1`` and ``(t - 1) % outer_every == 0``.

At an outer round ``t``, with ``xbar`` the members' mean of ``x(t-1)``::

    x_outer <- outer_opt(x_outer, grad = x_outer - xbar)     x(t) = x_outer + d(t)

**A change of membership restarts the round in progress**: at every quorum
whose members changed (a new torchft ``quorum_id``), ``x_outer`` is set to the
new members' mean ``xbar``, so it is again the same on every member and the
steps since the last round of a member that left are neither lost to the others
nor counted twice. The outer optimizer's state (its momentum) is kept, and
at such a quorum every member takes rank 0's (:meth:`ElasticOuter.agree`): a
quorum's mean all-reduce that completed on some members and failed on others
lets only the former take that round's outer step, and their momentum would
otherwise stay apart from the others' for the rest of the run (where the
members' copies are equal, as a joiner heals its source's, this changes
nothing). If that quorum's step is also an outer round, the round is that
average, ``x(t) = xbar + d(t)``, with no outer step.

On :class:`~decent_dp.elastic.ElasticDataParallel` the round is placed in
the wrapper's buckets at the quorum (:meth:`ElasticOuter.place`): the gossip
in flight for step ``t`` is dropped and each bucket's buffer holds
``x_outer``, which the bucket's step inside the backward pass mixes in with
weight one, the local update ``d(t)`` (from the gradient at ``x(t-1)``) on top.
The wrapper's gossip recognises such a buffer by :attr:`ElasticOuter.edge`, as
it recognises the non-elastic outer rounds' (:mod:`decent_dp._engine.outer`).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from ..topo import Edge

__all__ = ["ElasticOuter"]


def _allreduce_sum(x: torch.Tensor) -> None:
    dist.all_reduce(x)


class ElasticOuter:
    """The outer copy and its optimizer, the same on every member.

    Args:
        fn: Builds the outer optimizer over ``[x_outer]``.
        every: ``H``, a multiple of ``quorum_every``.
        quorum_every: The quorum's interval.

    Raises:
        ValueError: ``every`` is not a positive multiple of ``quorum_every``.
    """

    def __init__(
        self, fn: Callable[[list[torch.Tensor]], Optimizer], every: Any, quorum_every: int
    ):
        if (
            isinstance(every, bool)
            or not isinstance(every, int)
            or every < 1
            or every % quorum_every
        ):
            raise ValueError(
                f"outer_every={every!r} is invalid; it must be a multiple of quorum_every="
                f"{quorum_every} (an outer round needs every member, known alive right after a quorum)"
            )
        self.fn = fn
        self.every = every
        self.x: torch.Tensor | None = None
        self.opt: Optimizer | None = None
        self.round_at = -1  # the step whose update is x_outer + d(t)
        self.edge = Edge(range(1), 1.0)  # the round's group: every process of the quorum

    def is_round(self, t: int) -> bool:
        """Whether step ``t`` (1-based) is an outer round."""
        return t > 1 and (t - 1) % self.every == 0

    def _build(self, like: torch.Tensor) -> None:
        self.x = like.detach().clone()
        self.opt = self.fn([self.x])

    @torch.no_grad()
    def at_quorum(self, t: int, mean: torch.Tensor, changed: bool) -> None:
        """After the quorum of step ``t``: restart the round on a change, or take the outer step."""
        if self.x is None:
            self._build(mean)
        assert self.x is not None and self.opt is not None
        self.round_at = t if self.is_round(t) else -1
        if changed:
            self.x.copy_(mean)
        elif self.is_round(t):
            self.x.grad = self.x - mean
            self.opt.step()
            self.x.grad = None

    @torch.no_grad()
    def agree(self, rank: int, allreduce_sum: Callable[[torch.Tensor], None]) -> None:
        """Every member takes rank 0's outer optimizer state (two all-reduces of the quorum).

        Rank 0's serialized state is summed with the others' zeros: its length,
        then its bytes. Call it on every member after :meth:`at_quorum`.
        """
        assert self.opt is not None
        size = torch.zeros(1, dtype=torch.int64)
        data = torch.zeros(0, dtype=torch.uint8)
        if rank == 0:
            buf = io.BytesIO()
            torch.save(self.opt.state_dict(), buf)
            data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            size[0] = data.numel()
        allreduce_sum(size)
        if rank != 0:
            data = torch.zeros(int(size[0]), dtype=torch.uint8)
        allreduce_sum(data)
        if rank != 0:
            state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)
            self.opt.load_state_dict(state)

    def on_wrapper(
        self, t: int, mean: torch.Tensor, changed: bool, rank: int, engine: Any, params: list
    ) -> None:
        """The quorum's work on :class:`~decent_dp.elastic.ElasticDataParallel`'s default group.

        :meth:`at_quorum`, then on a change :meth:`agree` (over the quorum's
        processes), then, if step ``t`` is an outer round, :meth:`place`.
        """
        world = dist.get_world_size()
        self.at_quorum(t, mean, changed)
        if changed and world > 1:
            self.agree(rank, _allreduce_sum)
        if self.round_at == t:
            self.place(engine, params, world)

    # what the wrapper's gossip asks of an outer optimizer (GossipState.outer): these rounds are
    # placed at a quorum (place), never launched from the backward pass
    def shift(self, bucket_index: int) -> int:
        """No fragments: every bucket's round falls on the same step."""
        return 0

    def due(self, for_step: int, bucket_index: int = 0) -> bool:
        """Never: the wrapper launches no outer round of its own (:meth:`place` puts them in)."""
        return False

    def step(self, bucket: Any) -> None:
        """Nothing to do: the bucket's buffer already holds the stepped ``x_outer``."""

    @torch.no_grad()
    def place(self, engine: Any, params: list[torch.Tensor], world_size: int) -> None:
        """Make step :attr:`round_at` an outer round of the wrapper's buckets.

        The gossip in flight for that step is drained and dropped and none is
        relaunched; each bucket's buffer then holds its part of ``x_outer``
        (``x_outer`` is flat over ``params``, in their order) with weight one,
        so the bucket's step makes ``x(t) = x_outer + d(t)``.

        Args:
            engine: The wrapper's engine (:class:`decent_dp._engine.engine.Engine`), buckets built.
            params: The trained parameters, in the order of ``x_outer``.
            world_size: The quorum's processes (the round's group).
        """
        assert self.x is not None and engine.buckets is not None
        engine.drain()
        engine.forget_gossip()
        engine.relaunch = False
        self.edge = Edge(range(world_size), 1.0 / world_size)
        where, offset = {}, 0
        for p in params:
            where[id(p)] = offset
            offset += p.numel()
        for bucket in engine.buckets:
            bucket.comm.zero_()  # the padding between parameters stays zero
            for p, o in zip(bucket.params, bucket.offsets):
                start, n = where[id(p)], p.numel()
                bucket.comm[o : o + n].copy_(self.x[start : start + n])
            bucket.pending = (self.edge, 1.0, 1.0)  # comm is the mixed value itself

    def state_dict(self) -> dict[str, Any] | None:
        """The outer copy and the outer optimizer's state (``None`` before the first quorum)."""
        if self.x is None or self.opt is None:
            return None
        return {"x": self.x, "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None, device: Any = None) -> None:
        """Load what :meth:`state_dict` returned (a joiner's heal, a checkpoint).

        Args:
            state: The state, or ``None`` (nothing to load).
            device: Where ``x_outer`` lives when it is built here (a heal's
                state is a host copy); the outer optimizer's state follows it.
        """
        if state is None:
            return
        if self.x is None:
            self._build(state["x"].to(device) if device is not None else state["x"])
        assert self.x is not None and self.opt is not None
        self.x.copy_(state["x"])
        self.opt.load_state_dict(state["opt"])
