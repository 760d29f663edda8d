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
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = ["ElasticOuter"]


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

    def state_dict(self) -> dict[str, Any] | None:
        """The outer copy and the outer optimizer's state (``None`` before the first quorum)."""
        if self.x is None or self.opt is None:
            return None
        return {"x": self.x, "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Load what :meth:`state_dict` returned (a joiner's heal)."""
        if state is None:
            return
        if self.x is None:
            self._build(state["x"])
        assert self.x is not None and self.opt is not None
        self.x.copy_(state["x"])
        self.opt.load_state_dict(state["opt"])
