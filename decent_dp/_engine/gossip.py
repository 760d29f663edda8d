"""One bucket's update ``x(t) = x(t-1) + a (W x(t-1) - x(t-1)) + d(t)`` and its gossip.

:class:`GossipState` is what these functions need besides the bucket: this
rank's edge and process group for every round, the mixing step size, the
network-emulation delay and the timers. The functions decide *how* one bucket
steps; :mod:`decent_dp._engine.engine` decides *when*.
"""

from __future__ import annotations

import inspect
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .._comm.compressed import GossipCompressor
from .._comm.hierarchical import HostExchange
from .._comm.survivors import exchange_again, survivors_for
from ..optim._kernels import drop_fused
from ..optim._plan import DecayFold, decay_plan
from ..topo import Edge
from .bucket import Bucket
from .state_sync import BothWork, StateSync
from .timers import SpanTimers

__all__ = ["GossipState", "arrived", "delivered", "launch", "step_bucket", "wait"]


@dataclass
class GossipState:
    """This rank's side of the topology, and the knobs every bucket step reads.

    Attributes:
        edges: This rank's edge in each round of the topology's period.
        groups: The process group of each of those edges (``None`` alone).
        alone: The edge of a step without gossip (this rank, weight 1).
        stable_storage: Step in place, never swapping the parameter block.
        stream: The CUDA side stream of the bucket work, or ``None``.
        timers: Where waiting, mixing and optimizer time is summed.
        alpha: The mixing step size ``a``.
        comm_delay: The network-emulation delay, ``fn(nbytes, group_size)``
            (or ``fn(nbytes, group_size, ranks=...)``, see :meth:`set_comm_delay`)
            seconds after launch, or ``None``.
        compressor: Compressed gossip (:mod:`decent_dp._comm.compressed`), or
            ``None`` for the exact all-reduce.
        outer: The outer optimizer, whose rounds replace the topology's every
            ``H`` steps (per fragment, shifted), or ``None``.
        hosts: The three-phase exchange of a ``hierarchical`` topology's edges
            of several hosts (:mod:`decent_dp._comm.hierarchical`), or ``None``.
        state_sync: Optimizer state gossiped with the parameters
            (:mod:`decent_dp._engine.state_sync`), or ``None``.
        on_lost: Elastic gossip (:mod:`decent_dp.elastic`): an exchange that
            fails (a member of its group died) is called here with the bucket,
            the edge and the error, instead of raising, and the group is not used
            again (``broken``) until it is rebuilt. An edge of two ranks then mixes
            nothing (the survivor keeps its peer's weight); an edge of more that
            ``regroup`` knows keeps its live members: the lost member's weight goes
            to them and they average among themselves (``rerouted``, until the
            rebuild). Otherwise the step mixes nothing.
        regroup: For an edge of more than two ranks and the exchange that failed on it
            (``"<bucket>/<step>"``), the member lost and the group of the others,
            ``(lost rank, group)``, the same on every survivor; ``None`` where it cannot
            tell (then the step mixes nothing).
    """

    edges: list[Edge]
    groups: list[Any]
    alone: Edge
    stable_storage: bool
    stream: Any
    timers: SpanTimers
    alpha: float = 1.0
    comm_delay: Callable[..., float] | None = None
    delay_takes_ranks: bool = False
    compressor: GossipCompressor | None = None
    outer: Any = None  # an OuterOptimizer (decent_dp._engine.outer), or None
    hosts: HostExchange | None = None
    state_sync: StateSync | None = None
    on_lost: Callable[[Bucket, Edge, BaseException], None] | None = None
    broken: set[Any] = field(default_factory=set)  # groups (their id()) whose exchange failed
    regroup: Callable[[Edge, str], tuple[int, Any] | None] | None = None
    # a broken group's key -> its edge's live members and their group
    rerouted: dict[Any, tuple[Edge, Any]] = field(default_factory=dict)
    retried: set[Any] = field(default_factory=set)  # broken groups whose survivors met late
    period: int = field(init=False)  # of the topology: len(edges)
    # CUDA with an emulated delay: the latest launch of each bucket, which the start clock stamps
    launches: dict[int, object] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.period = len(self.edges)

    def set_comm_delay(self, fn: Callable[..., float] | None) -> None:
        """Install the delay; one with a parameter named ``ranks`` also gets the group's ranks."""
        self.comm_delay = fn
        self.delay_takes_ranks = fn is not None and _takes_ranks(fn)


def _takes_ranks(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the two-argument form
        return False
    p = params.get("ranks")
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


class _StartClock:
    """A host thread that stamps when the GPU reached each emulated gossip's launch.

    On CUDA the host queues a launch long before the device runs it; an
    emulated transfer starts when the device gets there, so its delay is
    counted from the moment the launch's event completes.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Any, Callable[[float], None]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def stamp(self, event: Any, on_start: Callable[[float], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="decent-dp-netem-clock", daemon=True
                )
                self._thread.start()
        self._queue.put((event, on_start))

    def _run(self) -> None:
        while True:
            event, on_start = self._queue.get()
            try:
                event.synchronize()  # releases the GIL while the device gets there
            finally:
                on_start(time.perf_counter())


_CLOCK = _StartClock()


def _started(state: GossipState, bucket: Bucket, token: object) -> Callable[[float], None]:
    def on_start(t: float) -> None:
        if state.launches.get(bucket.index) is token:  # not a stale stamp of an earlier launch
            bucket.launch_t = t

    return on_start


def delivered(state: GossipState, bucket: Bucket) -> bool:
    """Whether the emulated network has delivered the bucket's gossip (True without emulation)."""
    return bucket.work is None or state.comm_delay is None or bucket.delay_left() <= 0


def arrived(state: GossipState, bucket: Bucket) -> bool:
    """Whether the bucket's gossip has completed (and the emulated network delivered it)."""
    if not delivered(state, bucket):
        return False
    return bucket.work is None or bool(bucket.work.is_completed())


@torch.no_grad()
def wait(state: GossipState, bucket: Bucket) -> None:
    """Block until the bucket's gossip has arrived; its result stays pending."""
    if bucket.work is None:
        return
    t0 = state.timers.mark()
    try:
        bucket.work.wait()
    except Exception as exc:
        if state.on_lost is None:
            raise
        bucket.work = None
        _lost(state, bucket, exc)
        state.timers.add("comm/wait_s", t0, state.timers.mark())
        return
    if state.stream is not None:
        # work.wait() ordered only the current stream after the collective; the next mix
        # runs on the side stream, which must not read the buffer before it is written
        current = torch.cuda.current_stream(state.stream.device)
        if current != state.stream:
            state.stream.wait_stream(current)
    if state.comm_delay is not None:
        while bucket.launch_t == math.inf:  # the device has not reached the launch yet
            time.sleep(1e-4)
        remaining = bucket.delay_left()
        if remaining > 0:
            time.sleep(remaining)
    bucket.work = None
    state.timers.add("comm/wait_s", t0, state.timers.mark())


def _key(group: Any) -> Any:
    return group if isinstance(group, tuple) else id(group)


def _lost(state: GossipState, bucket: Bucket, exc: BaseException) -> None:
    """An exchange failed: its step mixes nothing, its group is not used again.

    Every live member of the group fails alike (no collective completes without
    the dead member's part), so each keeps its peers' weight: ``W`` stays
    symmetric and doubly stochastic over the survivors. A compressed exchange's
    references do not move (they move only by a completed exchange's sum), so
    the survivors' copies stay identical.
    """
    assert state.on_lost is not None
    key = _key(bucket.group)
    state.broken.add(key)
    edge = bucket.pending[0] if bucket.pending is not None else state.alone
    bucket.pending = None
    bucket.state_pending = None
    if state.compressor is not None:
        state.compressor.forget(bucket.index)
    rerouted = state.rerouted.get(key) or survivors_for(state, edge, bucket)
    if rerouted is not None:
        if exchange_again(bucket, *rerouted):
            state.rerouted[key] = rerouted
        else:  # another member is gone too: this step mixes nothing
            state.broken.add(_key(rerouted[1]))
    state.on_lost(bucket, edge, exc)


@torch.no_grad()
def launch(state: GossipState, bucket: Bucket, for_step: int) -> None:
    """Start the gossip whose result step ``for_step`` (1-based) mixes in."""
    if state.on_lost is None:
        _launch(state, bucket, for_step)
        return
    try:
        _launch(state, bucket, for_step)
    except Exception as exc:  # a pair a dead member already closed
        bucket.work = None
        _lost(state, bucket, exc)


def _launch(state: GossipState, bucket: Bucket, for_step: int) -> None:
    bucket.gossip_step = for_step
    outer = state.outer
    # a fragment of the outer optimizer reads the topology's rounds shifted as its outer rounds
    shift = outer.shift(bucket.index) if outer is not None else 0
    round_index = (for_step - shift - 1) % state.period
    edge = state.edges[round_index]
    group = state.groups[round_index]
    outer_round = outer is not None and outer.due(for_step, bucket.index)
    if outer_round:  # the world's average (of Delta, if compressed), whatever the topology's round
        edge, group = outer.edge, outer.group
    k = len(edge.ranks)
    bucket.state_pending = None
    # an edge of several hosts has no group of its own (decent_dp._comm.hierarchical): its round
    bucket.group = group if group is not None else ("hosts", round_index)
    if state.on_lost is not None and _key(bucket.group) in state.broken:  # lost until rebuilt
        key = _key(bucket.group)
        if key not in state.rerouted and key not in state.retried and not outer_round:
            # the survivors did not meet at the failed exchange (one of them had it go
            # through): once more, at this one, where that one fails too
            state.retried.add(key)
            found = survivors_for(state, edge, bucket)
            if found is not None:
                state.rerouted[key] = found
        rerouted = state.rerouted.get(key)
        if rerouted is None or outer_round:
            bucket.pending = None
            return
        edge, group = rerouted  # the edge's live members, on their own group
        bucket.group, k = group, len(edge.ranks)
    # a round alone costs nothing: no copy, no collective; nor does an empty bucket (a shard
    # rank's part of small parameters, empty on every rank of its group: decent_dp.sharded._wrapper)
    if (k == 1 and not outer_round) or bucket.numel == 0:
        bucket.pending = None
        return
    sync = state.state_sync
    states = sync.due(for_step) if sync is not None and not outer_round else []
    extra = len(states) * bucket.numel * bucket.comm.element_size()
    t0 = state.timers.mark()
    peer_w = edge.peer_weight if k > 1 else 1.0  # alone, an outer round copies x(t-1) as it is
    if outer_round and outer.compressed:  # what is sent is Delta, compressed
        bucket.pending = (edge, edge.self_weight, peer_w)
        bucket.work = outer.launch(
            bucket,
            stream=state.stream,
            on_encoded=lambda: _start_clock(state, bucket, outer.nbytes(bucket), edge.ranks),
        )
        state.timers.add("comm/mix_s", t0, state.timers.mark())
        return
    if state.compressor is not None and not outer_round:  # the gossip's compressor skips them
        bucket.pending = (edge, edge.self_weight, peer_w)
        comp = state.compressor
        hosts = state.hosts
        if hosts is not None and hosts.inter[round_index] is not None:  # phase 2 compressed
            _start_clock(state, bucket, hosts.nbytes(bucket, comp.spec), edge.ranks, hosts)
            bucket.work, fl = hosts.launch_compressed(
                bucket, round_index, comp.host_refs, comp.spec.name, peer_w, state.stream
            )
            comp.inflight[bucket.index] = fl  # type: ignore[assignment]
            state.timers.add("comm/mix_s", t0, state.timers.mark())
            return
        # the emulated transfer starts once the payload is encoded, as a real one would
        bucket.work = comp.launch(
            bucket,
            round_index,
            k,
            group,
            for_step,
            stream=state.stream,
            on_encoded=lambda: _start_clock(
                state, bucket, comp.nbytes(bucket, k) + extra, edge.ranks
            ),
        )
        _launch_states(bucket, states, peer_w, group, sync)
        state.timers.add("comm/mix_s", t0, state.timers.mark())
        return
    for c, v in zip(bucket.comm_views, bucket.values()):
        torch.mul(v, peer_w, out=c)  # copy and weight in one pass
    bucket.pending = (edge, edge.self_weight, peer_w)
    hosts = state.hosts
    if hosts is not None and not outer_round and hosts.inter[round_index] is not None:
        # an edge of several hosts: one model per host link (the emulated link times a chunk)
        _start_clock(state, bucket, hosts.nbytes(bucket), edge.ranks, hosts)
        bucket.work = hosts.launch(bucket, round_index, state.stream)
        state.timers.add("comm/mix_s", t0, state.timers.mark())
        return
    _start_clock(state, bucket, bucket.numel * bucket.comm.element_size() + extra, edge.ranks)
    if k > 1:  # alone, an outer round's average is the copy itself
        bucket.work = dist.all_reduce(bucket.comm, group=group, async_op=True)
        _launch_states(bucket, states, peer_w, group, sync)
    state.timers.add("comm/mix_s", t0, state.timers.mark())


def _launch_states(
    bucket: Bucket, names: list[str], peer_w: float, group: Any, sync: StateSync | None
) -> None:
    """Send the named optimizer states beside the parameters, on the same group, at the same time."""
    if not names or sync is None:
        return
    work, bucket.state_pending = sync.launch(bucket, names, peer_w, group)
    bucket.work = BothWork(bucket.work, work)


def _start_clock(
    state: GossipState,
    bucket: Bucket,
    nbytes: int,
    ranks: Sequence[int],
    hosts: HostExchange | None = None,
) -> None:
    """Note the launch time and, under network emulation, the delay of ``nbytes`` over ``ranks``.

    With ``hosts`` (a three-phase edge), the bytes cross the hosts in this rank's
    phase-2 group, whose ranks the delay gets.

    On CUDA the transfer can start only when the device reaches the launch, so
    the clock starts when a host thread sees the event recorded here complete.
    """
    bucket.launch_t = time.perf_counter()
    if state.comm_delay is None:
        return
    group = hosts.across(ranks) if hosts is not None else sorted(ranks)
    if state.delay_takes_ranks:
        bucket.delay_s = float(state.comm_delay(nbytes, len(group), ranks=group))
    else:
        bucket.delay_s = float(state.comm_delay(nbytes, len(group)))
    if state.stream is not None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(state.stream.device))
        token = object()
        state.launches[bucket.index] = token
        bucket.launch_t = math.inf  # until the start clock sees the device get here
        _CLOCK.stamp(event, _started(state, bucket, token))


@torch.no_grad()
def step_bucket(state: GossipState, bucket: Bucket, skip_update: bool) -> None:
    """x(t) = x(t-1) + a (W x(t-1) - x(t-1)) + d(t) for one bucket: wait, mix, step, apply.

    Two ways give the same x(t). Where ``d`` reads the parameters at most
    through weight decay of a known form, the mix is completed in the
    gossip buffer, which then becomes the parameter block, and the
    optimizer steps there with the decay applied at x(t-1) by hand: no
    pass over the bucket besides the launch copy. Otherwise the optimizer
    steps at x(t-1) and the correction W x(t-1) - x(t-1) is added after.
    """
    timers = state.timers
    wait(state, bucket)
    t0 = timers.mark()
    pending = bucket.pending
    bucket.mixed = pending[0] if pending is not None else None
    outer_round = pending is not None and state.outer is not None and pending[0] is state.outer.edge
    if outer_round:
        state.outer.step(bucket)  # comm: xbar(t-1) becomes the stepped x_outer, mixed in below
    opt = bucket.optimizer
    assert opt is not None
    if not bucket.grads_checked:  # a model's sparse gradients are sparse from the first step
        bucket.grads_checked = True
        bucket.sparse_grads = any(p.grad is not None and p.grad.is_sparse for p in bucket.params)
        if bucket.fused and bucket.sparse_grads:
            drop_fused(opt)  # torch's fused kernels take dense gradients only
            bucket.fused = False
    pre = getattr(opt, "pre_average_hook", None)
    post = getattr(opt, "post_average_hook", None)
    plan: list[DecayFold] | None = None
    if pending is not None:
        if bucket.flat is not None and pre is None and post is None and not state.stable_storage:
            # every gradient arrived (and dense, as the fused check found): the groups' lists as they are
            every = bucket.n_fired == len(bucket.params) and not bucket.sparse_grads
            plan = [] if skip_update else decay_plan(opt, all_have_grads=every)
        if state.compressor is not None and not outer_round:
            # comm := sum_j W_ij xhat_j - xhat_i, from the compressed deviations
            state.compressor.correction(bucket, pending[1], pending[2])
            if plan is not None:
                _mix_in_place_of(bucket, plan, state.alpha, corrected=True)
        elif plan is None:
            _mix_correction(bucket)  # comm := W x(t-1) - x(t-1)
        else:
            _mix_in_place_of(bucket, plan, state.alpha)  # parameters := mixed x(t-1)
        if bucket.state_pending is not None:  # the states of step t-1, mixed with W(t)
            assert state.state_sync is not None
            state.state_sync.apply(bucket, bucket.state_pending, pending[1], pending[2])
    t1 = timers.mark()
    if not skip_update:
        edge = pending[0] if pending is not None else state.alone
        if pre is not None:
            pre(edge, edge.self_weight)
        # parameters without a gradient since the last step have grad None: skipped
        if plan:
            saved = [g["weight_decay"] for g in opt.param_groups]
            for g in opt.param_groups:
                g["weight_decay"] = 0.0  # applied at x(t-1) by _mix_in_place_of
            try:
                opt.step()
            finally:
                for g, wd in zip(opt.param_groups, saved):
                    g["weight_decay"] = wd
        else:
            opt.step()
        if bucket.scheduler is not None:
            bucket.scheduler.step()
    t2 = timers.mark()
    if pending is not None and plan is None:
        for c, v in zip(bucket.comm_views, bucket.values()):
            v.add_(c, alpha=state.alpha)
    if not skip_update and post is not None:
        post()
    bucket.pending = None
    bucket.state_pending = None
    if state.stream is not None:
        for p in bucket.params:
            if p.grad is not None:
                p.grad.record_stream(state.stream)  # made on the backward's stream
    bucket.zero_grads()
    bucket.stepped = True
    t3 = timers.mark()
    timers.add("comm/mix_s", t0, t1)
    timers.add("comm/optim_s", t1, t2)
    timers.add("comm/mix_s", t2, t3)


def _mix_correction(bucket: Bucket) -> None:
    """Turn the received gossip in ``comm`` into ``W x(t-1) - x(t-1)``."""
    _, self_w, peer_w = bucket.pending
    # comm holds peer_w * sum_j x_j(t-1), own value included
    for c, v in zip(bucket.comm_views, bucket.values()):
        c.add_(v, alpha=self_w - peer_w - 1.0)


def _mix_in_place_of(
    bucket: Bucket, plan: list[DecayFold], a: float, corrected: bool = False
) -> None:
    """Make the parameters ``x(t-1) + a (W x(t-1) - x(t-1))``, this step's decay folded in.

    The decay the optimizer would compute from the parameters is computed
    here from x(t-1), before the parameters change: L2 terms go into the
    gradients, decoupled terms into the mixed value. With ``corrected``,
    ``comm`` already holds the correction (compressed gossip's).
    """
    _, self_w, peer_w = bucket.pending
    assert bucket.flat is not None
    x, comm = bucket.flat, bucket.comm
    # comm = peer_w * sum_j x_j, so the mix is a * comm + b * x
    b = 1.0 + a * (self_w - peer_w - 1.0)
    if corrected:
        if a != 1.0:
            comm.mul_(a)
        comm.add_(x)
    elif abs(b) < 1e-15:  # equal weights (up to the rounding of 1/k) and a = 1
        pass
    elif a == 1.0:
        comm.add_(x, alpha=b)
    elif abs(a + b - 1.0) < 1e-15:
        comm.lerp_(x, b)
    else:
        comm.mul_(a).add_(x, alpha=b)
    for params, form, coef in plan:  # one multi-tensor kernel per group, not one per parameter
        if form == "coupled":
            grads = [p.grad for p in params if p.grad is not None]
            assert len(grads) == len(params)  # the plan lists parameters with a gradient
            torch._foreach_add_(grads, params, alpha=coef)
        else:
            views = [bucket.comm_param_views[bucket.position[id(p)]] for p in params]
            torch._foreach_add_(views, params, alpha=coef)
    bucket.swap_blocks()
