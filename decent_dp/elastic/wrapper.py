"""The wrapper's own path, elastic: buckets stepped in the backward pass, gossip over a torchft quorum.

:class:`ElasticDataParallel` keeps a :class:`~decent_dp.ddp.DecentralizedDataParallel`
for the members of the current quorum and builds a new one when they change:

* **Between quorums** it *is* that wrapper: each bucket's optimizer step and
  LR scheduler run inside the backward pass and each bucket's gossip with its
  neighbours overlaps the next computation, on gloo groups of the quorum's
  processes. A member that dies meanwhile fails the exchanges of the groups it
  is in; its weight goes to the survivors of each edge: a pair's survivor mixes
  nothing, and the live members of a larger edge average among themselves on
  the edge's group less that member (made at the rebuild, :meth:`_regroup`)
  until the next quorum (``GossipState.on_lost``, :mod:`decent_dp._comm.survivors`).
  No survivor waits beyond ``timeout_s``.
* **At a quorum** (every ``quorum_every`` steps, in the forward pass that
  starts the step) whose members changed, or where any member lost a group,
  every member drains its gossip in flight and drops it, makes a new default
  process group over the quorum's processes (on the quorum's store; ranks
  ``member * L + local rank``), builds the topology for the new count and a
  new wrapper over the same module, and loads its own training state into it
  (optimizer and scheduler states, step, bucket layout). Its first gossip is
  then launched on the new topology: ``W(t)`` is built for the members of
  step ``t``. Members behind the quorum's highest step heal first from the
  neighbour the new topology names (model, buffers, optimizer and scheduler
  states, step and the caller's extra state, over torchft's ``HTTPTransport``).
* **Compressed gossip** keeps references per round that every member of the
  round's group holds identically. A failed exchange does not move them (they
  move only by a completed exchange's sum), so the survivors' copies stay
  identical; at a rebuild every member starts them afresh at zero, at the same
  step, since the rounds' groups are new.

The decision to rebuild is the same on every member: each publishes whether
it lost a group on the quorum's store, and all read all. The wrapper's options
are checked by its own checks in the constructor, before the lighthouse
(:func:`decent_dp._engine.setup.check_wrapper_options`), not when the first quorum
builds it.

About 600 lines as one unit: the class keeps one wrapper, group and
membership, and every part of it (the quorum's work, the rebuild, the state
carried over, the collectives between quorums) works on those together; what
does not (the checks and ids, outer rounds, the survivors of a lost member, the
torchft membership) lives in the modules it imports.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._comm.hierarchical import check_compression
from .._comm.survivors import find_lost, survivor_groups
from .._engine.setup import check_wrapper_options
from ..ddp import DecentralizedDataParallel
from ..topo import Edge, Topology
from ._outer import ElasticOuter
from ._quorum import Membership, QuorumView, default_advertise_host
from .common import (
    _positive,
    ask_quorum,
    change_record,
    check_elastic_topology,
    check_numbers,
    default_replica_id,
    elastic_topology,
    heal_sources,
    host_snapshot,
)

__all__ = ["ElasticDataParallel"]

# what the wrapper takes that cannot be rebuilt per quorum here
_REFUSED = {
    "device_mesh": "a sharded replica's shard ranks would have to leave together; "
    "not supported elastically",
    "outer_fragments": "outer rounds fall on quorum steps, whole (decent_dp.elastic._outer)",
    "outer_compression": "outer rounds fall on quorum steps, exact (decent_dp.elastic._outer)",
    "outer_scale_by_inner_lr": "not offered elastically (decent_dp.elastic._outer)",
    "local_world_size": "it is the replica group's process count (LOCAL_WORLD_SIZE)",
    "_local_world_size": "it is the replica group's process count (LOCAL_WORLD_SIZE)",
    "topology_kwargs": "pass topology_kwargs= to ElasticDataParallel itself",
    "_broadcast": "the first quorum starts every member from rank 0's model itself",
}
# the wrapper's arguments ElasticDataParallel gives itself
_OWN = {"self", "model", "optim_fn", "lr_scheduler_fn", "topology", "outer_optim_fn", "outer_every"}


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class ElasticDataParallel(nn.Module):
    """:class:`~decent_dp.ddp.DecentralizedDataParallel` over the live members of a torchft quorum.

    Each replica group (one host: one ``torchrun --nproc_per_node=L``, or one
    process) is a member; members leave and join without a restart. Use it as
    the wrapper: ``loss = loss_fn(edp(x), y); loss.backward()`` steps every
    bucket inside the backward pass. Do not initialise a process group: it
    makes one for each quorum.

    Args:
        model: The module (all trained parameters on one device).
        optim_fn: As the wrapper's: builds an optimizer from ``(name, parameter)`` pairs.
        lr_scheduler_fn: As the wrapper's, or ``None``.
        topology: A registered topology name, rebuilt for each membership
            (:func:`decent_dp.elastic.check_elastic_topology`).
        lighthouse: The torchft lighthouse, ``http://HOST:PORT``.
        replica_id: This replica group's id; by default unique per host.
        min_replicas: The fewest members a quorum may have.
        timeout_s: Seconds for the lighthouse, a quorum, a peer's exchange and
            a checkpoint transfer; a peer silent for longer counts as lost.
        quorum_every: ``k``: a quorum before every step ``t`` with ``(t - 1) % k == 0``.
        topology_kwargs: Extra keyword arguments of the topology.
        host: The address peers reach this host at (default: the interface
            towards the lighthouse).
        state_fn: Returns extra state a joiner heals with (e.g. the data position).
        load_state_fn: Loads that state on the joiner.
        consensus: Compute the consensus distance over the members at every quorum.
        outer_optim_fn: Builds an outer optimizer (DiLoCo, SlowMo) over ``[x_outer]``,
            flat over the trained parameters; its rounds fall on quorum steps, and a
            change of membership restarts the round in progress from the members'
            mean (:mod:`decent_dp.elastic._outer`).
        outer_every: ``H``, a multiple of ``quorum_every``; given exactly with ``outer_optim_fn``.
        log: Where progress lines go (stderr by default).
        group_rank: This process's rank in its replica group (default ``LOCAL_RANK`` or 0).
        group_world_size: The replica group's processes ``L`` (default
            ``LOCAL_WORLD_SIZE`` or 1).
        group_store: ``(host, port)`` of a store the group's processes share
            (default: torchrun's, ``MASTER_ADDR``/``MASTER_PORT``).
        **wrapper_kwargs: The wrapper's other options (``compression``,
            ``bucket_size_in_mb``, ``grad_clip_norm``, ``scaler``, ``state_sync``,
            ...); not a device mesh, nor streamed, compressed or scaled outer rounds.

    Raises:
        ValueError: A topology or option that cannot be elastic, a bad number or
            option value (all checked before the lighthouse), a process group already
            initialised, or (at a quorum) a replica id used twice.
        TypeError: An option the wrapper does not take, or a factory returning the wrong type.
        TimeoutError: The lighthouse is unreachable, or no quorum of
            ``min_replicas`` formed, within the timeout.
    """

    _inner: Any  # the current wrapper; set with object.__setattr__, so not a submodule

    def __init__(
        self,
        model: nn.Module,
        optim_fn: Any,
        lr_scheduler_fn: Any = None,
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
        outer_optim_fn: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
        outer_every: int | None = None,
        log: Callable[[str], None] | None = None,
        group_rank: int | None = None,
        group_world_size: int | None = None,
        group_store: tuple[str, int] | None = None,
        **wrapper_kwargs: Any,
    ) -> None:
        super().__init__()
        for key in wrapper_kwargs:
            if key in _REFUSED:
                raise ValueError(f"{key}= cannot be elastic here: {_REFUSED[key]}")
        check_numbers(min_replicas, quorum_every, timeout_s, replica_id)
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
        self.group_world_size = (
            _env_int("LOCAL_WORLD_SIZE", 1) if group_world_size is None else group_world_size
        )
        self.group_rank = _env_int("LOCAL_RANK", 0) if group_rank is None else group_rank
        _positive("group_world_size", self.group_world_size)
        if not 0 <= self.group_rank < self.group_world_size:
            raise ValueError(
                f"group_rank={self.group_rank!r} is invalid; it must be in "
                f"[0, group_world_size={self.group_world_size})"
            )
        self.topology_kwargs = dict(topology_kwargs or {})
        self.topology_name = check_elastic_topology(
            topology, self.topology_kwargs, self.group_world_size
        )
        if dist.is_initialized():
            raise ValueError(
                "a process group is initialised; ElasticDataParallel makes one for each quorum: "
                "do not call init_process_group"
            )
        # the wrapper is built at the first quorum, where a bad option would fail one member
        # after the others joined (they would wait timeout_s for it): every option fails here
        params = inspect.signature(DecentralizedDataParallel.__init__).parameters
        compression, sync = check_wrapper_options(
            model,
            optim_fn,
            lr_scheduler_fn,
            wrapper_kwargs,
            {n: p.default for n, p in params.items() if n not in _OWN and n not in _REFUSED},
        )
        if self.topology_name == "hierarchical":  # what its edges between hosts take
            if sync:
                raise ValueError(f"state_sync={sync} does not combine with topology=hierarchical")
            lws = self.group_world_size
            for n in range(1, 65):
                top = elastic_topology(self.topology_name, n * lws, self.topology_kwargs, lws)
                check_compression(top, compression)
        self.module = model
        self.optim_fn = optim_fn
        self.lr_scheduler_fn = lr_scheduler_fn
        self.wrapper_kwargs = wrapper_kwargs
        self.quorum_every = int(quorum_every)
        self.timeout = datetime.timedelta(seconds=float(timeout_s))
        self.state_fn = state_fn
        self.load_state_fn = load_state_fn
        self.consensus = bool(consensus)
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        host = host or default_advertise_host(lighthouse)
        self.replica_id = replica_id or default_replica_id(host=host)
        membership_kwargs: dict[str, Any] = {}
        if self.group_world_size > 1:
            membership_kwargs = {
                "group_rank": self.group_rank,
                "group_world_size": self.group_world_size,
                "group_store": group_store,
            }
        self.membership = Membership(
            lighthouse,
            self.replica_id,
            int(min_replicas),
            float(timeout_s),
            host,
            self.log,
            **membership_kwargs,
        )
        self.view: QuorumView | None = None
        self.topology: Topology | None = None
        self.lost: set[int] = set()  # flat ranks whose exchange failed since the latest quorum
        self.last_consensus_distance: float | None = None
        self.last_change: dict[str, Any] | None = None
        self.healed_from: str | None = None
        self.last_quorum_step = -1
        self.rebuilds = 0
        object.__setattr__(self, "_inner", None)  # not a submodule: the module is this one's
        self._survivor_groups: dict[tuple[int, ...], dict[int, Any]] = {}
        self._loaded: dict[str, Any] | None = None
        self._quorum_at = -1

    # ------------------------------------------------------------ properties
    @property
    def step_count(self) -> int:
        """Steps taken (the training state's step)."""
        if self._inner is not None:
            return int(self._inner.step_count)
        return int(self._loaded["training"]["step"]) if self._loaded else 0

    @property
    def rank(self) -> int:
        """This process's rank in the current quorum's process group."""
        assert self.view is not None, "no quorum yet: run a forward pass first"
        return self.view.rank * self.group_world_size + self.group_rank

    @property
    def world_size(self) -> int:
        """The processes of the current quorum."""
        return self.view.world_size * self.group_world_size if self.view is not None else 0

    @property
    def members(self) -> tuple[str, ...]:
        """The current quorum's replica ids, in member order."""
        return self.view.members if self.view is not None else ()

    def member_of(self, rank: int) -> str:
        """The replica id of a process rank of the current quorum."""
        return self.members[rank // self.group_world_size]

    @property
    def wrapper(self) -> Any:
        """The current :class:`~decent_dp.ddp.DecentralizedDataParallel` (new at each rebuild)."""
        return self._inner

    def mixed_edge(self, bucket: int = 0) -> Edge | None:
        """The edge a bucket mixed with at the latest step (``None``: it mixed nothing)."""
        buckets = self._inner._engine.buckets if self._inner is not None else None
        return buckets[bucket].mixed if buckets else None

    # --------------------------------------------------------------- forward
    def quorum(self) -> None:
        """Take part in the quorum if one is due before this step (the forward pass does otherwise).

        Call it before reading the step's batch where the data position is
        part of the healed state (``state_fn``): healing may move it.
        """
        step = self.step_count
        if self._inner is None or (step % self.quorum_every == 0 and self._quorum_at != step):
            self._quorum(step)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients without stepping, as the wrapper's ``no_sync()``."""
        self.quorum()  # this step's wrapper
        with self._inner.no_sync():
            yield

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Take part in the quorum if one is due, then run the wrapper's forward."""
        self.quorum()
        return self._inner(*args, **kwargs)

    def _quorum(self, step: int) -> None:
        """A quorum, asked again if its work fails (a member died after it formed)."""
        self._quorum_at = step
        start = time.monotonic()
        old = self.view

        def work(view: QuorumView) -> None:
            self._after_quorum(view, old, start)
            self._quorum_at = self.step_count  # healing may have moved the step

        def failed() -> None:
            self._world_failed = True

        ask_quorum(
            lambda: self.membership.quorum(self.step_count), work, self.log, self.replica_id, failed
        )

    _world_failed = False

    def _broken(self) -> bool:
        if self._world_failed or self._inner is None:
            return True
        return bool(self._inner._engine.gossip.broken)

    def _must_rebuild(self, view: QuorumView, old: QuorumView | None) -> bool:
        """Whether the process group is rebuilt: the same answer on every member."""
        mine = self._broken() or old is None or old.quorum_id != view.quorum_id
        store = self.membership.world_store("rebuild")
        store.set(str(view.rank * self.group_world_size + self.group_rank), "1" if mine else "0")
        world = view.world_size * self.group_world_size
        return any(bytes(store.get(str(r))) == b"1" for r in range(world))

    def _after_quorum(self, view: QuorumView, old: QuorumView | None, start: float) -> None:
        self.healed_from = None
        if self._must_rebuild(view, old):
            self._rebuild(view)
        self.view = view
        self.lost = set()
        self.last_quorum_step = self.step_count
        if self.consensus or self.outer is not None:
            mean = self._members_mean64()  # fails if a member died: the quorum is asked again
            if self.consensus:
                self.last_consensus_distance = self._consensus_distance(mean)
            if self.outer is not None:
                changed = old is None or old.quorum_id != view.quorum_id
                params = self._trained()
                self.outer.on_wrapper(
                    self.step_count + 1,
                    mean.to(params[0].dtype),
                    changed,
                    self.rank,
                    self._inner._engine,
                    params,
                )
        change = change_record(old, view, self.step_count, self.healed_from, start)
        if change is not None:
            self.last_change = change
            self.log(
                f"[decent_dp.elastic] {self.replica_id}: quorum {view.quorum_id} at step "
                f"{self.step_count}: {view.world_size} members {list(view.members)}, rank "
                f"{self.rank} of {self.world_size}, {self.topology.name if self.topology else ''} "
                "rebuilt" + (f", healed from {self.healed_from}" if self.healed_from else "")
            )

    # --------------------------------------------------------------- rebuild
    def _carry(self) -> dict[str, Any] | None:
        """This member's training state, its gossip in flight drained and dropped."""
        if self._inner is None:
            return self._loaded
        engine = self._inner._engine
        engine.drain()  # a failed exchange is absorbed here (on_lost)
        return {
            "model": None,  # the module itself holds it
            "training": engine.training_state(),
            "extra": self.state_fn() if self.state_fn is not None else None,
            "outer": self.outer.state_dict() if self.outer is not None else None,
        }

    def _rebuild(self, view: QuorumView) -> None:

        state = self._loaded = self._carry()  # kept until the new wrapper holds it
        if self._inner is not None:
            self._inner.close()
            object.__setattr__(self, "_inner", None)
        if dist.is_initialized():
            dist.destroy_process_group()
        self._world_failed = False
        n, lws = view.world_size, self.group_world_size
        world = n * lws
        self.topology = elastic_topology(self.topology_name, world, self.topology_kwargs, lws)
        top = max(view.steps)
        first = top == 0
        # healing: per member; each process of a joiner fetches from the same local rank
        behind = [r for r, s in enumerate(view.steps) if s < top]
        sources = {} if first else heal_sources(self.topology, view, behind, top, lws)
        self.healed_from = None
        carried = state
        fetched = self.membership.heal(
            sources,
            top,
            lambda: self._snapshot(carried),
            lambda src: view.address(src, self.group_rank),
        )
        if fetched is not None:
            state = fetched
            self.healed_from = view.members[sources[view.rank]]
            if self.outer is not None:
                self.outer.load_state_dict(fetched.get("outer"), self._device())
        elif first and view.rank * lws + self.group_rank != 0:
            self.healed_from = view.members[0]  # the wrapper broadcasts rank 0's model
        if state is not None and state.get("model") is not None:
            self.module.load_state_dict(state["model"])
        if state is not None and state.get("extra") is not None and self.load_state_fn:
            self.load_state_fn(state["extra"])
        if state is not None and self.healed_from is not None and not first:
            self._loaded = {"model": None, "training": state["training"], "extra": None}
        self.rebuilds += 1
        dist.init_process_group(
            "gloo",
            store=self._world_store(view),
            rank=view.rank * lws + self.group_rank,
            world_size=world,
            timeout=self.timeout,
        )
        inner = DecentralizedDataParallel(
            self.module,
            self.optim_fn,
            self.lr_scheduler_fn,
            topology=self.topology,
            _broadcast=first,  # every member at step 0: all start from rank 0's model
            **self.wrapper_kwargs,
        )
        inner._engine.gossip.on_lost = self._on_lost
        self._survivor_groups = self._regroup(self.topology, inner)
        inner._engine.gossip.regroup = self._find_lost
        inner._engine.gossip.outer = self.outer  # recognises the rounds placed at quorums
        if state is not None and state.get("training") is not None:
            training = dict(state["training"])
            training.pop("compression", None)  # the rounds' groups are new: start afresh
            inner._engine.load_training_state(training)
        object.__setattr__(self, "_inner", inner)
        self._loaded = None

    def _regroup(self, topology: Topology, inner: Any) -> dict[tuple[int, ...], dict[int, Any]]:
        """Each edge of more than two ranks, its groups less one member; exact gossip only."""
        gossip = inner._engine.gossip
        if gossip.compressor is not None or gossip.hosts is not None or gossip.state_sync:
            return {}
        return survivor_groups(topology, dist.get_world_size(), self.timeout)

    def _find_lost(self, edge: Edge, exchange: str) -> tuple[int, Any] | None:
        """The lost member of a failed exchange of an edge, agreed on the quorum's store, and
        the others' group."""
        ranks = tuple(sorted(edge.ranks))
        groups = self._survivor_groups.get(ranks)
        if not groups:
            return None
        try:
            store = self.membership.world_store(f"lost/{'-'.join(map(str, ranks))}/{exchange}")
        except (RuntimeError, OSError):
            return None
        gone = find_lost(store, ranks, self.rank, self.timeout.total_seconds())
        return None if gone is None else (gone, groups[gone])

    def _world_store(self, view: QuorumView) -> Any:
        """The store every process of the quorum builds the new process group on."""
        return self.membership.world_store("world")

    def _snapshot(self, state: dict[str, Any] | None) -> dict[str, Any]:
        # the transport serves CPU tensors by reference: stage copies, not the live ones
        out = dict(state or {"training": None, "extra": None})
        out["model"] = self.module.state_dict()
        return host_snapshot(out)

    def _on_lost(self, bucket: Any, edge: Edge, exc: BaseException) -> None:
        survivors = bucket.pending[0].ranks if bucket.pending is not None else (self.rank,)
        gone = [r for r in edge.ranks if r not in survivors and r not in self.lost]
        self.lost.update(r for r in edge.ranks if r not in survivors)
        if gone:
            names = sorted({self.member_of(r) for r in gone})
            where = (
                "stays here"
                if len(survivors) == 1
                else f"goes to {sorted({self.member_of(r) for r in survivors})}, who average"
            )
            self.log(
                f"[decent_dp.elastic] {self.replica_id}: step {self.step_count + 1}: the exchange "
                f"with {names} failed ({type(exc).__name__}); their weight {where} until "
                "the next quorum"
            )

    def _trained(self) -> list[torch.Tensor]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def _device(self) -> torch.device:
        return self._trained()[0].device

    def _flat(self) -> torch.Tensor:
        """A flat copy of the trained parameters, in the module's order."""
        return torch.cat([p.detach().reshape(-1) for p in self._trained()])

    def _members_mean64(self) -> torch.Tensor:
        """``xbar`` over the quorum's processes, flat, in float64 (one all-reduce)."""
        mean = self._flat().to(torch.float64)
        dist.all_reduce(mean)
        return mean.div_(dist.get_world_size())

    def _consensus_distance(self, mean: torch.Tensor) -> float:
        """``(1/n) sum_i ||x_i - xbar||^2`` over the quorum's processes (one more all-reduce)."""
        sq = ((self._flat().to(torch.float64) - mean) ** 2).sum().reshape(1)
        dist.all_reduce(sq)
        return float(sq) / dist.get_world_size()

    def members_mean(self) -> torch.Tensor:
        """The quorum's processes' mean of the trained parameters, flat (one all-reduce).

        Every process of the quorum must call it at the same step (e.g. at the
        end, to evaluate the average model).

        Raises:
            RuntimeError: A member is gone since the latest quorum (the next quorum
                then rebuilds the process group).
        """
        flat = self._flat()
        with self._between_quorums():
            dist.all_reduce(flat)
        return flat / dist.get_world_size()

    def consensus_distance(self, sketch: int | None = None) -> float | None:
        """``(1/n) sum_i ||x_i - xbar||^2`` over the quorum's processes, or ``None``.

        As the wrapper's :meth:`~decent_dp.ddp.DecentralizedDataParallel.consensus_distance`
        (exact, or a count sketch of ``sketch`` numbers), between two quorums; every
        process of the quorum calls it at the same step.

        Returns:
            The distance; ``None`` where a member is gone since the latest quorum (the
            collective fails within ``timeout_s`` and the next quorum rebuilds).
        """
        if self._inner is None:
            return self.last_consensus_distance
        try:
            with self._between_quorums():
                return float(self._inner.consensus_distance(sketch=sketch))
        except (RuntimeError, OSError) as exc:
            self.log(
                f"[decent_dp.elastic] {self.replica_id}: no consensus distance at step "
                f"{self.step_count} ({type(exc).__name__}); a member is gone"
            )
            return None

    @contextlib.contextmanager
    def _between_quorums(self) -> Iterator[None]:
        """A collective of the quorum's group between quorums: a failure marks it for rebuild.

        After one failed, the rest of the interval fails at once: every process of the
        quorum saw it fail (none completes without the lost member), so none waits
        ``timeout_s`` again on the next.
        """
        if self._world_failed:
            raise RuntimeError("a member is gone since the latest quorum: no collective")
        try:
            yield
        except (RuntimeError, OSError):
            self._world_failed = True
            raise

    # ----------------------------------------------------------------- state
    def elastic_state(self) -> dict[str, Any]:
        """The replica's training state: model, the wrapper's training state, extra state."""
        if self._inner is not None:
            training = self._inner._engine.training_state()
        else:
            training = self._loaded["training"] if self._loaded else {"step": 0}
        return {
            "model": self.module.state_dict(),
            "training": training,
            "extra": self.state_fn() if self.state_fn is not None else None,
            "outer": self.outer.state_dict() if self.outer is not None else None,
        }

    def load_elastic_state(self, state: dict[str, Any]) -> None:
        """Load :meth:`elastic_state` before the first forward (a restarted host's checkpoint).

        If the others are ahead, the first quorum heals this one from a neighbour instead.
        """
        if self._inner is not None:
            raise RuntimeError("load_elastic_state() after the first forward pass")
        self.module.load_state_dict(state["model"])
        if state.get("extra") is not None and self.load_state_fn is not None:
            self.load_state_fn(state["extra"])
        if self.outer is not None:
            self.outer.load_state_dict(state.get("outer"), self._device())
        self._loaded = {"model": None, "training": state["training"], "extra": None}

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Leave: finish the gossip in flight, close the wrapper and the group, stop heartbeating.

        The training state is kept: :attr:`step_count` and :meth:`elastic_state`
        return what they did before (less compressed gossip's references, which
        are model-sized and which a rebuild starts afresh anyway).
        """
        if self._inner is not None:
            training = self._inner._engine.training_state()
            training.pop("compression", None)
            self._loaded = {"model": None, "training": training, "extra": None}
            self._inner.close()
            object.__setattr__(self, "_inner", None)
        if dist.is_initialized():
            dist.destroy_process_group()
        self.membership.close()

    def __enter__(self) -> ElasticDataParallel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
