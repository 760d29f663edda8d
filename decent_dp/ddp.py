"""DecentralizedDataParallel: the optimizer fused into backward, with overlapped gossip.

Worker ``i`` at iteration ``t`` computes::

    x_i(t) = (1 - a) x_i(t-1) + a sum_j W_ij(t) x_j(t-1) + d_i(t)

where ``d_i(t)`` is the local optimizer update computed from the gradient at
``x_i(t-1)`` on the worker's own batch, ``W(t)`` is the mixing matrix of the
topology's round ``(t-1) mod period`` and ``a`` is the mixing step size (1 by
default, :meth:`DecentralizedDataParallel.set_adaptive_factor`). The gossip of
``x(t-1)`` is launched asynchronously right after step ``t-1`` and completes
while iteration ``t`` runs its forward and backward pass; the local update
never waits for the neighbours' models of the same iteration.

Parameters are cut into buckets in the order their gradients become ready
(recorded on the first backward). Each bucket owns a contiguous, 256-byte
aligned block of parameters (the parameters are views into it), a gradient
block, one communication block, and its own optimizer and LR scheduler. When a
bucket's last gradient arrives, a post-accumulate-grad hook waits for that
bucket's previous gossip, mixes, steps the optimizer and scheduler, and
launches the next gossip. On CUDA that work runs on a side stream, so a slow
gossip delays only its own bucket, not the rest of backward. Buckets not
complete when backward ends (parameters without a gradient this iteration) are
stepped from a callback at the end of backward, so every bucket is stepped and
gossiped exactly once per iteration.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.utils._pytree import tree_flatten

from ._bucket import Bucket, is_dense
from ._cpu_memory import keep_freed_memory
from ._factories import check_scheduler, resolve_optim_fn
from ._optim_plan import DecayFold, decay_plan, drop_fused, prefer_fused, restore_fused
from ._timers import SpanTimers
from .metrics import count_sketch
from .topo import Edge, Topology, TopologyReg

__all__ = [
    "DecentralizedDataParallel",
    "OptimFn",
    "LRSchedulerFn",
    "CommDelayFn",
    "OPTIM_FN_TYPE",
    "LR_SCHEDULER_FN_TYPE",
]

OptimFn = Callable[[list[tuple[torch.Tensor, str]]], Optimizer]
LRSchedulerFn = Callable[[Optimizer], Any]
CommDelayFn = Callable[[int, int], float]
# the names decent-dp 0.2.x scripts import
OPTIM_FN_TYPE = OptimFn
LR_SCHEDULER_FN_TYPE = LRSchedulerFn

_TIMER_KEYS = ("comm/wait_s", "comm/mix_s", "comm/optim_s")


def _unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module behind ``torch.compile(module)``, whose names carry no ``_orig_mod.``."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else model


class _Resources:
    """What a wrapper must release: hooks, in-flight gossip and its own process groups.

    Kept apart from the wrapper so that a finalizer can release it after the
    wrapper is gone.
    """

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.groups: list[Any] = []
        self.buckets: list[Bucket] = []

    def release(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for b in self.buckets:
            if b.work is not None:
                with contextlib.suppress(Exception):  # a dead peer must not block the release
                    b.work.wait()
                b.work = None
        for group in self.groups:
            if dist.is_initialized():
                with contextlib.suppress(Exception):  # already gone with the default group
                    dist.destroy_process_group(group)
        self.groups.clear()


class DecentralizedDataParallel(nn.Module):
    """Decentralized data parallel wrapper with the optimizer fused into backward.

    Each worker keeps its own model; after every local optimizer step it
    averages with the neighbours the topology names for that step. The
    optimizer and LR scheduler step *inside* ``loss.backward()``, bucket by
    bucket, so a training loop is just forward plus backward.

    Only parameters with ``requires_grad=True`` at wrapping time are trained and
    gossiped; frozen ones stay out of the buckets, as with torch's DDP.

    Performance choices the wrapper makes (the update stays
    ``x(t) = x(t-1) + a (W x(t-1) - x(t-1)) + d(t)`` with ``d`` from ``x(t-1)``):

    * With ``param_as_bucket_view=True``, ``stable_param_storage=False`` and
      an exact torch optimizer class
      (SGD, Adam, AdamW, NAdam, RAdam, RMSprop, Adagrad, Adadelta, Adamax,
      Rprop) or this package's AccumAdam(W), the parameters move into the
      received gossip buffer each step instead of being updated in place: a
      parameter's ``data_ptr()`` alternates between two blocks. Weight decay
      is computed from ``x(t-1)`` by the wrapper. Other optimizers, or any
      with ``pre_average_hook``, step in place.
    * An SGD, Adam or AdamW whose ``foreach`` and ``fused`` are left unset is
      switched to torch's fused kernel. Set either to opt out.
    * On CPU with glibc, freed gradient memory is kept in the process
      (``mallopt``) rather than faulted in again each step; set
      ``DECENT_DP_KEEP_FREED_MEMORY=0`` or any ``MALLOC_*_`` variable to opt out.

    Args:
        model: The module to train, already on its device and in its dtype. A
            ``torch.compile``-d module works too; names and checkpoints use the
            original module's keys.
        optim_fn: Builds an optimizer from a list of ``(parameter, name)``
            pairs; called once per bucket (see :mod:`decent_dp.optim`).
            Functions written for decent-dp 0.2.x, which take ``(name,
            parameter)`` pairs, are detected and work unchanged.
        lr_scheduler_fn: Builds an LR scheduler from an optimizer; stepped once
            per optimizer step. ``None`` keeps the learning rate constant.
        topology: A registered topology name or a :class:`Topology` instance.
        scaler: A ``torch.amp.GradScaler`` for fp16 training. An inf/NaN in any
            gradient of any worker skips the step (optimizer and scheduler) of
            every bucket of every worker, and the scale stays identical across
            workers. The parameters must not be fp16 themselves: keep them fp32
            and use ``torch.autocast``.
        grad_clip_norm: Clip the worker's global gradient norm (over all
            parameters, as ``clip_grad_norm_`` does) to this value; 0 disables.
        param_as_bucket_view: Make the parameters views into each bucket's
            contiguous block (saves a copy per step and enables flat kernels).
        sync_buffer_in_global_avg: Also average floating-point buffers in
            :meth:`global_avg` and :meth:`averaged`.
        bucket_size_in_mb: Target bucket size; 0 gives one bucket per parameter.
        local_world_size: Ranks per node, for hierarchical topologies; default
            from ``LOCAL_WORLD_SIZE``.
        topology_kwargs: Extra keyword arguments for a topology given by name.
        _local_world_size: decent-dp 0.2.x's name for ``local_world_size``.
        stable_param_storage: Update the parameters in place, so that their
            storage (``data_ptr()``) never changes, at two more passes over
            each bucket per step. For CUDA graphs (``torch.compile(...,
            mode="reduce-overhead")``) and code that keeps ``p.data``.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialized.
        ValueError: Unknown topology, a topology that does not fit the world
            size, a negative bucket size, fp16 parameters with a GradScaler, an
            ``optim_fn`` whose optimizer does not hold exactly the parameters it
            is given, or model shapes that differ across ranks.
        TypeError: ``optim_fn`` or ``lr_scheduler_fn`` returns the wrong type.

    Example::

        rank, world = decent_dp.utils.initialize_dist()
        with DecentralizedDataParallel(
            net.to(decent_dp.utils.get_device()),
            optim_fn=partial(optim_fn_adamw, lr=1e-3),
            lr_scheduler_fn=partial(lr_scheduler_fn_cosine_with_warmup, t_max=1000, t_warmup=50),
            topology="one-peer-exp",
        ) as model:
            for x, y in loader:
                loss_fn(model(x), y).backward()   # steps and gossips inside backward
    """

    def __init__(
        self,
        model: nn.Module,
        optim_fn: OptimFn,
        lr_scheduler_fn: LRSchedulerFn | None = None,
        topology: str | Topology = "complete",
        scaler: Any = None,
        grad_clip_norm: float = 0.0,
        param_as_bucket_view: bool = True,
        sync_buffer_in_global_avg: bool = False,
        bucket_size_in_mb: float = 25,
        local_world_size: int | None = None,
        topology_kwargs: dict[str, Any] | None = None,
        _local_world_size: int | None = None,
        stable_param_storage: bool = False,
    ):
        super().__init__()
        # every check that can differ between ranks' inputs runs before the first collective
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "DecentralizedDataParallel needs an initialized process group; launch with torchrun "
                "and call decent_dp.utils.initialize_dist() (or torch.distributed.init_process_group())"
            )
        if not isinstance(bucket_size_in_mb, (int, float)) or not bucket_size_in_mb >= 0:
            raise ValueError(
                f"bucket_size_in_mb={bucket_size_in_mb!r} is invalid; it must be a number >= 0"
            )
        if not isinstance(grad_clip_norm, (int, float)) or not grad_clip_norm >= 0:
            raise ValueError(
                f"grad_clip_norm={grad_clip_norm!r} is invalid; it must be >= 0 (0 disables)"
            )
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if local_world_size is None:
            local_world_size = _local_world_size
        self.module = model
        self._plain = _unwrap_compiled(model)
        self._rank = dist.get_rank()
        self._world_size = dist.get_world_size()
        self.topology = TopologyReg.create(
            topology, self._world_size, local_world_size, **(topology_kwargs or {})
        )
        if self.topology.world_size != self._world_size:
            raise ValueError(
                f"topology {self.topology!r} is built for world_size={self.topology.world_size}, "
                f"but the process group has {self._world_size} ranks"
            )
        self._lr_scheduler_fn = lr_scheduler_fn
        self._scaler = scaler
        self._grad_clip_norm = float(grad_clip_norm)
        self._as_view = bool(param_as_bucket_view)
        self._stable_storage = bool(stable_param_storage)
        self._sync_buffers = bool(sync_buffer_in_global_avg)
        self._bucket_bytes = int(bucket_size_in_mb * 1024 * 1024)

        every = list(self._plain.named_parameters())
        if not every:
            raise ValueError("model has no parameters; there is nothing to train")
        named = [(n, p) for n, p in every if p.requires_grad]
        if not named:
            raise ValueError("every parameter has requires_grad=False; there is nothing to train")
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        backend = dist.get_backend()
        for n, p in named:
            if backend == "nccl" and p.device.type != "cuda":
                raise ValueError(
                    f"parameter '{n}' is on {p.device} but the backend is nccl; move the model to "
                    "cuda:LOCAL_RANK before wrapping it, or use the gloo backend"
                )
            if p.dtype == torch.float16 and scaler is not None and scaler.is_enabled():
                raise ValueError(
                    f"parameter '{n}' is float16, which a GradScaler cannot unscale; keep the "
                    "parameters float32 and run the forward under torch.autocast(dtype=torch.float16)"
                )
        self._build_optim, trial = resolve_optim_fn(optim_fn, named)
        check_scheduler(lr_scheduler_fn, trial)
        self._initial_lr = float(trial.param_groups[0]["lr"])
        del trial

        self._check_ranks_agree(every)
        self._broadcast_from_rank0()
        self._res = _Resources()
        self._make_groups()

        self._device = self._params[0].device
        # bucket work runs beside the backward pass on CUDA (see _side)
        self._stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        self._buckets: list[Bucket] | None = None
        self._bucket_of: dict[int, tuple[Bucket, int]] = {}
        self._order: list[int] = []
        self._seen_first: list[bool] = [False] * len(self._params)
        self._step = 0
        self._accumulate = False
        self._bwd_active = False
        self._next_launch = 0
        self._ready: list[Bucket] = []  # complete, not yet stepped (their gossip is late)
        self._relaunch = False
        self._alpha = 1.0
        self._backup: tuple[int, list[torch.Tensor], list[Any]] | None = None
        self._comm_delay: CommDelayFn | None = None
        self._timers = SpanTimers(_TIMER_KEYS, self._device)
        self._closed = False
        me = weakref.ref(self)
        for i, p in enumerate(self._params):
            self._res.handles.append(p.register_post_accumulate_grad_hook(_grad_hook(me, i)))
        self._finalizer = weakref.finalize(self, self._res.release)
        # at interpreter exit the default group may already be gone; nothing is left to free
        self._finalizer.atexit = False

    # ------------------------------------------------------------------ setup
    def _check_ranks_agree(self, named: list[tuple[str, nn.Parameter]]) -> None:
        sig = {
            "params": [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in named],
            "topology": (self.topology.name, self.topology.world_size, self.topology.period),
        }
        gathered: list[Any] = [None] * self._world_size
        dist.all_gather_object(gathered, sig)
        ref = gathered[0]
        for r, other in enumerate(gathered):
            if other == ref:
                continue
            if other["topology"] != ref["topology"]:
                raise ValueError(
                    f"ranks disagree on the topology: rank 0 has {ref['topology']}, rank {r} has {other['topology']}"
                )
            a, b = ref["params"], other["params"]
            for i in range(max(len(a), len(b))):
                pa = a[i] if i < len(a) else None
                pb = b[i] if i < len(b) else None
                if pa != pb:
                    raise ValueError(
                        f"model parameters differ across ranks: rank 0 has {pa}, rank {r} has {pb} "
                        f"(parameter #{i}: name, shape, dtype, requires_grad); every rank must "
                        "build the same model"
                    )

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        if self._world_size == 1:
            return
        for t in list(self._plain.parameters()) + list(self._plain.buffers()):
            dist.broadcast(t.data, src=0)

    def _make_groups(self) -> None:
        """One process group per distinct multi-rank edge, created in the same order on every rank."""
        groups: dict[tuple[int, ...], Any] = {}
        full = tuple(range(self._world_size))
        for edges in self.topology.rounds:
            for edge in edges:
                key = tuple(sorted(edge.ranks))
                if len(key) < 2 or key in groups:
                    continue
                if key == full:
                    groups[key] = dist.group.WORLD
                else:
                    groups[key] = dist.new_group(list(key))
                    self._res.groups.append(groups[key])
        self._my_edges: list[Edge] = [
            self.topology.get_edge(r, self._rank) for r in range(self.topology.period)
        ]
        # kept beside the edges: the user's Topology object is not modified
        self._my_groups = [groups.get(tuple(sorted(e.ranks))) for e in self._my_edges]
        self._alone = Edge([self._rank], 1.0)

    def _build_buckets(self, layout: Sequence[Sequence[str]] | None = None) -> None:
        if layout is not None:
            pos = {n: i for i, n in enumerate(self._names)}
            unknown = [n for names in layout for n in names if n not in pos]
            if unknown or sorted(n for names in layout for n in names) != sorted(self._names):
                raise ValueError(
                    f"the saved bucket layout does not match this model's parameters (e.g. {unknown[:3]})"
                )
            groups = [[pos[n] for n in names] for names in layout]
        else:
            groups = self._plan_buckets()
        buckets = []
        for b, idx in enumerate(groups):
            params = [self._params[i] for i in idx]
            for p in params:
                if self._as_view and not is_dense(p):
                    p.data = p.data.contiguous()
            names = [self._names[i] for i in idx]
            bucket = Bucket(b, params, names, self._as_view)
            bucket.optimizer = self._build_optim(list(zip(names, params)))
            bucket.fused = prefer_fused(bucket.optimizer, bucket.device)
            if self._lr_scheduler_fn is not None:
                bucket.scheduler = self._lr_scheduler_fn(bucket.optimizer)
            for j, i in enumerate(idx):
                self._bucket_of[i] = (bucket, j)
            buckets.append(bucket)
        self._buckets = buckets
        self._res.buckets[:] = buckets
        if self._device.type == "cpu":
            # gradients are freed after each step and allocated again by the next backward
            keep_freed_memory(sum(p.numel() * p.element_size() for p in self._params))

    def _plan_buckets(self) -> list[list[int]]:
        """Parameter indices per bucket, in rank 0's gradient order, cut at the size target."""
        # the gradient order can differ between ranks (rank-dependent branches): use rank 0's
        shared: list[Any] = [self._order]
        if self._world_size > 1:
            dist.broadcast_object_list(shared, src=0)
        recorded = list(shared[0])
        seen = set(recorded)
        order = recorded + [i for i in reversed(range(len(self._params))) if i not in seen]
        groups: list[list[int]] = []
        current: list[int] = []
        size = 0
        for i in order:
            p = self._params[i]
            nbytes = p.numel() * p.element_size()
            if current:
                head = self._params[current[0]]
                if (
                    head.dtype != p.dtype
                    or head.device != p.device
                    or size + nbytes > self._bucket_bytes
                ):
                    groups.append(current)
                    current, size = [], 0
            current.append(i)
            size += nbytes
        if current:
            groups.append(current)
        return groups

    # --------------------------------------------------------------- backward
    @property
    def _deferred(self) -> bool:
        """Global-norm clipping and loss scaling need every gradient before any step."""
        return self._grad_clip_norm > 0 or (self._scaler is not None and self._scaler.is_enabled())

    def _side(self) -> contextlib.AbstractContextManager[Any]:
        """Bucket work runs on the side stream, after everything queued so far on the caller's."""
        if self._stream is None:
            return contextlib.nullcontext()
        self._stream.wait_stream(torch.cuda.current_stream(self._device))
        return torch.cuda.stream(self._stream)

    def _begin_backward(self) -> None:
        """Queue the end-of-backward work on the backward pass that is running now."""
        self._bwd_active = True
        if self._buckets is not None:
            for b in self._buckets:
                b.expected = sum(1 for p in b.params if p.requires_grad)
        torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)

    def _on_output_grad(self) -> None:
        # the forward's outputs get their gradient first, always in the outer backward; a
        # parameter's may come from a nested one (reentrant checkpointing), whose end is too early
        if not self._bwd_active:
            self._begin_backward()

    def _on_grad(self, index: int) -> None:
        if not self._bwd_active:
            self._begin_backward()  # a backward that did not pass through forward()'s outputs
        if self._buckets is None:
            if not self._seen_first[index]:
                self._seen_first[index] = True
                self._order.append(index)
            return
        bucket, j = self._bucket_of[index]
        if bucket.fired[j]:
            return
        bucket.fired[j] = True
        bucket.n_fired += 1
        if self._accumulate or self._deferred or bucket.stepped:
            return
        if bucket.n_fired >= bucket.expected:
            self._ready.append(bucket)
        if self._ready:
            self._step_ready()

    def _step_ready(self) -> None:
        """Step the complete buckets whose gossip has arrived; on CPU, leave the others for later.

        On CPU, waiting for a late neighbour blocks the thread that runs the
        backward pass; it computes the remaining gradients first instead, and
        the end of backward waits for what is still missing.
        """
        with self._side():
            for bucket in list(self._ready):
                if self._stream is None and not self._arrived(bucket):
                    continue
                self._ready.remove(bucket)
                self._step_bucket(bucket, skip_update=False)
            self._launch_in_order()

    def _arrived(self, bucket: Bucket) -> bool:
        if bucket.work is None:
            return True
        if self._comm_delay is not None and bucket.delay_left() > 0:
            return False
        return bool(bucket.work.is_completed())

    def _on_backward_end(self) -> None:
        self._bwd_active = False
        if self._buckets is None:
            if self._accumulate:
                return
            self._build_buckets()
        assert self._buckets is not None
        if self._accumulate:
            for b in self._buckets:
                b.reset_iteration()
            return
        skip = self._unscale_and_clip() if self._deferred else False
        self._finish_iteration(skip)

    def _finish_iteration(self, skip: bool) -> None:
        """Step what is left, launch every remaining gossip in order, and count the step."""
        assert self._buckets is not None
        with self._side():
            for b in self._buckets:
                if not b.stepped:
                    self._step_bucket(b, skip_update=skip)
            self._launch_in_order(force=True)
        if self._stream is not None:
            torch.cuda.current_stream(self._device).wait_stream(self._stream)
        for b in self._buckets:
            b.reset_iteration()
        self._ready.clear()
        self._next_launch = 0
        self._step += 1

    def _recover_failed_backward(self) -> None:
        """Complete an iteration whose backward raised, so that every rank stays in step.

        Buckets that had stepped keep their update and their launched gossip.
        The others drop their partial gradients and only mix (``d = 0``), so
        this rank issues the same collectives as a normal iteration. With loss
        scaling the rank reports an inf, so every worker skips that step.
        Under gradient accumulation the partial gradients stay accumulated.
        """
        self._bwd_active = False
        if self._buckets is None:
            return
        if self._accumulate:
            for b in self._buckets:
                b.reset_iteration()
            return
        # complete buckets left for their late gossip step as they would have in time
        with self._side():
            for b in self._ready:
                self._step_bucket(b, skip_update=False)
        self._ready.clear()
        for b in self._buckets:
            if not b.stepped:
                b.zero_grads()
        skip = self._unscale_and_clip(failed=True) if self._deferred else True
        self._finish_iteration(skip)

    @torch.no_grad()
    def _unscale_and_clip(self, failed: bool = False) -> bool:
        """Unscale (GradScaler) and clip the worker's global gradient norm; True skips the step."""
        assert self._buckets is not None
        grads = [g for b in self._buckets for g in b.grads()]
        skip = failed
        scaler = self._scaler
        if scaler is not None and scaler.is_enabled():
            scale = scaler._scale  # GradScaler keeps its scale as a 1-element tensor
            found = torch.full((1,), float(failed), dtype=torch.float32, device=scale.device)
            if grads:
                inv = scale.double().reciprocal().float().to(grads[0].device)
                for g in grads:
                    g.mul_(inv.to(g.dtype))
                found += (
                    torch.stack([(~torch.isfinite(g)).any() for g in grads])
                    .any()
                    .to(found.device, found.dtype)
                )
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
        if not skip and self._grad_clip_norm > 0 and grads:
            norms = torch.stack(
                [torch.linalg.vector_norm(g.detach(), dtype=torch.float64) for g in grads]
            )
            total = norms.norm()
            coef = torch.clamp(self._grad_clip_norm / (total + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef.to(g.dtype))
        return skip

    @torch.no_grad()
    def _wait(self, bucket: Bucket) -> None:
        if bucket.work is None:
            return
        t0 = self._timers.mark()
        bucket.work.wait()
        if self._comm_delay is not None:
            remaining = bucket.delay_left()
            if remaining > 0:
                time.sleep(remaining)
        bucket.work = None
        self._timers.add("comm/wait_s", t0, self._timers.mark())

    @torch.no_grad()
    def _step_bucket(self, bucket: Bucket, skip_update: bool) -> None:
        """x(t) = x(t-1) + a (W x(t-1) - x(t-1)) + d(t) for one bucket: wait, mix, step, apply.

        Two ways give the same x(t). Where ``d`` reads the parameters at most
        through weight decay of a known form, the mix is completed in the
        gossip buffer, which then becomes the parameter block, and the
        optimizer steps there with the decay applied at x(t-1) by hand: no
        pass over the bucket besides the launch copy. Otherwise the optimizer
        steps at x(t-1) and the correction W x(t-1) - x(t-1) is added after.
        """
        self._wait(bucket)
        t0 = self._timers.mark()
        pending = bucket.pending
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
            if (
                bucket.flat is not None
                and pre is None
                and post is None
                and not self._stable_storage
            ):
                plan = [] if skip_update else decay_plan(opt)
            if plan is None:
                self._mix_correction(bucket)  # comm := W x(t-1) - x(t-1)
            else:
                self._mix_in_place_of(bucket, plan)  # parameters := mixed x(t-1)
        t1 = self._timers.mark()
        if not skip_update:
            edge = pending[0] if pending is not None else self._alone
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
        t2 = self._timers.mark()
        if pending is not None and plan is None:
            for c, v in zip(bucket.comm_views, bucket.values()):
                v.add_(c, alpha=self._alpha)
        if not skip_update and post is not None:
            post()
        bucket.pending = None
        if self._stream is not None:
            for p in bucket.params:
                if p.grad is not None:
                    p.grad.record_stream(self._stream)  # made on the backward's stream
        bucket.zero_grads()
        bucket.stepped = True
        t3 = self._timers.mark()
        self._timers.add("comm/mix_s", t0, t1)
        self._timers.add("comm/optim_s", t1, t2)
        self._timers.add("comm/mix_s", t2, t3)

    def _mix_correction(self, bucket: Bucket) -> None:
        """Turn the received gossip in ``comm`` into ``W x(t-1) - x(t-1)``."""
        _, self_w, peer_w = bucket.pending
        # comm holds peer_w * sum_j x_j(t-1), own value included
        for c, v in zip(bucket.comm_views, bucket.values()):
            c.add_(v, alpha=self_w - peer_w - 1.0)

    def _mix_in_place_of(self, bucket: Bucket, plan: list[DecayFold]) -> None:
        """Make the parameters ``x(t-1) + a (W x(t-1) - x(t-1))``, this step's decay folded in.

        The decay the optimizer would compute from the parameters is computed
        here from x(t-1), before the parameters change: L2 terms go into the
        gradients, decoupled terms into the mixed value.
        """
        _, self_w, peer_w = bucket.pending
        a = self._alpha
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

    def _launch_in_order(self, force: bool = False) -> None:
        """Launch gossips in bucket order, so every rank issues its collectives in the same order."""
        assert self._buckets is not None
        while self._next_launch < len(self._buckets):
            b = self._buckets[self._next_launch]
            if not (b.stepped or force):
                return
            self._launch(b, self._step + 2)  # consumed by the next step; this one is _step + 1
            self._next_launch += 1

    @torch.no_grad()
    def _launch(self, bucket: Bucket, for_step: int) -> None:
        """Start the gossip whose result step ``for_step`` (1-based) mixes in."""
        round_index = (for_step - 1) % self.topology.period
        edge = self._my_edges[round_index]
        k = len(edge.ranks)
        if k == 1:
            bucket.pending = None  # a round alone costs nothing: no copy, no collective
            return
        t0 = self._timers.mark()
        peer_w = edge.peer_weight
        for c, v in zip(bucket.comm_views, bucket.values()):
            torch.mul(v, peer_w, out=c)  # copy and weight in one pass
        bucket.pending = (edge, edge.self_weight, peer_w)
        bucket.launch_t = time.perf_counter()
        if self._comm_delay is not None:
            bucket.delay_s = float(self._comm_delay(bucket.numel * bucket.comm.element_size(), k))
        group = self._my_groups[round_index]
        bucket.work = dist.all_reduce(bucket.comm, group=group, async_op=True)
        self._timers.add("comm/mix_s", t0, self._timers.mark())

    # ---------------------------------------------------------------- forward
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; parameters are exactly ``x(t-1)``."""
        self._pre_forward()
        out = self.module(*args, **kwargs)
        self._watch_outputs(out)
        return out

    @torch.compiler.disable
    def _pre_forward(self) -> None:
        if self._closed:
            raise RuntimeError("this DecentralizedDataParallel was closed; wrap the model again")
        if self._bwd_active and torch._C._current_autograd_node() is None:
            # a backward began and never finished: it raised
            self._recover_failed_backward()
        if self._relaunch and self._buckets is not None:
            self._relaunch = False
            for b in self._buckets:
                self._launch(b, self._step + 1)

    @torch.compiler.disable
    def _watch_outputs(self, out: Any) -> None:
        if not torch.is_grad_enabled():
            return
        me = weakref.ref(self)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(_output_hook(me))

    # ------------------------------------------------------- accumulation API
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients without stepping (gradient accumulation).

        Example::

            with model.no_sync():
                loss_fn(model(x1), y1).backward()
            loss_fn(model(x2), y2).backward()   # steps with the summed gradient
        """
        old = self._accumulate
        self._accumulate = True
        try:
            yield
        finally:
            self._accumulate = old

    def set_accumulate_grad(self, enable: bool = True) -> None:
        """Switch gradient accumulation on (no stepping) or off."""
        self._accumulate = bool(enable)

    def set_adaptive_factor(self, factor: float) -> None:
        """Set the mixing step size ``a`` of ``x(t) = (1-a) x(t-1) + a W x(t-1) + d(t)``.

        ``a = 1`` (the default) is plain gossip, ``a = 0`` local training.

        Raises:
            ValueError: ``factor`` is not a number in ``[0, 1]``.
        """
        if not isinstance(factor, (int, float)) or not 0.0 <= float(factor) <= 1.0:
            raise ValueError(f"adaptive factor {factor!r} is invalid; it must be in [0, 1]")
        self._alpha = float(factor)

    # ------------------------------------------------------------ averaging
    def _drain(self) -> None:
        """Finish in-flight gossip (the results stay pending for the next step)."""
        for b in self._buckets or []:
            self._wait(b)

    def _all_values(self) -> list[torch.Tensor]:
        if self._buckets is not None:
            return [v for b in self._buckets for v in b.values()]
        return [p.data for p in self._params]

    def _average_targets(self) -> list[torch.Tensor]:
        """What global_avg() and averaged() average: parameters, and float buffers if enabled."""
        buffers = (
            [b for b in self._plain.buffers() if b.is_floating_point()]
            if self._sync_buffers
            else []
        )
        return self._all_values() + buffers

    def _forget_gossip(self) -> list[Any]:
        """Drop the (drained) gossip results, so the next step mixes the identity; return them."""
        dropped = [b.pending for b in self._buckets or []]
        for b in self._buckets or []:
            b.pending = None
        return dropped

    @torch.no_grad()
    def _average_in_place(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            dist.all_reduce(t)
            t.div_(self._world_size)

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
        self._drain()
        targets = self._average_targets()
        saved = [t.clone() for t in targets] if (will_revert or return_d2c) else []
        self._average_in_place(targets)
        dropped = self._forget_gossip()
        self._relaunch = False
        self._backup = (self._step, saved, dropped) if will_revert else None
        if not return_d2c:
            return None
        n = len(self._all_values())
        sq = sum((t.double() - s.double()).pow(2).sum() for t, s in zip(targets[:n], saved[:n]))
        return float(torch.as_tensor(sq).sqrt().item())

    @torch.no_grad()
    def revert_global_avg(self) -> None:
        """Restore the values saved by the last ``global_avg(will_revert=True)``.

        Called before any further step, the gossip that was set aside is
        restored too, so training continues as if nothing happened.

        Raises:
            RuntimeError: There is nothing to revert.
        """
        if self._backup is None:
            raise RuntimeError("no global average to revert; call global_avg(will_revert=True)")
        step, saved, dropped = self._backup
        self._drain()
        for t, s in zip(self._average_targets(), saved):
            t.copy_(s)
        if step == self._step:
            for b, pending in zip(self._buckets or [], dropped):
                b.pending = pending
        self._backup = None

    @contextlib.contextmanager
    def averaged(self) -> Iterator[nn.Module]:
        """Swap in the global mean model (e.g. for evaluation); restore on exit.

        Example::

            with model.averaged():
                acc = evaluate(model)
        """
        self._drain()
        targets = self._average_targets()
        with torch.no_grad():
            saved = [t.clone() for t in targets]
        self._average_in_place(targets)
        try:
            yield self.module
        finally:
            with torch.no_grad():
                for t, s in zip(targets, saved):
                    t.copy_(s)

    @torch.no_grad()
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
        self._drain()
        values = self._all_values()
        device = values[0].device
        if sketch is None:
            local = torch.zeros(1, dtype=torch.float64, device=device)
            for v in values:
                mean = v.clone()
                dist.all_reduce(mean)
                mean.div_(self._world_size)
                local += (v.double() - mean.double()).pow(2).sum()
        else:
            y = count_sketch(values, int(sketch), seed=self._step)
            ybar = y.clone()
            dist.all_reduce(ybar)
            ybar.div_(self._world_size)
            local = (y - ybar).pow(2).sum().reshape(1)
        dist.all_reduce(local)
        return float(local.item()) / self._world_size

    # ---------------------------------------------------------- checkpoints
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's state dict, with its own keys (no wrapper or compile prefix).

        ``torch.compile(wrapper).state_dict()`` gives the same keys, so that a
        checkpoint loads into compiled and eager runs alike.
        """
        if kwargs.get("prefix") == "_orig_mod.":
            kwargs["prefix"] = ""  # called by torch.compile's wrapper around this one
        return self._plain.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load into the wrapped module in place; gossip restarts from the loaded values."""
        if assign:
            raise ValueError(
                "assign=True would detach parameters from their buckets; use assign=False"
            )
        self._drain()
        result = self._plain.load_state_dict(state_dict, strict=strict)
        if self._buckets is not None:
            self._forget_gossip()
            self._relaunch = self._step > 0
        return result

    def training_state_dict(self) -> dict[str, Any]:
        """Per-bucket optimizer and scheduler states, the step counter, the scaler and the bucket layout."""
        state: dict[str, Any] = {
            "step": self._step,
            "topology": self.topology.name,
            "world_size": self._world_size,
            "layout": None,
            "optimizers": [],
            "schedulers": [],
            "scaler": self._scaler.state_dict() if self._scaler is not None else None,
        }
        if self._buckets is not None:
            state["layout"] = [list(b.names) for b in self._buckets]
            state["optimizers"] = [
                b.optimizer.state_dict() for b in self._buckets if b.optimizer is not None
            ]
            state["schedulers"] = [
                b.scheduler.state_dict() if b.scheduler is not None else None for b in self._buckets
            ]
        return state

    def load_training_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`training_state_dict`; load the model's ``state_dict`` too.

        The gossip that was in flight when the state was saved is relaunched
        from the current parameters before the next forward pass, so a resumed
        run repeats an uninterrupted one exactly.

        Raises:
            ValueError: The state was saved with another world size or topology.
        """
        if (
            state.get("world_size") != self._world_size
            or state.get("topology") != self.topology.name
        ):
            raise ValueError(
                f"training state was saved with world_size={state.get('world_size')} "
                f"topology={state.get('topology')}; this run has world_size={self._world_size} "
                f"topology={self.topology.name}"
            )
        self._drain()
        layout = state.get("layout")
        if layout is not None:
            if self._buckets is None:
                self._build_buckets(layout)
            elif [list(b.names) for b in self._buckets] != [list(n) for n in layout]:
                raise ValueError(
                    "the saved bucket layout differs from this wrapper's; use the same model and bucket_size_in_mb"
                )
            assert self._buckets is not None
            for b, opt_state, sched_state in zip(
                self._buckets, state["optimizers"], state["schedulers"]
            ):
                assert b.optimizer is not None
                b.optimizer.load_state_dict(opt_state)
                if b.fused:
                    restore_fused(b.optimizer)  # the loaded groups carry their own flags
                if b.scheduler is not None and sched_state is not None:
                    b.scheduler.load_state_dict(sched_state)
            self._forget_gossip()
        if self._scaler is not None and state.get("scaler") is not None:
            self._scaler.load_state_dict(state["scaler"])
        self._step = int(state["step"])
        self._relaunch = self._step > 0 and self._buckets is not None

    # ------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Finish in-flight gossip, remove the hooks and destroy the wrapper's process groups.

        Idempotent. The parameters keep their current values and stay usable as
        a plain module; this wrapper cannot train any more. Dropping the last
        reference to a wrapper releases the same resources.
        """
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> DecentralizedDataParallel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------- utilities
    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # .to()/.cuda()/.double() would replace the parameters' storage and detach them from
        # their buckets, so that the optimizer and the gossip would update stale copies
        if self._buckets is not None:
            raise RuntimeError(
                "DecentralizedDataParallel cannot move or cast the model after the first backward "
                "pass; place the model on its device and dtype before wrapping it"
            )
        return super()._apply(fn, *args, **kwargs)

    @property
    def step_count(self) -> int:
        """Number of optimizer steps taken."""
        return self._step

    def current_lr(self) -> float:
        """The learning rate of the first parameter group now in use."""
        if self._buckets and self._buckets[0].optimizer is not None:
            return float(self._buckets[0].optimizer.param_groups[0]["lr"])
        return self._initial_lr

    def get_lr(self) -> float:
        """decent-dp 0.2.x's name for :meth:`current_lr`."""
        return self.current_lr()

    def pop_timers(self) -> dict[str, float]:
        """Seconds spent since the last call: waiting for gossip, mixing, and in the optimizer.

        On CUDA these are device times measured with events on the stream that
        does the bucket work; reading them synchronizes with those events.
        """
        return self._timers.pop()

    def set_comm_delay(self, fn: CommDelayFn | None) -> None:
        """Hold each gossip's completion until ``fn(nbytes, group_size)`` seconds after launch.

        A network-emulation hook, off (``None``) by default and free when off.
        """
        self._comm_delay = fn

    @property
    def buckets_info(self) -> list[dict[str, Any]]:
        """Name list, element count (padding included) and dtype of each bucket (empty before the first backward)."""
        return [
            {"names": list(b.names), "numel": b.numel, "dtype": str(b.dtype)}
            for b in (self._buckets or [])
        ]

    def extra_repr(self) -> str:
        return f"topology={self.topology.name}, world_size={self._world_size}, step={self._step}"


def _grad_hook(
    ref: weakref.ReferenceType[DecentralizedDataParallel], index: int
) -> Callable[[torch.Tensor], None]:
    """A post-accumulate-grad hook that holds its wrapper weakly (it lives on the parameter)."""

    def hook(param: torch.Tensor) -> None:
        owner = ref()
        if owner is not None:
            owner._on_grad(index)

    return hook


def _output_hook(
    ref: weakref.ReferenceType[DecentralizedDataParallel],
) -> Callable[[torch.Tensor], None]:
    def hook(grad: torch.Tensor) -> None:
        owner = ref()
        if owner is not None:
            owner._on_output_grad()

    return hook
