"""One bucket's update ``x(t) = x(t-1) + a (W x(t-1) - x(t-1)) + d(t)`` and its gossip.

:class:`GossipState` is what these functions need besides the bucket: this
rank's edge and process group for every round, the mixing step size, the
network-emulation delay and the timers. The functions decide *how* one bucket
steps; :mod:`decent_dp._engine` decides *when*.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ._bucket import Bucket
from ._optim_plan import DecayFold, decay_plan, drop_fused
from ._timers import SpanTimers
from .topo import Edge

__all__ = ["GossipState", "arrived", "launch", "step_bucket", "wait"]


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
            seconds after launch, or ``None``.
        outer: The outer optimizer, whose rounds replace the topology's every
            ``H`` steps, or ``None``.
    """

    edges: list[Edge]
    groups: list[Any]
    alone: Edge
    stable_storage: bool
    stream: Any
    timers: SpanTimers
    alpha: float = 1.0
    comm_delay: Callable[[int, int], float] | None = None
    outer: Any = None  # an OuterOptimizer (decent_dp._outer), or None
    period: int = field(init=False)  # of the topology: len(edges)

    def __post_init__(self) -> None:
        self.period = len(self.edges)


def arrived(state: GossipState, bucket: Bucket) -> bool:
    """Whether the bucket's gossip has completed (and the emulated network delivered it)."""
    if bucket.work is None:
        return True
    if state.comm_delay is not None and bucket.delay_left() > 0:
        return False
    return bool(bucket.work.is_completed())


@torch.no_grad()
def wait(state: GossipState, bucket: Bucket) -> None:
    """Block until the bucket's gossip has arrived; its result stays pending."""
    if bucket.work is None:
        return
    t0 = state.timers.mark()
    bucket.work.wait()
    if state.comm_delay is not None:
        remaining = bucket.delay_left()
        if remaining > 0:
            time.sleep(remaining)
    bucket.work = None
    state.timers.add("comm/wait_s", t0, state.timers.mark())


@torch.no_grad()
def launch(state: GossipState, bucket: Bucket, for_step: int) -> None:
    """Start the gossip whose result step ``for_step`` (1-based) mixes in."""
    round_index = (for_step - 1) % state.period
    edge = state.edges[round_index]
    group = state.groups[round_index]
    outer_round = state.outer is not None and state.outer.due(for_step)
    if outer_round:  # the exact average of the world, whatever the topology's round
        edge, group = state.outer.edge, state.outer.group
    k = len(edge.ranks)
    if k == 1 and not outer_round:
        bucket.pending = None  # a round alone costs nothing: no copy, no collective
        return
    t0 = state.timers.mark()
    peer_w = edge.peer_weight if k > 1 else 1.0  # alone, an outer round copies x(t-1) as it is
    for c, v in zip(bucket.comm_views, bucket.values()):
        torch.mul(v, peer_w, out=c)  # copy and weight in one pass
    bucket.pending = (edge, edge.self_weight, peer_w)
    bucket.launch_t = time.perf_counter()
    if state.comm_delay is not None:
        bucket.delay_s = float(state.comm_delay(bucket.numel * bucket.comm.element_size(), k))
    if k > 1:  # alone, an outer round's average is the copy itself
        bucket.work = dist.all_reduce(bucket.comm, group=group, async_op=True)
    state.timers.add("comm/mix_s", t0, state.timers.mark())


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
    if pending is not None and state.outer is not None and pending[0] is state.outer.edge:
        state.outer.step(bucket)  # comm: xbar(t-1) becomes the stepped x_outer, mixed in below
    opt = bucket.optimizer
    assert opt is not None
    if bucket.fused and not bucket.fused_checked:
        bucket.fused_checked = True
        if any(p.grad is not None and p.grad.is_sparse for p in bucket.params):
            drop_fused(opt)  # torch's fused kernels take dense gradients only
            bucket.fused = False
    pre = getattr(opt, "pre_average_hook", None)
    post = getattr(opt, "post_average_hook", None)
    plan: list[DecayFold] | None = None
    if pending is not None:
        if bucket.flat is not None and pre is None and post is None and not state.stable_storage:
            plan = [] if skip_update else decay_plan(opt)
        if plan is None:
            _mix_correction(bucket)  # comm := W x(t-1) - x(t-1)
        else:
            _mix_in_place_of(bucket, plan, state.alpha)  # parameters := mixed x(t-1)
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


def _mix_in_place_of(bucket: Bucket, plan: list[DecayFold], a: float) -> None:
    """Make the parameters ``x(t-1) + a (W x(t-1) - x(t-1))``, this step's decay folded in.

    The decay the optimizer would compute from the parameters is computed
    here from x(t-1), before the parameters change: L2 terms go into the
    gradients, decoupled terms into the mixed value.
    """
    _, self_w, peer_w = bucket.pending
    assert bucket.flat is not None
    x, comm = bucket.flat, bucket.comm
    # comm = peer_w * sum_j x_j, so the mix is a * comm + b * x
    b = 1.0 + a * (self_w - peer_w - 1.0)
    if abs(b) < 1e-15:  # equal weights (up to the rounding of 1/k) and a = 1
        pass
    elif a == 1.0:
        comm.add_(x, alpha=b)
    elif abs(a + b - 1.0) < 1e-15:
        comm.lerp_(x, b)
    else:
        comm.mul_(a).add_(x, alpha=b)
    for params, form, coef in plan:
        for p in params:
            if form == "coupled":
                assert p.grad is not None  # the plan lists parameters with a gradient
                p.grad.add_(p, alpha=coef)
            else:
                bucket.comm_param_views[bucket.position[id(p)]].add_(p, alpha=coef)
    bucket.swap_blocks()
