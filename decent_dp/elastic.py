"""Elastic gossip: replicas leave and join a running job, on torchft's lighthouse.

Each replica (one process per host) trains its own model and, after every
optimizer step, averages with the neighbours the topology names for that step::

    x_i(t) = x_i(t-1) + d_i(t) + sum_{j in E_i(t), j alive} W_ij(t) (x_j(t-1) - x_i(t-1))

``d_i(t)`` is the local optimizer's update from the gradient at ``x_i(t-1)``
and ``W(t)`` is the mixing matrix of the topology's round ``(t-1) mod period``
built over the members of step ``t``.

Membership comes from torchft (:mod:`decent_dp._elastic_quorum`): every
``quorum_every`` steps each replica asks the lighthouse for a quorum. A quorum
every step would be a rendezvous of all members every step, the global barrier
gossip exists to avoid; between quorums the membership is fixed and only
neighbours wait for each other. At a quorum whose members changed, the topology
is rebuilt for the new number of members (ranks are the members' order in
torchft's quorum, replica ids sorted as strings) and the gossip continues
without a restart.

* **A member lost between quorums** (killed, or silent for ``timeout_s``): its
  neighbours find out at their next exchange with it, and until the next
  quorum each gives the lost peer's weight to itself (``W_ii += W_ij``). Among
  the survivors ``W`` stays symmetric and doubly stochastic, and no survivor
  skips a step or waits beyond ``timeout_s``.
* **A member that joins** (new, or restarted after a kill) asks for a quorum
  at once; it enters at the next quorum boundary of the others. Every member
  behind the quorum's highest step heals from a live neighbour: its edge in
  the round it will gossip in next names the source (the lowest-ranked member
  of that edge at the highest step; any such member if the edge has none).
  The source stages a copy of its model, optimizer and scheduler states, step
  and the caller's extra state (the data position) on torchft's
  ``HTTPTransport``, withdrawn once its joiners have it; the joiner fetches
  and loads it, and continues from it, not from its own stale checkpoint. At the first quorum (every member at step
  0) every member takes rank 0's state, as the non-elastic wrapper broadcasts
  rank 0's model.
* **A topology for any number of members**: every registered topology takes
  any world size but ``one-peer-exp``, which needs a power of two; for other
  counts it runs as ``base-k`` with ``k=1`` (one peer per round too, an exact
  average after each period) until the membership is a power of two again.
* **What cannot be elastic** is refused in one line: a :class:`Topology`
  instance (it is built for one world size), ``hierarchical`` (a replica is one
  process here), and parameters of several dtypes.

* **An outer optimizer** (``outer_optim_fn``, ``outer_every``: DiLoCo,
  SlowMo) takes its rounds at quorum steps, when every member is known alive;
  a change of membership restarts the round in progress from the new members'
  mean (:mod:`decent_dp._elastic_outer`).

Compressed gossip is not part of this path: the references a group shares
would have to be rebuilt at every change; :class:`ElasticGossip` has no such
option, and the framework refuses ``fault_tolerance=torchft`` with it.

Example::

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ElasticGossip(model, opt, topology="ring", lighthouse="http://10.0.0.1:29510",
                       min_replicas=3, quorum_every=8) as gossip:
        for x, y in loader:
            gossip.zero_grad()  # the quorum, every quorum_every steps
            loss_fn(model(x), y).backward()
            gossip.step()       # optimizer step, then the gossip of this step
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from ._elastic_common import (
    ask_quorum,
    change_record,
    check_elastic_topology,
    check_numbers,
    default_replica_id,
    elastic_topology,
    heal_sources,
    host_snapshot,
)
from ._elastic_outer import ElasticOuter
from ._elastic_quorum import Membership, QuorumView, default_advertise_host
from ._elastic_wrapper import ElasticDataParallel
from .topo import Edge, Topology

__all__ = [
    "ElasticDataParallel",
    "ElasticGossip",
    "check_elastic_topology",
    "default_replica_id",
    "elastic_topology",
    "heal_sources",
]


def _host(like: torch.Tensor) -> torch.Tensor:
    """An empty host tensor like ``like`` (pinned for a CUDA one: torch caches those blocks)."""
    if like.device.type == "cpu":
        return torch.empty_like(like)
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)


class ElasticGossip:
    """Gossip over the live members of a torchft quorum; members leave and join without a restart.

    Call :meth:`zero_grad` before each forward pass (every ``quorum_every``
    steps it takes part in a quorum and, if the members changed, rebuilds the
    topology and heals the joiners) and :meth:`step` after each backward pass
    (it steps the optimizer and the scheduler, and gossips). A restarted host
    loads its checkpoint with :meth:`load_state_dict` before its first
    :meth:`zero_grad`; if it is behind the others, it heals from a neighbour.

    Args:
        model: The replica's model (all trained parameters of one dtype).
        optimizer: Its optimizer; steps from the gradient at ``x(t-1)``.
        lr_scheduler: Stepped once per step, or ``None``.
        topology: A registered topology name, rebuilt for each membership.
        lighthouse: The torchft lighthouse, ``http://HOST:PORT``.
        replica_id: This replica's id; :func:`default_replica_id` by default.
        min_replicas: The fewest members a quorum may have.
        timeout_s: Seconds for the lighthouse, a quorum, a peer's exchange and a
            checkpoint transfer; a peer silent for longer counts as lost.
        quorum_every: ``k``: a quorum at every step ``t`` with ``(t - 1) % k == 0``.
        topology_kwargs: Extra keyword arguments of the topology.
        host: The address peers reach this replica at (default: the interface
            towards the lighthouse).
        state_fn: Returns extra state a joiner heals with (e.g. the data position).
        load_state_fn: Loads that state on the joiner.
        consensus: Compute the consensus distance over the members at every quorum.
        outer_optim_fn: Builds an outer optimizer (DiLoCo, SlowMo) over ``[x_outer]``;
            its rounds fall on quorum steps, and a change of membership restarts
            the round in progress from the members' mean (:mod:`decent_dp._elastic_outer`).
        outer_every: ``H``, a multiple of ``quorum_every``; given exactly with ``outer_optim_fn``.
        log: Where progress lines go (stderr by default).

    Raises:
        ValueError: A topology that cannot be elastic, a bad number, parameters
            of several dtypes, or (at a quorum) a replica id used twice.
        TimeoutError: The lighthouse is unreachable, or no quorum of
            ``min_replicas`` formed, within ``timeout_s``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        lr_scheduler: Any = None,
        topology: str = "ring",
        *,
        lighthouse: str,
        replica_id: str | None = None,
        min_replicas: int = 1,
        timeout_s: float = 60.0,
        quorum_every: int = 8,
        topology_kwargs: dict[str, Any] | None = None,
        host: str | None = None,
        state_fn: Callable[[], Any] | None = None,
        load_state_fn: Callable[[Any], None] | None = None,
        consensus: bool = True,
        outer_optim_fn: Callable[[list[torch.Tensor]], Optimizer] | None = None,
        outer_every: int | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.topology_kwargs = dict(topology_kwargs or {})
        self.topology_name = check_elastic_topology(topology, self.topology_kwargs)
        check_numbers(min_replicas, quorum_every, timeout_s, replica_id)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model has no trained parameter; there is nothing to gossip")
        dtypes = sorted({str(p.dtype) for p in self.params})
        if len(dtypes) > 1:
            raise ValueError(f"parameters of dtypes {dtypes} cannot be gossiped as one block")
        if (outer_optim_fn is None) != (outer_every is None):
            raise ValueError(
                f"outer_optim_fn and outer_every come together; got outer_every={outer_every!r} "
                f"and {'no' if outer_optim_fn is None else 'an'} outer_optim_fn"
            )
        self.outer = (
            ElasticOuter(outer_optim_fn, outer_every, int(quorum_every))
            if outer_optim_fn is not None
            else None
        )
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.quorum_every = int(quorum_every)
        self.state_fn = state_fn
        self.load_state_fn = load_state_fn
        self.consensus = bool(consensus)
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        host = host or default_advertise_host(lighthouse)
        self.replica_id = replica_id or default_replica_id(host=host)
        self.membership = Membership(
            lighthouse, self.replica_id, int(min_replicas), float(timeout_s), host, self.log
        )
        self.step_count = 0
        self.view: QuorumView | None = None
        self.topology: Topology | None = None
        self.lost: set[int] = set()  # ranks found lost since the latest quorum
        self.last_consensus_distance: float | None = None
        self.last_change: dict[str, Any] | None = None
        self.healed_from: str | None = None  # the member the latest quorum healed this one from
        self.last_quorum_step = -1  # the step count right after the latest quorum (and healing)
        self._started = -1  # the step count at this iteration's zero_grad()

    # ------------------------------------------------------------------ step
    @property
    def rank(self) -> int:
        """This replica's rank in the current quorum."""
        assert self.view is not None, "no quorum yet: call step() first"
        return self.view.rank

    @property
    def members(self) -> tuple[str, ...]:
        """The current quorum's replica ids, in rank order."""
        return self.view.members if self.view is not None else ()

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def _write(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            p.detach().copy_(flat[offset : offset + n].view_as(p))
            offset += n

    def edge(self, t: int) -> Edge:
        """This replica's edge at step ``t`` (1-based) in the current topology."""
        assert self.topology is not None
        return self.topology.get_edge((t - 1) % self.topology.period, self.rank)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start an iteration: take part in the quorum if one is due, then zero the gradients.

        Call it before the forward pass of every iteration, in place of the
        optimizer's ``zero_grad`` (as torchft's ``OptimizerWrapper`` starts its
        quorum there): a quorum may heal this replica, replacing its
        parameters, and the gradient must be taken at those.
        """
        if self.view is None or self.step_count % self.quorum_every == 0:
            self._quorum()
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self._started = self.step_count

    @torch.no_grad()
    def step(self) -> None:
        """Step the optimizer (and scheduler) from the current gradients, then gossip.

        Raises:
            RuntimeError: :meth:`zero_grad` did not start this iteration.
        """
        if self._started != self.step_count:
            raise RuntimeError(
                "ElasticGossip.step() without zero_grad() in this iteration: call "
                "gossip.zero_grad() before each forward pass (it takes part in the quorum)"
            )
        self._started = -1
        t = self.step_count + 1
        if self.outer is not None and self.outer.round_at == t:
            self._outer_step(t)
            return
        edge = self.edge(t)
        peers = [r for r in sorted(edge.ranks) if r != self.rank and r not in self.lost]
        x_prev = self._flat().clone()
        # gloo's send and recv read and write host memory only (it stages CUDA tensors for its
        # collectives, not for these): a CUDA replica exchanges pinned host copies
        wire = x_prev if x_prev.device.type == "cpu" else _host(x_prev).copy_(x_prev)
        bufs = [_host(x_prev) for _ in peers]
        pending = self.membership.start_exchange(wire, peers, bufs)
        # the local update overlaps the exchange; d(t) comes from x(t-1)'s gradient
        self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        arrived = self.membership.finish_exchange(pending)
        x = self._flat()
        w = edge.peer_weight
        for peer, buf, ok in zip(peers, bufs, arrived):
            if ok:
                x += w * (buf.to(x.device) - x_prev)
            else:  # lost until the next quorum: its weight stays with this replica
                self.lost.add(peer)
                self.log(
                    f"[decent_dp.elastic] {self.replica_id}: step {t}: lost "
                    f"{self.view.members[peer] if self.view else peer}; its weight stays here "
                    "until the next quorum"
                )
        self._write(x)
        self.step_count = t

    def _outer_step(self, t: int) -> None:
        """An outer round: ``x(t) = x_outer + d(t)``, no gossip (the quorum averaged)."""
        assert self.outer is not None and self.outer.x is not None
        x_prev = self._flat().clone()
        self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self._write(self.outer.x + (self._flat() - x_prev))
        self.step_count = t

    # ---------------------------------------------------------------- quorum
    def _quorum(self) -> None:
        """Take part in a quorum; ask again if a member dies before its work (healing, mean) is done."""
        start = time.monotonic()
        old = self.view
        ask_quorum(
            lambda: self.membership.quorum(self.step_count),
            lambda view: self._after_quorum(view, old, start),
            self.log,
            self.replica_id,
        )

    def _after_quorum(self, view: QuorumView, old: QuorumView | None, start: float) -> None:
        """The quorum's work: rebuild the topology, heal the joiners, the members' mean."""
        self.view = view
        self.lost = set()
        n = view.world_size
        # W(t) is a function of the number of members alone (ranks follow torchft's order)
        if self.topology is None or self.topology.world_size != n:
            self.topology = elastic_topology(self.topology_name, n, self.topology_kwargs)
        top = max(view.steps)
        behind = [r for r, s in enumerate(view.steps) if s < top]
        if top == 0:  # the first quorum: everyone starts from rank 0's state
            behind = list(range(1, n))
        sources = {j: self._source(j, behind, top) for j in behind}
        self.healed_from = None
        state = self.membership.heal(sources, top, self._snapshot, lambda r: view.addresses[r])
        if state is not None:
            self.load_state_dict(state)
            self.healed_from = view.members[sources[view.rank]]
        self.last_quorum_step = self.step_count
        # a new quorum id: torchft saw a change of membership (a restarted host has a new uuid)
        changed = old is None or old.quorum_id != view.quorum_id
        if self.consensus or self.outer is not None:
            mean = self._member_mean(n)  # fails if a member died: the caller asks again
            if self.consensus:
                self.last_consensus_distance = self._consensus_distance(n, mean)
            if self.outer is not None:
                self.outer.at_quorum(self.step_count + 1, mean, changed)
                if changed and n > 1:  # one outer momentum again, whoever took which round
                    self.outer.agree(view.rank, self.membership.allreduce_sum)
        change = change_record(old, view, self.step_count, self.healed_from, start)
        if change is not None:
            self.last_change = change
            self.log(
                f"[decent_dp.elastic] {self.replica_id}: quorum {view.quorum_id} at step "
                f"{self.step_count}: {n} members {list(view.members)}, rank {view.rank}, "
                f"{self.topology.name if self.topology else self.topology_name} rebuilt"
                + (f", healed from {self.healed_from}" if self.healed_from else "")
            )

    def _source(self, joiner: int, behind: list[int], top: int) -> int:
        """The live neighbour a joiner heals from: same on every member."""
        assert self.topology is not None and self.view is not None
        if top == 0:
            return 0
        return heal_sources(self.topology, self.view, [joiner], top, 1, behind)[joiner]

    def _member_mean(self, n: int) -> torch.Tensor:
        """``xbar``, the members' mean of ``x`` (one all-reduce of the quorum)."""
        mean = self._flat().clone()
        if n > 1:
            self.membership.allreduce_sum(mean)
            mean /= n
        return mean

    def members_mean(self) -> torch.Tensor:
        """The members' mean of the parameters, flat (one all-reduce of the quorum).

        Every member must call it at the same step (e.g. at the end, to evaluate
        the average model).

        Raises:
            RuntimeError: A member is gone since the latest quorum.
        """
        return self._member_mean(len(self.members))

    def _consensus_distance(self, n: int, mean: torch.Tensor) -> float:
        """``(1/n) sum_i ||x_i - xbar||^2`` over the members (one more all-reduce)."""
        x = self._flat().to(torch.float64)
        sq = ((x - mean.to(torch.float64)) ** 2).sum().reshape(1)
        if n > 1:
            self.membership.allreduce_sum(sq)
        return float(sq) / n

    # ----------------------------------------------------------------- state
    def _snapshot(self) -> dict[str, Any]:
        # the transport serves CPU tensors by reference: stage copies, not the live ones
        return host_snapshot(self.state_dict())

    def state_dict(self) -> dict[str, Any]:
        """The replica's training state: model, optimizer, scheduler, step and extra state."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None,
            "step": self.step_count,
            "extra": self.state_fn() if self.state_fn is not None else None,
            "outer": self.outer.state_dict() if self.outer is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned (in place: the parameters keep their storage)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.step_count = int(state["step"])
        if self.outer is not None:
            self.outer.load_state_dict(state.get("outer"))
        if self.load_state_fn is not None and state.get("extra") is not None:
            self.load_state_fn(state["extra"])

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Leave the quorum (heartbeats stop; the others re-form at their next quorum)."""
        self.membership.close()

    def __enter__(self) -> ElasticGossip:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
