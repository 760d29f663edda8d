"""The wrapper's per-iteration engine: buckets, gradient hooks and the gossip in flight.

:class:`Engine` decides *when* each bucket steps during a backward pass: as
soon as its last gradient arrives (and, on CPU, its previous gossip), or at
the end of backward for buckets that were incomplete, late, or held back by
loss scaling or global-norm clipping. :mod:`decent_dp._engine.gossip` decides *how*
one bucket steps. :class:`decent_dp.DecentralizedDataParallel` is the
public face and delegates here.

The hooks registered on the parameters and on the forward's outputs hold the
engine weakly, so dropping the wrapper (its only strong owner) frees the
engine, and a finalizer releases what it holds.

The module is one unit on purpose: every decision about when a bucket steps
(on time, deferred, recovered after a failed backward, held for loss scaling)
reads the same per-iteration state, and splitting it would spread that state
across modules.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten

from .._comm.compressed import GossipCompressor
from .._comm.groups import make_groups, make_second_groups
from .._comm.hierarchical import make_host_groups
from ..compression import CompressionSpec
from ..optim._factories import OptimBuilder
from ..optim._kernels import prefer_fused, restore_fused
from ..topo import Edge, Topology, hierarchical_keys
from .bucket import Bucket, is_dense
from .clip import by_device_and_dtype, clip_grads_
from .cpu_memory import keep_freed_memory
from .device import GradStreams, device_guard, side_stream
from .gossip import GossipState, arrived, delivered, launch, step_bucket, wait
from .outer import OuterOptimizer
from .setup import plan_buckets
from .state_sync import StateSync
from .timers import SpanTimers

__all__ = ["Engine"]

TIMER_KEYS = ("comm/wait_s", "comm/mix_s", "comm/optim_s")


class _Resources:
    """What an engine must release: hooks, in-flight gossip, its threads and its own process groups.

    Kept apart from the engine so that a finalizer can release it after the
    engine is gone.
    """

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.groups: list[Any] = []
        self.buckets: list[Bucket] = []
        self.device: torch.device | None = None
        self.driver: Any = None  # the hierarchical exchange's PhaseDriver, off NCCL; closed here
        self.gossip: GossipState | None = None  # they refer to groups: let go of at release
        self.outer: OuterOptimizer | None = None

    def release(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        with device_guard(self.device or torch.device("cpu")):
            self._finish_work()
        if self.driver is not None:  # idle now: every exchange it started was waited for
            self.driver.close()  # joins its thread
        for group in self.groups:
            if dist.is_initialized():
                with contextlib.suppress(Exception):  # already gone with the default group
                    dist.destroy_process_group(group)
        self.groups.clear()
        self._let_go_of_groups()

    def _let_go_of_groups(self) -> None:
        """Drop every reference to a process group, the default group's included.

        A gloo group that outlives ``destroy_process_group()`` (this wrapper,
        still referenced, holding it) is freed while the interpreter finalizes:
        its worker threads, dropping their last work, then need the GIL and
        abort the process ("terminate called without an active exception").
        Let go of here, ``destroy_process_group()`` frees them while the
        interpreter is whole.
        """
        gossip, outer = self.gossip, self.outer
        for b in self.buckets:
            b.group = None
        if gossip is not None:
            gossip.groups[:] = [None] * len(gossip.groups)
            if gossip.compressor is not None:
                gossip.compressor.seconds.clear()
            if gossip.hosts is not None:
                gossip.hosts.release()
        if outer is not None:
            outer.group, outer.second = None, None

    def _finish_work(self) -> None:
        for b in self.buckets:
            if b.work is not None:
                with contextlib.suppress(Exception):  # a dead peer must not block the release
                    b.work.wait()
                b.work = None
        if self.device is not None and self.device.type == "cuda":
            # on NCCL work.wait() only orders streams: the communicators' kernels (and the
            # side stream's use of the buffers) must be over before the groups are destroyed
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(self.device)


class Engine:
    """Buckets, hooks and gossip of one wrapper; see the module docstring.

    Args:
        params: The trained parameters, in the module's order.
        names: Their names.
        topology: The topology, built for ``world_size``.
        build_optim: Builds a bucket's optimizer from ``(name, parameter)`` pairs.
        lr_scheduler_fn: Builds a bucket's LR scheduler, or ``None``.
        scaler: A ``GradScaler``, or ``None``.
        grad_clip_norm: Global-norm clipping threshold; 0 disables.
        as_view: Make the parameters views into each bucket's block.
        stable_storage: Step in place, keeping the parameters' storage.
        bucket_bytes: Target bucket size in bytes.
        compression: The gossip's compressor (``None``: exact all-reduce).
        outer: The outer optimizer (:mod:`decent_dp._engine.outer`), or ``None``.
        state_sync: Optimizer states gossiped with the parameters
            (:mod:`decent_dp._engine.state_sync`), or ``None``.
    """

    def __init__(
        self,
        params: list[nn.Parameter],
        names: list[str],
        topology: Topology,
        build_optim: OptimBuilder,
        lr_scheduler_fn: Callable[[Any], Any] | None,
        scaler: Any,
        grad_clip_norm: float,
        as_view: bool,
        stable_storage: bool,
        bucket_bytes: int,
        compression: CompressionSpec | None = None,
        outer: OuterOptimizer | None = None,
        state_sync: StateSync | None = None,
    ):
        self.params = params
        self.names = names
        self.topology = topology
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.scaler = scaler
        self._build_optim = build_optim
        self._lr_scheduler_fn = lr_scheduler_fn
        self._grad_clip_norm = grad_clip_norm
        self._as_view = as_view
        self._bucket_bytes = bucket_bytes
        self._res = _Resources()
        self.device = params[0].device
        self._res.device = self.device
        # bucket work runs beside the backward pass on CUDA (see _side); the stream is
        # this process's one for the device, taken before any group of this wrapper exists
        self.stream = side_stream(self.device)
        with device_guard(self.device):
            skip = hierarchical_keys(topology)  # exchanged in three phases on groups of their own
            created, edges, groups = make_groups(topology, self.rank, self.world_size, skip)
            made, hosts = make_host_groups(topology, self.rank, self.world_size)
            seconds = self._second_groups(compression, outer, edges, groups)
        self._res.groups.extend(created + made)
        self._res.driver = hosts.driver if hosts is not None else None
        self.timers = SpanTimers(TIMER_KEYS, self.device)
        self.gossip = GossipState(
            edges, groups, Edge([self.rank], 1.0), stable_storage, self.stream, self.timers
        )
        if compression is not None and compression.name != "none":
            self.gossip.compressor = GossipCompressor(compression, seconds=seconds)
        if outer is not None:
            outer.second = seconds.get(dist.group.WORLD)
        self.outer = outer
        self.gossip.outer = outer
        self.gossip.hosts = hosts
        self.gossip.state_sync = state_sync
        self.buckets: list[Bucket] | None = None
        self._bucket_of: dict[int, tuple[Bucket, int]] = {}
        self._order: list[int] = []
        self._seen_first: list[bool] = [False] * len(params)
        self.step_count = 0
        self.accumulate = False
        self._bwd_active = False
        self._next_launch = 0
        self._ready: list[Bucket] = []  # complete, not yet stepped (their gossip is late)
        self._grad_streams = GradStreams(self.device)  # keyed by bucket, -1 before buckets
        self._relaunch = False  # launch every bucket's gossip before the next forward
        self._relaunch_outer_only = False  # ... or only those of outer rounds (global_avg)
        self.closed = False
        # called once with the buckets when they are built (states a checkpoint left to load)
        self.after_build: Callable[[list[Bucket]], None] | None = None
        # where the squared gradient norms of one model's parts are summed (a sharded
        # replica's shard ranks, decent_dp.sharded._wrapper); None: this rank holds the whole model
        self.norm_group: Any = None
        me = weakref.ref(self)
        for i, p in enumerate(params):
            self._res.handles.append(p.register_post_accumulate_grad_hook(_grad_hook(me, i)))
        self._res.gossip, self._res.outer = self.gossip, outer
        # at interpreter exit too (a wrapper never closed): the gossip in flight is waited for,
        # the phase thread joined and the groups let go of while the interpreter is whole
        self._finalizer = weakref.finalize(self, self._res.release)

    def _second_groups(
        self,
        compression: CompressionSpec | None,
        outer: OuterOptimizer | None,
        edges: list[Edge],
        groups: list[Any],
    ) -> dict[Any, tuple[Any, list[Any]]]:
        """The groups where two-phase exchanges run their second phase, with their start queues.

        Needed off NCCL only (NCCL starts the second phase at the launch), and
        only where buckets of one step can take different kinds of rounds on
        one group: the fragments of the outer optimizer, and its compressed
        rounds (see :func:`decent_dp._comm.groups.make_second_groups`).
        """
        if dist.get_backend() == "nccl" or outer is None:
            return {}
        split = ("bf16", "int8")
        gossip = compression is not None and compression.name in split and outer.fragments > 1
        with_world = outer.compression in split
        if not (gossip or with_world):
            return {}
        made, seconds = make_second_groups(
            self.topology if gossip else None, self.world_size, edges, groups, with_world
        )
        self._res.groups.extend(made)
        # waits can come out of launch order: a failed backward's recovery steps the complete
        # buckets in the order they completed, not in bucket order; the queue restores it
        queues: dict[Any, list[Any]] = {}
        return {g: (s, queues.setdefault(s, [])) for g, s in seconds.items()}

    def close(self) -> None:
        """Finish in-flight gossip, remove the hooks and destroy the process groups; idempotent."""
        if self.closed:
            return
        self.closed = True
        self._finalizer()
        if self.gossip.compressor is not None:  # the references are model-sized
            self.gossip.compressor.load_state(None)
            self.gossip.compressor.scratch.clear()
        if self.outer is not None:
            self.outer.release()
        if self.gossip.hosts is not None:
            self.gossip.hosts.release()

    # ---------------------------------------------------------------- buckets
    def build_buckets(self, layout: Sequence[Sequence[str]] | None = None) -> None:
        """Cut the parameters into buckets: by ``layout`` (lists of names) or by gradient order."""
        if layout is not None:
            pos = {n: i for i, n in enumerate(self.names)}
            unknown = [n for names in layout for n in names if n not in pos]
            if unknown or sorted(n for names in layout for n in names) != sorted(self.names):
                raise ValueError(
                    f"the saved bucket layout does not match this model's parameters (e.g. {unknown[:3]})"
                )
            groups = [[pos[n] for n in names] for names in layout]
        else:
            groups = plan_buckets(self._order, self.params, self._bucket_bytes, self.world_size)
        buckets = []
        for b, idx in enumerate(groups):
            params = [self.params[i] for i in idx]
            for p in params:
                if self._as_view and not is_dense(p):
                    p.data = p.data.contiguous()
            names = [self.names[i] for i in idx]
            bucket = Bucket(b, params, names, self._as_view)
            bucket.optimizer = self._build_optim(list(zip(names, params)))
            bucket.fused = prefer_fused(bucket.optimizer, bucket.device)
            if self._lr_scheduler_fn is not None:
                bucket.scheduler = self._lr_scheduler_fn(bucket.optimizer)
            for j, i in enumerate(idx):
                self._bucket_of[i] = (bucket, j)
            if self.outer is not None:
                self.outer.add_bucket(bucket)
            buckets.append(bucket)
        if self.outer is not None:
            self.outer.check_buckets(len(buckets))
        self.buckets = buckets
        self._res.buckets[:] = buckets
        if self.after_build is not None:
            load, self.after_build = self.after_build, None
            load(buckets)
        if self.device.type == "cpu":
            # gradients are freed after each step and allocated again by the next backward
            keep_freed_memory(sum(p.numel() * p.element_size() for p in self.params))

    def values(self) -> list[torch.Tensor]:
        """The parameter storage: each bucket's block, or the parameters before bucketing."""
        if self.buckets is not None:
            return [v for b in self.buckets for v in b.values()]
        return [p.data for p in self.params]

    def drain(self) -> None:
        """Finish in-flight gossip (the results stay pending for the next step)."""
        with device_guard(self.device):
            for b in self.buckets or []:
                wait(self.gossip, b)

    @property
    def relaunch(self) -> bool:
        """Launch the gossip of every bucket before the next forward (after a load)."""
        return self._relaunch

    @relaunch.setter
    def relaunch(self, value: bool) -> None:
        self._relaunch = bool(value)
        self._relaunch_outer_only = False

    def relaunch_outer_rounds(self) -> None:
        """Launch before the next forward only the gossip of buckets whose next round is outer.

        After a global average the workers are identical and every other round
        would mix each to itself; an outer round must still take place.
        """
        outer, step = self.outer, self.step_count + 1
        self._relaunch = outer is not None and any(
            outer.due(step, b.index) for b in self.buckets or []
        )
        self._relaunch_outer_only = True

    def _relaunches(self, bucket: Bucket) -> bool:
        if not self._relaunch_outer_only:
            return True
        return self.outer is not None and self.outer.due(self.step_count + 1, bucket.index)

    def forget_gossip(self) -> list[Any]:
        """Drop the (drained) gossip results, so the next step mixes the identity; return them.

        Each bucket's result is its ``(pending, state_pending)`` pair.
        """
        dropped = [(b.pending, b.state_pending) for b in self.buckets or []]
        for b in self.buckets or []:
            b.pending = None
            b.state_pending = None
        return dropped

    # ---------------------------------------------------------------- forward
    @torch.compiler.disable
    def before_forward(self) -> None:
        """Recover from a backward that raised, and relaunch gossip after a load or average."""
        if self.closed:
            raise RuntimeError("this DecentralizedDataParallel was closed; wrap the model again")
        with device_guard(self.device):
            if self._bwd_active and torch._C._current_autograd_node() is None:
                # a backward began and never finished: it raised
                self._recover_failed_backward()
            if self._relaunch and self.buckets is not None:
                # on the side stream, after the load: the payloads must be made and freed where
                # they are read, as in a launch from the backward pass
                with self._side():
                    for b in self.buckets:
                        if self._relaunches(b):
                            launch(self.gossip, b, self.step_count + 1)
                self.relaunch = False

    @torch.compiler.disable
    def watch_outputs(self, out: Any) -> None:
        """Let the first gradient of the forward's outputs announce the backward pass."""
        if not torch.is_grad_enabled():
            return
        me = weakref.ref(self)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(_output_hook(me))

    # --------------------------------------------------------------- backward
    @property
    def _deferred(self) -> bool:
        """Global-norm clipping and loss scaling need every gradient before any step."""
        return self._grad_clip_norm > 0 or (self.scaler is not None and self.scaler.is_enabled())

    def _side(self, buckets: Sequence[Bucket] = ()) -> contextlib.AbstractContextManager[Any]:
        """Bucket work runs on the side stream, after everything queued so far on the caller's.

        It also waits for the gradients of ``buckets`` made on other streams
        (a model that runs branches under ``torch.cuda.stream(s)``).
        """
        if self.stream is None:
            return contextlib.nullcontext()
        keys = [b.index for b in buckets] if self.buckets is not None else []
        self._grad_streams.make_wait(self.stream, keys + [-1])
        return torch.cuda.stream(self.stream)

    def _begin_backward(self) -> None:
        """Queue the end-of-backward work on the backward pass that is running now."""
        self._bwd_active = True
        if self.buckets is not None:
            for b in self.buckets:
                b.expected = sum(1 for p in b.params if p.requires_grad)
        torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)

    def on_output_grad(self) -> None:
        # the forward's outputs get their gradient first, always in the outer backward; a
        # parameter's may come from a nested one (reentrant checkpointing), whose end is too early
        if not self._bwd_active:
            self._begin_backward()

    def on_grad(self, index: int) -> None:
        if not self._bwd_active:
            self._begin_backward()  # a backward that did not pass through forward()'s outputs
        if self.buckets is None:
            if self.stream is not None:
                self._grad_streams.note(-1)
            if not self._seen_first[index]:
                self._seen_first[index] = True
                self._order.append(index)
            return
        bucket, j = self._bucket_of[index]
        if bucket.fired[j]:
            return
        if self.stream is not None:
            self._grad_streams.note(bucket.index)
        bucket.fired[j] = True
        bucket.n_fired += 1
        if self.accumulate or self._deferred or bucket.stepped:
            return
        if bucket.n_fired >= bucket.expected:
            self._ready.append(bucket)
        if self._ready:
            self._step_ready()

    def _step_ready(self) -> None:
        """Step the complete buckets whose gossip has arrived; on CPU, leave the others for later.

        On CPU, waiting for a late neighbour blocks the thread that runs the
        backward pass; it computes the remaining gradients first instead, and
        the end of backward waits for what is still missing. On CUDA the wait
        is a stream dependency and costs the thread nothing, but an emulated
        network delay would be a sleep: those buckets are left for later too.
        """
        with self._side(self._ready):
            for bucket in list(self._ready):
                if self.stream is None and not arrived(self.gossip, bucket):
                    continue
                if self.stream is not None and not delivered(self.gossip, bucket):
                    continue
                self._ready.remove(bucket)
                step_bucket(self.gossip, bucket, skip_update=False)
            self._launch_in_order()

    def _on_backward_end(self) -> None:
        # the callback may run on the caller's thread, whose current device can be another
        with device_guard(self.device):
            self._end_backward()

    def _end_backward(self) -> None:
        self._bwd_active = False
        if self.buckets is None:
            if self.accumulate:
                return
            self.build_buckets()
        assert self.buckets is not None
        if self.accumulate:
            for b in self.buckets:
                b.reset_iteration()
            return
        if self._deferred and self.stream is not None:
            # unscaling and clipping read every gradient on this stream, wherever each was made
            keys = [b.index for b in self.buckets] + [-1]
            self._grad_streams.make_wait(torch.cuda.current_stream(self.device), keys)
        skip = self._unscale_and_clip() if self._deferred else False
        self._finish_iteration(skip)

    def _finish_iteration(self, skip: bool) -> None:
        """Step what is left, launch every remaining gossip in order, and count the step."""
        assert self.buckets is not None
        with self._side(self.buckets):
            for b in self.buckets:
                if not b.stepped:
                    step_bucket(self.gossip, b, skip_update=skip)
            self._launch_in_order(force=True)
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        for b in self.buckets:
            b.reset_iteration()
        self._ready.clear()
        self._grad_streams.clear()
        self._next_launch = 0
        self.step_count += 1

    def _recover_failed_backward(self) -> None:
        """Complete an iteration whose backward raised, so that every rank stays in step.

        Buckets that had stepped keep their update and their launched gossip.
        The others drop their partial gradients and only mix (``d = 0``), so
        this rank issues the same collectives as a normal iteration. With loss
        scaling the rank reports an inf, so every worker skips that step.
        Under gradient accumulation the partial gradients stay accumulated.
        """
        self._bwd_active = False
        if self.buckets is None:
            return
        if self.accumulate:
            for b in self.buckets:
                b.reset_iteration()
            return
        # complete buckets left for their late gossip step as they would have in time
        with self._side(self._ready):
            for b in self._ready:
                step_bucket(self.gossip, b, skip_update=False)
        self._ready.clear()
        for b in self.buckets:
            if not b.stepped:
                b.zero_grads()
        skip = self._unscale_and_clip(failed=True) if self._deferred else True
        self._finish_iteration(skip)

    @torch.no_grad()
    def _unscale_and_clip(self, failed: bool = False) -> bool:
        """Unscale (GradScaler) and clip the worker's global gradient norm; True skips the step."""
        assert self.buckets is not None
        grads = [g for b in self.buckets for g in b.grads()]
        skip = failed
        scaler = self.scaler
        if scaler is not None and scaler.is_enabled():
            scale = scaler._scale  # GradScaler keeps its scale as a 1-element tensor
            found = torch.full((1,), float(failed), dtype=torch.float32, device=scale.device)
            if grads:
                inv = scale.double().reciprocal().float()
                # GradScaler's own fused kernel: one launch per (device, dtype) for all gradients
                for (device, _), same in by_device_and_dtype(grads).items():
                    found_here = torch.zeros(1, dtype=torch.float32, device=device)
                    torch._amp_foreach_non_finite_check_and_unscale_(
                        same, found_here, inv.to(device)
                    )
                    found += found_here.to(found.device)
            # every worker must skip together and keep the same scale
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
            torch._amp_update_scale_(
                scaler._scale,
                scaler._growth_tracker,
                found,
                scaler.get_growth_factor(),
                scaler.get_backoff_factor(),
                scaler.get_growth_interval(),
            )
            skip = bool(found.item() > 0)  # the optimizer step is host-side control flow
        if not skip and self._grad_clip_norm > 0 and (grads or self.norm_group is not None):
            clip_grads_(grads, self._grad_clip_norm, group=self.norm_group)
        return skip

    def _launch_in_order(self, force: bool = False) -> None:
        """Launch gossips in bucket order, so every rank issues its collectives in the same order."""
        assert self.buckets is not None
        while self._next_launch < len(self.buckets):
            b = self.buckets[self._next_launch]
            if not (b.stepped or force):
                return
            launch(self.gossip, b, self.step_count + 2)  # for the next step; this is step_count + 1
            self._next_launch += 1

    # ----------------------------------------------------------- checkpoints
    def training_state(self) -> dict[str, Any]:
        """Per-bucket optimizer and scheduler states, the step counter, the scaler and the layout."""
        state: dict[str, Any] = {
            "step": self.step_count,
            "topology": self.topology.name,
            "world_size": self.world_size,
            "layout": None,
            "optimizers": [],
            "schedulers": [],
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }
        if self.gossip.compressor is not None:
            state["compression"] = self.gossip.compressor.state()
        if self.gossip.state_sync is not None:
            state["state_sync"] = self.gossip.state_sync.state_dict()
        if self.buckets is not None:
            state["layout"] = [list(b.names) for b in self.buckets]
            state["optimizers"] = [
                b.optimizer.state_dict() for b in self.buckets if b.optimizer is not None
            ]
            state["schedulers"] = [
                b.scheduler.state_dict() if b.scheduler is not None else None for b in self.buckets
            ]
            if self.outer is not None:
                state["outer"] = self.outer.state_dict()
        return state

    def load_training_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`training_state` (drained first); gossip relaunches before the next forward."""
        sync = self.gossip.state_sync
        saved, mine = state.get("state_sync") or {}, sync.state_dict() if sync is not None else {}
        if saved != mine:
            raise ValueError(
                f"training state was saved with state_sync={saved or None}; "
                f"this run has state_sync={mine or None}"
            )
        self.drain()
        layout = state.get("layout")
        if layout is not None:
            if self.buckets is None:
                self.build_buckets(layout)
            elif [list(b.names) for b in self.buckets] != [list(n) for n in layout]:
                raise ValueError(
                    "the saved bucket layout differs from this wrapper's; use the same model and bucket_size_in_mb"
                )
            assert self.buckets is not None
            for b, opt_state, sched_state in zip(
                self.buckets, state["optimizers"], state["schedulers"]
            ):
                assert b.optimizer is not None
                b.optimizer.load_state_dict(opt_state)
                if b.fused:
                    restore_fused(b.optimizer)  # the loaded groups carry their own flags
                if b.scheduler is not None and sched_state is not None:
                    b.scheduler.load_state_dict(sched_state)
            if self.outer is not None and state.get("outer") is not None:
                self.outer.load_state_dict(state["outer"])  # older states keep the current copies
            self.forget_gossip()
        comp = self.gossip.compressor
        if comp is not None:
            comp.load_state(state.get("compression"))  # absent in older states: start afresh
            if self.buckets is not None:
                comp.place(self.buckets)
        elif state.get("compression") is not None:
            raise ValueError(
                f"training state was saved with compression={state['compression'].get('name')!r}; "
                "this run has compression='none'"
            )
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.step_count = int(state["step"])
        self.relaunch = self.step_count > 0 and self.buckets is not None


def _grad_hook(ref: weakref.ReferenceType[Engine], index: int) -> Callable[[torch.Tensor], None]:
    """A post-accumulate-grad hook that holds its engine weakly (it lives on the parameter)."""

    def hook(param: torch.Tensor) -> None:
        engine = ref()
        if engine is not None:
            engine.on_grad(index)

    return hook


def _output_hook(ref: weakref.ReferenceType[Engine]) -> Callable[[torch.Tensor], None]:
    def hook(grad: torch.Tensor) -> None:
        engine = ref()
        if engine is not None:
            engine.on_output_grad()

    return hook
