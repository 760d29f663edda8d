"""DecentralizedDataParallel: the optimizer fused into backward, with overlapped gossip.

Worker ``i`` at iteration ``t`` computes::

    x_i(t) = sum_j W_ij(t) x_j(t-1) + d_i(t)

where ``d_i(t)`` is the local optimizer update computed from the gradient at
``x_i(t-1)`` on the worker's own batch and ``W(t)`` is the mixing matrix of the
topology's round ``(t-1) mod period``. The gossip of ``x(t-1)`` is launched
asynchronously right after step ``t-1`` and completes while iteration ``t``
runs its forward and backward pass; the local update never waits for the
neighbours' models of the same iteration.

Parameters are cut into buckets in the order their gradients become ready
(recorded on the first backward). Each bucket owns a contiguous block of
parameters (the parameters are views into it), a gradient block, one
communication block, and its own optimizer and LR scheduler. When a bucket's
last gradient arrives, a post-accumulate-grad hook waits for that bucket's
previous gossip, mixes, steps the optimizer and scheduler, and launches the
next gossip. Buckets not complete when backward ends (parameters without a
gradient this iteration) are stepped from a callback at the end of backward,
so every bucket is stepped and gossiped exactly once per iteration.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from .metrics import count_sketch
from .topo import Edge, Topology, TopologyReg

__all__ = ["DecentralizedDataParallel", "OptimFn", "LRSchedulerFn", "CommDelayFn"]

OptimFn = Callable[[list[tuple[torch.Tensor, str]]], Optimizer]
LRSchedulerFn = Callable[[Optimizer], Any]
CommDelayFn = Callable[[int, int], float]

_TIMER_KEYS = ("comm/wait_s", "comm/mix_s", "comm/optim_s")


def _flat_view(buf: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A view of ``buf[offset:offset+numel]`` with ``like``'s shape and strides."""
    n = like.numel()
    if like.is_contiguous():
        return buf[offset : offset + n].view(like.shape)
    # channels_last and other dense permuted layouts keep their strides
    return buf.as_strided(like.shape, like.stride(), buf.storage_offset() + offset)


def _is_dense(t: torch.Tensor) -> bool:
    if t.is_contiguous():
        return True
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return True
    return t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)


class _Bucket:
    """A block of parameters that is stepped and gossiped as one unit."""

    def __init__(self, index: int, params: list[nn.Parameter], names: list[str], as_view: bool):
        self.index = index
        self.params = params
        self.names = names
        self.as_view = as_view
        ref = params[0]
        self.dtype, self.device = ref.dtype, ref.device
        self.numel = sum(p.numel() for p in params)
        self.offsets: list[int] = []
        off = 0
        for p in params:
            self.offsets.append(off)
            off += p.numel()
        self.comm = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        self.flat: torch.Tensor | None = None
        self.grad_flat: torch.Tensor | None = None
        self.grad_views: list[torch.Tensor] = []
        if as_view:
            self.flat = torch.empty(self.numel, dtype=self.dtype, device=self.device)
            self.grad_flat = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
            with torch.no_grad():
                for p, off in zip(params, self.offsets):
                    view = _flat_view(self.flat, off, p)
                    view.copy_(p.data)
                    p.data = view
                    gview = _flat_view(self.grad_flat, off, p)
                    if p.grad is not None:
                        gview.copy_(p.grad)
                    p.grad = gview
                    self.grad_views.append(gview)
            self.comm_views = [self.comm]
        else:
            self.comm_views = [
                self.comm[o : o + p.numel()].view(p.shape) for p, o in zip(params, self.offsets)
            ]
        self.optimizer: Optimizer | None = None
        self.scheduler: Any = None
        # gossip state: the work handle and the mixing weights of the value in `comm`
        self.work: Any = None
        self.pending: tuple[float, float] | None = None
        self.launch_t = 0.0
        self.delay_s = 0.0
        # per-iteration state
        self.fired = [False] * len(params)  # a gradient arrived in the current backward pass
        self.used = [False] * len(params)  # a gradient arrived since the last step
        self.expected = 0
        self.n_fired = 0
        self.stepped = False

    def values(self) -> list[torch.Tensor]:
        """The parameter storage: one flat block, or the parameters themselves."""
        return [self.flat] if self.flat is not None else [p.data for p in self.params]

    def grads(self) -> list[torch.Tensor]:
        if self.grad_flat is not None:
            return [self.grad_flat]
        return [p.grad for p in self.params if p.grad is not None]

    def reset_iteration(self) -> None:
        self.fired = [False] * len(self.params)
        self.n_fired = 0
        self.stepped = False


class DecentralizedDataParallel(nn.Module):
    """Decentralized data parallel wrapper with the optimizer fused into backward.

    Each worker keeps its own model; after every local optimizer step it
    averages with the neighbours the topology names for that step. The
    optimizer and LR scheduler step *inside* ``loss.backward()``, bucket by
    bucket, so a training loop is just forward plus backward.

    Args:
        model: The module to train, already on its device.
        optim_fn: Builds an optimizer from a list of ``(parameter, name)``
            pairs; called once per bucket (see :mod:`decent_dp.optim`).
        lr_scheduler_fn: Builds an LR scheduler from an optimizer; stepped once
            per optimizer step. ``None`` keeps the learning rate constant.
        topology: A registered topology name or a :class:`Topology` instance.
        scaler: A ``torch.amp.GradScaler`` for fp16 training. An inf/NaN in any
            gradient of any worker skips the step of every bucket of every
            worker, and the scale stays identical across workers.
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

    Raises:
        RuntimeError: ``torch.distributed`` is not initialized.
        ValueError: Unknown topology, a topology that does not fit the world
            size, a negative bucket size, or model shapes that differ across ranks.
        TypeError: ``optim_fn`` or ``lr_scheduler_fn`` returns the wrong type.

    Example::

        rank, world = decent_dp.utils.initialize_dist()
        model = DecentralizedDataParallel(
            net.to(decent_dp.utils.get_device()),
            optim_fn=partial(optim_fn_adamw, lr=1e-3),
            lr_scheduler_fn=partial(lr_scheduler_fn_cosine_with_warmup, t_max=1000, t_warmup=50),
            topology="one-peer-exp",
        )
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
        self.module = model
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
        self._optim_fn = optim_fn
        self._lr_scheduler_fn = lr_scheduler_fn
        self._scaler = scaler
        self._grad_clip_norm = float(grad_clip_norm)
        self._as_view = bool(param_as_bucket_view)
        self._sync_buffers = bool(sync_buffer_in_global_avg)
        self._bucket_bytes = int(bucket_size_in_mb * 1024 * 1024)

        named = [(n, p) for n, p in model.named_parameters()]
        if not named:
            raise ValueError("model has no parameters; there is nothing to train")
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._index = {id(p): i for i, p in enumerate(self._params)}
        backend = dist.get_backend()
        for n, p in named:
            if backend == "nccl" and p.device.type != "cuda":
                raise ValueError(
                    f"parameter '{n}' is on {p.device} but the backend is nccl; move the model to "
                    "cuda:LOCAL_RANK before wrapping it, or use the gloo backend"
                )
        self._initial_lr = self._check_factories(named)

        self._check_ranks_agree(named)
        self._broadcast_from_rank0()
        self._groups = self._make_groups()

        self._buckets: list[_Bucket] | None = None
        self._bucket_of: dict[int, tuple[_Bucket, int]] = {}
        self._order: list[int] = []
        self._seen_first: list[bool] = [False] * len(self._params)
        self._hooks: dict[int, Any] = {}
        self._step = 0
        self._accumulate = False
        self._in_backward = False
        self._next_launch = 0
        self._relaunch = False
        self._comm_delay: CommDelayFn | None = None
        self._timers = dict.fromkeys(_TIMER_KEYS, 0.0)
        self._refresh_hooks()

    # ------------------------------------------------------------------ setup
    def _check_factories(self, named: list[tuple[str, nn.Parameter]]) -> float:
        """Build a throwaway optimizer/scheduler to reject bad factories up front."""
        opt = self._optim_fn([(p, n) for n, p in named])
        if not isinstance(opt, Optimizer):
            raise TypeError(
                f"optim_fn returned {type(opt).__name__}; it must return a torch.optim.Optimizer"
            )
        if self._lr_scheduler_fn is not None:
            sched = self._lr_scheduler_fn(opt)
            if not callable(getattr(sched, "step", None)) or not hasattr(sched, "state_dict"):
                raise TypeError(
                    f"lr_scheduler_fn returned {type(sched).__name__}; it must return an LR scheduler "
                    "with step() and state_dict()"
                )
        return float(opt.param_groups[0]["lr"])

    def _check_ranks_agree(self, named: list[tuple[str, nn.Parameter]]) -> None:
        sig = {
            "params": [(n, tuple(p.shape), str(p.dtype)) for n, p in named],
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
                        f"(parameter #{i}); every rank must build the same model"
                    )

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        if self._world_size == 1:
            return
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            dist.broadcast(t.data, src=0)

    def _make_groups(self) -> dict[tuple[int, ...], Any]:
        """One process group per distinct multi-rank edge, created in the same order on every rank."""
        groups: dict[tuple[int, ...], Any] = {}
        full = tuple(range(self._world_size))
        for edges in self.topology.rounds:
            for edge in edges:
                key = tuple(sorted(edge.ranks))
                if len(key) < 2 or key in groups:
                    continue
                groups[key] = dist.group.WORLD if key == full else dist.new_group(list(key))
        self._my_edges: list[Edge] = [
            self.topology.get_edge(r, self._rank) for r in range(self.topology.period)
        ]
        # kept beside the edges: the user's Topology object is not modified
        self._my_groups = [groups.get(tuple(sorted(e.ranks))) for e in self._my_edges]
        return groups

    def _refresh_hooks(self) -> None:
        for i, p in enumerate(self._params):
            if p.requires_grad and i not in self._hooks:
                self._hooks[i] = p.register_post_accumulate_grad_hook(self._make_hook(i))

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            self._on_grad(index)

        return hook

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
            # the gradient order can differ between ranks (rank-dependent branches): use rank 0's
            shared: list[Any] = [self._order]
            if self._world_size > 1:
                dist.broadcast_object_list(shared, src=0)
            recorded = list(shared[0])
            rest = [i for i in reversed(range(len(self._params))) if i not in set(recorded)]
            order = recorded + rest
            groups = []
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
        buckets = []
        for b, idx in enumerate(groups):
            params = [self._params[i] for i in idx]
            for p in params:
                if self._as_view and not _is_dense(p):
                    p.data = p.data.contiguous()
            bucket = _Bucket(b, params, [self._names[i] for i in idx], self._as_view)
            bucket.optimizer = self._optim_fn([(p, self._names[i]) for p, i in zip(params, idx)])
            if self._lr_scheduler_fn is not None:
                bucket.scheduler = self._lr_scheduler_fn(bucket.optimizer)
            for j, i in enumerate(idx):
                self._bucket_of[i] = (bucket, j)
                bucket.used[j] = self._seen_first[i]
            buckets.append(bucket)
        self._buckets = buckets

    # --------------------------------------------------------------- backward
    @property
    def _deferred(self) -> bool:
        """Global-norm clipping and loss scaling need every gradient before any step."""
        return self._grad_clip_norm > 0 or (self._scaler is not None and self._scaler.is_enabled())

    def _on_grad(self, index: int) -> None:
        if not self._in_backward:
            self._in_backward = True
            if self._buckets is not None:
                for b in self._buckets:
                    b.expected = sum(1 for p in b.params if p.requires_grad)
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
        if self._buckets is None:
            if not self._seen_first[index]:
                self._seen_first[index] = True
                self._order.append(index)
            return
        bucket, j = self._bucket_of[index]
        p = bucket.params[j]
        if (
            bucket.grad_flat is not None
            and p.grad is not None
            and p.grad.data_ptr() != bucket.grad_views[j].data_ptr()
        ):
            # the gradient was replaced (e.g. zero_grad(set_to_none=True)); fold it back into the bucket
            bucket.grad_views[j].copy_(p.grad)
            p.grad = bucket.grad_views[j]
        bucket.used[j] = True
        if bucket.fired[j]:
            return
        bucket.fired[j] = True
        bucket.n_fired += 1
        if self._accumulate or self._deferred or bucket.stepped:
            return
        if bucket.n_fired >= bucket.expected:
            self._step_bucket(bucket, skip_update=False)
            self._launch_in_order()

    def _on_backward_end(self) -> None:
        self._in_backward = False
        if self._buckets is None:
            if self._accumulate:
                return
            self._build_buckets()
        assert self._buckets is not None
        if self._accumulate:
            for b in self._buckets:
                b.reset_iteration()
            return
        skip = False
        if self._deferred:
            skip = self._unscale_and_clip()
        for b in self._buckets:
            if not b.stepped:
                self._step_bucket(b, skip_update=skip)
        self._launch_in_order(force=True)
        for b in self._buckets:
            b.reset_iteration()
        self._next_launch = 0
        self._step += 1

    @torch.no_grad()
    def _unscale_and_clip(self) -> bool:
        """Unscale (GradScaler) and clip the worker's global gradient norm; True skips the step."""
        assert self._buckets is not None
        grads = [g for b in self._buckets for g in b.grads()]
        skip = False
        scaler = self._scaler
        if scaler is not None and scaler.is_enabled():
            scale = scaler._scale  # GradScaler keeps its scale as a 1-element tensor
            inv = scale.double().reciprocal().float().to(grads[0].device) if grads else None
            found = torch.zeros(1, dtype=torch.float32, device=scale.device)
            for g in grads:
                g.mul_(inv.to(g.dtype) if inv is not None else 1.0)
                found += (~torch.isfinite(g)).any().to(found.dtype).to(found.device)
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
            skip = bool(found.item() > 0)
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
    def _wait(self, bucket: _Bucket) -> None:
        if bucket.work is None:
            return
        t0 = time.perf_counter()
        bucket.work.wait()
        if self._comm_delay is not None:
            remaining = bucket.launch_t + bucket.delay_s - time.perf_counter()
            if remaining > 0:
                time.sleep(remaining)
        bucket.work = None
        self._timers["comm/wait_s"] += time.perf_counter() - t0

    @torch.no_grad()
    def _step_bucket(self, bucket: _Bucket, skip_update: bool) -> None:
        """x(t) = W x(t-1) + d(t) for one bucket: wait, mix, local step, apply."""
        self._wait(bucket)
        t0 = time.perf_counter()
        mixing = bucket.pending is not None
        if mixing:
            self_w, peer_w = bucket.pending  # type: ignore[misc]
            # comm holds peer_w * sum_j x_j; turn it into W x(t-1) - x_i(t-1)
            for c, v in zip(bucket.comm_views, bucket.values()):
                c.add_(v, alpha=self_w - peer_w - 1.0)
        t1 = time.perf_counter()
        if not skip_update:
            assert bucket.optimizer is not None
            hidden = [j for j in range(len(bucket.params)) if not bucket.used[j]]
            for j in hidden:
                bucket.params[
                    j
                ].grad = None  # skipped by the optimizer, as with zero_grad(set_to_none)
            bucket.optimizer.step()
            if bucket.scheduler is not None:
                bucket.scheduler.step()
            for j in hidden:
                if bucket.grad_flat is not None:
                    bucket.params[j].grad = bucket.grad_views[j]
        t2 = time.perf_counter()
        if mixing:
            for c, v in zip(bucket.comm_views, bucket.values()):
                v.add_(c)
        bucket.pending = None
        if bucket.grad_flat is not None:
            bucket.grad_flat.zero_()
        else:
            for p in bucket.params:
                p.grad = None
        bucket.used = [False] * len(bucket.params)
        bucket.stepped = True
        t3 = time.perf_counter()
        self._timers["comm/mix_s"] += (t1 - t0) + (t3 - t2)
        self._timers["comm/optim_s"] += t2 - t1

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
    def _launch(self, bucket: _Bucket, for_step: int) -> None:
        """Start the gossip whose result step ``for_step`` (1-based) mixes in."""
        round_index = (for_step - 1) % self.topology.period
        edge = self._my_edges[round_index]
        k = len(edge.ranks)
        if k == 1:
            bucket.pending = None
            return
        t0 = time.perf_counter()
        peer_w = edge.peer_weight
        for c, v in zip(bucket.comm_views, bucket.values()):
            torch.mul(v, peer_w, out=c)  # copy and weight in one pass
        bucket.pending = (edge.self_weight, peer_w)
        bucket.launch_t = time.perf_counter()
        if self._comm_delay is not None:
            bucket.delay_s = float(self._comm_delay(bucket.numel * bucket.comm.element_size(), k))
        group = self._my_groups[round_index]
        bucket.work = dist.all_reduce(bucket.comm, group=group, async_op=True)
        self._timers["comm/mix_s"] += time.perf_counter() - t0

    # ---------------------------------------------------------------- forward
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; parameters are exactly ``x(t-1)``."""
        if self._relaunch and self._buckets is not None:
            self._relaunch = False
            for b in self._buckets:
                self._launch(b, self._step + 1)
        self._refresh_hooks()
        return self.module(*args, **kwargs)

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
            [b for b in self.module.buffers() if b.is_floating_point()]
            if self._sync_buffers
            else []
        )
        return self._all_values() + buffers

    def _forget_gossip(self) -> None:
        """Drop the (drained) gossip results: the next step mixes the identity."""
        for b in self._buckets or []:
            b.pending = None

    @torch.no_grad()
    def _average_in_place(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            dist.all_reduce(t)
            t.div_(self._world_size)

    @torch.no_grad()
    def global_avg(self) -> None:
        """Replace every worker's parameters (and float buffers, if enabled) by the global mean.

        Gossip in flight is drained and discarded: all workers are identical
        afterwards, so the next step mixes the identity.
        """
        self._drain()
        targets = self._average_targets()
        self._average_in_place(targets)
        self._forget_gossip()
        self._relaunch = False

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
        """The wrapped module's state dict, with its own keys (no wrapper prefix)."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load into the wrapped module in place; gossip restarts from the loaded values."""
        if assign:
            raise ValueError(
                "assign=True would detach parameters from their buckets; use assign=False"
            )
        self._drain()
        result = self.module.load_state_dict(state_dict, strict=strict)
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
                if b.scheduler is not None and sched_state is not None:
                    b.scheduler.load_state_dict(sched_state)
            self._forget_gossip()
        if self._scaler is not None and state.get("scaler") is not None:
            self._scaler.load_state_dict(state["scaler"])
        self._step = int(state["step"])
        self._relaunch = self._step > 0 and self._buckets is not None

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

    def pop_timers(self) -> dict[str, float]:
        """Seconds spent since the last call: waiting for gossip, mixing, and in the optimizer.

        On CUDA the wait is the host-side time only (the device waits on a stream).
        """
        out = dict(self._timers)
        self._timers = dict.fromkeys(_TIMER_KEYS, 0.0)
        return out

    def set_comm_delay(self, fn: CommDelayFn | None) -> None:
        """Hold each gossip's completion until ``fn(nbytes, group_size)`` seconds after launch.

        A network-emulation hook, off (``None``) by default and free when off.
        """
        self._comm_delay = fn

    @property
    def buckets_info(self) -> list[dict[str, Any]]:
        """Name list, element count and dtype of each bucket (empty before the first backward)."""
        return [
            {"names": list(b.names), "numel": b.numel, "dtype": str(b.dtype)}
            for b in (self._buckets or [])
        ]

    def extra_repr(self) -> str:
        return f"topology={self.topology.name}, world_size={self._world_size}, step={self._step}"
