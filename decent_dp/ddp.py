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

This module is the public face: construction and its checks, averaging, state
dicts and the names decent-dp 0.2.x scripts use. The per-iteration work
(buckets, gradient hooks, stepping, gossip in flight) is done by
:class:`decent_dp._engine.engine.Engine`, which the wrapper owns.

The public methods are grouped by concern: averaging
(:class:`decent_dp._engine.averaging.AveragingMixin`), state dicts
(:class:`decent_dp._engine.state.StateDictMixin`), the communication report
(:class:`decent_dp._engine.comm_report.CommReportMixin`) and decent-dp 0.2.x's
per-bucket names (:class:`decent_dp._engine.legacy.LegacyMixin`) each live beside
the code they call; this module holds construction and the rest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from ._comm.hierarchical import check_compression
from ._engine.averaging import AveragingMixin, GlobalAverager
from ._engine.bucket import Bucket
from ._engine.comm_report import CommReportMixin
from ._engine.device import (
    check_cuda_placement,
    device_guard,
    warn_cuda_graphs_without_stable_storage,
)
from ._engine.engine import Engine
from ._engine.legacy import LegacyMixin
from ._engine.outer import OuterOptimFn, OuterOptimizer, check_outer_args
from ._engine.setup import (
    broadcast_from_rank0,
    check_ranks_agree,
    check_wrapper_args,
    trained_parameters,
)
from ._engine.state import StateDictMixin
from ._engine.state_sync import StateSync
from .compression import CompressionSpec, parse_compression
from .optim._factories import check_scheduler, resolve_optim_fn
from .optim.state_sync import check_state_sync
from .sharded._wrapper import build_sharded
from .topo import Topology, TopologyReg, hierarchical_keys
from .utils import unwrap_compiled

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
# fn(nbytes, group_size) or fn(nbytes, group_size, ranks=...): seconds to hold a gossip
CommDelayFn = Callable[..., float]
# the names decent-dp 0.2.x scripts import
OPTIM_FN_TYPE = OptimFn
LR_SCHEDULER_FN_TYPE = LRSchedulerFn


_unwrap_compiled = unwrap_compiled  # this module's name for it before it was public


class DecentralizedDataParallel(
    AveragingMixin, StateDictMixin, CommReportMixin, LegacyMixin, nn.Module
):
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
        compression: ``None``/``"none"`` (exact), ``"bf16"``, ``"int8"``, ``"randk"``
            or ``"randk:<ratio>"`` (0.1 by default): each group exchanges compressed
            deviations from a reference its members share (:mod:`decent_dp._comm.compressed`).
        outer_optim_fn: Builds the outer optimizer (DiLoCo, SlowMo) over one
            bucket's outer copy ``x_outer`` (a list of tensors), e.g.
            ``partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)``.
            At each step ``t`` with ``t % outer_every == 0`` the gossip is one
            all-reduce of all ranks, giving ``xbar(t-1)``; ``x_outer`` steps
            with the gradient ``x_outer - xbar(t-1)`` and
            ``x(t) = x_outer + d(t)`` (see :mod:`decent_dp._engine.outer`).
        outer_every: ``H``, an int >= 1, given exactly when ``outer_optim_fn`` is.
        outer_fragments: ``F``, a divisor of ``outer_every`` (1 by default: every
            bucket at once). Streaming outer rounds: bucket ``b`` (in bucket order)
            belongs to fragment ``b % F``, whose outer rounds and topology rounds are
            shifted by ``(b % F) * H / F`` steps, so that each step all-reduces about
            ``1/F`` of the model instead of every ``H``-th step all of it. Fragments
            without a bucket (``F`` above the number of buckets) are allowed and
            never communicate; a warning says so when the buckets are built.
        outer_compression: ``None``/``"none"`` (the exact all-reduce), ``"bf16"`` or
            ``"int8"``: an outer round sends each rank's ``Delta_i = x_outer - x_i(t-1)``
            compressed, sums the decoded values in a fixed order (two phases for
            more than two ranks) and steps ``x_outer`` on their mean, the same bits
            on every rank; the workers continue from ``x_outer + d(t)`` as without
            it. No error feedback is kept (see :mod:`decent_dp._engine.outer`).
        outer_scale_by_inner_lr: SlowMo's own update (``False`` by default): the outer
            gradient is ``Delta / gamma_t`` and the outer optimizer's learning rate is
            multiplied by ``gamma_t``, the inner optimizer's learning rate at the outer
            step; the same as without it under a constant inner rate.
        state_sync: Optimizer states gossiped with the parameters, ``{name: K}``
            (``None`` by default), e.g. ``{"exp_avg_sq": 1}``: every ``K``-th step each
            bucket's gossip also carries those state tensors of its parameters, on the
            same group, and the optimizer steps from ``sum_j W_ij s_j(t-1)``. With
            ``complete`` the state is averaged over every rank. The bytes count in
            :meth:`comm_bytes_per_step`; not with an outer optimizer or ``hierarchical``
            (see :mod:`decent_dp._engine.state_sync`).
        device_mesh: A 2-D ``torch.distributed.device_mesh.DeviceMesh`` with dimensions
            ``("replicate", "shard")`` for a model too large for one worker: the model is
            ``fully_shard``-ed over ``device_mesh["shard"]`` before wrapping, the topology
            is over the replicas, and rank ``(r, s)`` gossips its shard with ``(r', s)``
            of each neighbouring replica (see :mod:`decent_dp.sharded._wrapper`, which also lists
            the options refused with it). ``None`` (the default): every rank holds the model.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialized.
        ValueError: Unknown topology or compression, a topology that does not fit the world
            size, a negative bucket size, fp16 parameters with a GradScaler, an
            ``optim_fn`` whose optimizer does not hold exactly the parameters it
            is given, model shapes that differ across ranks, or only one of
            ``outer_optim_fn`` and ``outer_every`` (or an ``outer_every`` that
            is not an int >= 1, an ``outer_fragments`` that is not an int >= 1
            dividing it, an unknown ``outer_compression``, an
            ``outer_scale_by_inner_lr`` that is not a bool, or any of them given
            without an outer optimizer).
        TypeError: ``optim_fn``, ``lr_scheduler_fn`` or ``outer_optim_fn``
            returns the wrong type.

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
        compression: str | CompressionSpec | None = None,
        outer_optim_fn: OuterOptimFn | None = None,
        outer_every: int | None = None,
        outer_fragments: int = 1,
        outer_compression: str | None = None,
        outer_scale_by_inner_lr: bool = False,
        state_sync: Mapping[str, int] | None = None,
        device_mesh: Any = None,
        _broadcast: bool = True,
    ):
        super().__init__()
        # every check that can differ between ranks' inputs runs before the first collective
        check_wrapper_args(model, bucket_size_in_mb, grad_clip_norm)
        if device_mesh is not None:  # FSDP2 shards in each replica, gossip between replicas
            opts = {
                "scaler": scaler,
                "grad_clip_norm": grad_clip_norm,
                "sync_buffer_in_global_avg": sync_buffer_in_global_avg,
                "bucket_size_in_mb": bucket_size_in_mb,
                "local_world_size": local_world_size or _local_world_size,
                "topology_kwargs": topology_kwargs,
                "compression": compression,
                "outer_optim_fn": outer_optim_fn,
                "outer_every": outer_every,
                "outer_fragments": outer_fragments,
                "outer_compression": outer_compression,
                "outer_scale_by_inner_lr": outer_scale_by_inner_lr,
                "state_sync": state_sync,
            }
            build_sharded(self, model, device_mesh, optim_fn, lr_scheduler_fn, topology, opts)
            return
        self.compression = parse_compression(compression)
        if local_world_size is None:
            local_world_size = _local_world_size
        self.module = model
        self._plain = unwrap_compiled(model)
        self._world_size = dist.get_world_size()
        self.topology = TopologyReg.create(
            topology, self._world_size, local_world_size, **(topology_kwargs or {})
        )
        if self.topology.world_size != self._world_size:
            raise ValueError(
                f"topology {self.topology!r} is built for world_size={self.topology.world_size}, "
                f"but the process group has {self._world_size} ranks"
            )
        check_compression(self.topology, self.compression)
        every, named = trained_parameters(self._plain, scaler)
        build_optim, trial = resolve_optim_fn(optim_fn, named)
        check_scheduler(lr_scheduler_fn, trial)
        self._initial_lr = float(trial.param_groups[0]["lr"])
        del trial
        check_outer_args(
            outer_optim_fn,
            outer_every,
            named[0][1],
            outer_fragments,
            outer_compression,
            outer_scale_by_inner_lr,
        )
        sync_spec = check_state_sync(state_sync)
        if sync_spec and (outer_optim_fn is not None or hierarchical_keys(self.topology)):
            what = "an outer optimizer" if outer_optim_fn is not None else "topology=hierarchical"
            raise ValueError(f"state_sync={sync_spec} does not combine with {what}")
        outer = None
        if outer_optim_fn is not None and outer_every is not None:
            outer = OuterOptimizer(
                outer_optim_fn,
                outer_every,
                self._world_size,
                fragments=outer_fragments,
                compression=outer_compression or "none",
                scale_by_inner_lr=outer_scale_by_inner_lr,
            )

        device = check_cuda_placement(named)
        warn_cuda_graphs_without_stable_storage(model, bool(stable_param_storage))
        # object collectives stage on the current device: make it the parameters' one
        with device_guard(device):
            check_ranks_agree(every, self.topology, self._world_size)
            if _broadcast:  # elastic gossip rebuilds over members that hold their own models
                broadcast_from_rank0(self._plain, self._world_size)
            self._engine = Engine(
                [p for _, p in named],
                [n for n, _ in named],
                self.topology,
                build_optim,
                lr_scheduler_fn,
                scaler,
                float(grad_clip_norm),
                as_view=bool(param_as_bucket_view),
                stable_storage=bool(stable_param_storage),
                bucket_bytes=int(bucket_size_in_mb * 1024 * 1024),
                compression=self.compression,
                outer=outer,
                state_sync=StateSync(sync_spec) if sync_spec else None,
            )
        self._averager = GlobalAverager(self._engine, self._plain, bool(sync_buffer_in_global_avg))

    # ---------------------------------------------------------------- forward
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; parameters are exactly ``x(t-1)``."""
        engine = self._engine
        engine.before_forward()
        out = self.module(*args, **kwargs)
        engine.watch_outputs(out)
        return out

    # ------------------------------------------------------- accumulation API
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients without stepping (gradient accumulation).

        Example::

            with model.no_sync():
                loss_fn(model(x1), y1).backward()
            loss_fn(model(x2), y2).backward()   # steps with the summed gradient
        """
        engine = self._engine
        old = engine.accumulate
        engine.accumulate = True
        try:
            yield
        finally:
            engine.accumulate = old

    def set_accumulate_grad(self, enable: bool = True) -> None:
        """Switch gradient accumulation on (no stepping) or off."""
        self._engine.accumulate = bool(enable)

    def set_adaptive_factor(self, factor: float) -> None:
        """Set the mixing step size ``a`` of ``x(t) = (1-a) x(t-1) + a W x(t-1) + d(t)``.

        ``a = 1`` (the default) is plain gossip, ``a = 0`` local training.

        Raises:
            ValueError: ``factor`` is not a number in ``[0, 1]``.
        """
        if not isinstance(factor, (int, float)) or not 0.0 <= float(factor) <= 1.0:
            raise ValueError(f"adaptive factor {factor!r} is invalid; it must be in [0, 1]")
        self._engine.gossip.alpha = float(factor)

    # ------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Finish in-flight gossip, remove the hooks and destroy the wrapper's process groups.

        Idempotent. The parameters keep their current values and stay usable as
        a plain module; this wrapper cannot train any more. Dropping the last
        reference to a wrapper releases the same resources.
        """
        self._engine.close()

    def __enter__(self) -> DecentralizedDataParallel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------- utilities
    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # .to()/.cuda()/.double() would replace the parameters' storage and detach them from
        # their buckets, so that the optimizer and the gossip would update stale copies
        if self._engine.buckets is not None:
            raise RuntimeError(
                "DecentralizedDataParallel cannot move or cast the model after the first backward "
                "pass; place the model on its device and dtype before wrapping it"
            )
        return super()._apply(fn, *args, **kwargs)

    @property
    def _buckets(self) -> list[Bucket] | None:
        """The engine's buckets (``None`` before the first backward)."""
        return self._engine.buckets

    @property
    def _stream(self) -> Any:
        """The CUDA side stream of the bucket work (``None`` on CPU)."""
        return self._engine.stream

    @property
    def step_count(self) -> int:
        """Number of optimizer steps taken."""
        return self._engine.step_count

    def current_lr(self) -> float:
        """The learning rate of the first parameter group now in use."""
        buckets = self._engine.buckets
        if buckets and buckets[0].optimizer is not None:
            return float(buckets[0].optimizer.param_groups[0]["lr"])
        return self._initial_lr

    def get_lr(self) -> float:
        """decent-dp 0.2.x's name for :meth:`current_lr`."""
        return self.current_lr()

    def pop_timers(self) -> dict[str, float]:
        """Seconds spent since the last call: waiting for gossip, mixing, and in the optimizer.

        On CUDA these are device times measured with events on the stream that
        does the bucket work; reading them synchronizes with those events.
        """
        return self._engine.timers.pop()

    def outer_delta_norm(self) -> float | None:
        """``||x_outer - xbar||`` at the latest outer step (same on every rank), or ``None``."""
        outer = self._engine.outer
        return outer.delta_norm() if outer is not None else None

    def set_comm_delay(self, fn: CommDelayFn | None) -> None:
        """Hold each gossip's completion until ``fn(nbytes, group_size)`` seconds after launch.

        A network-emulation hook, off (``None``) by default and free when off. A
        ``fn`` with a parameter named ``ranks`` is called as
        ``fn(nbytes, group_size, ranks=...)``, ``ranks`` the sorted global ranks
        of the group that carries those bytes (for a ``hierarchical`` edge, this
        rank's group across the hosts), so that it can tell the links apart.
        """
        self._engine.gossip.set_comm_delay(fn)

    def extra_repr(self) -> str:
        return (
            f"topology={self.topology.name}, world_size={self._world_size}, "
            f"step={self._engine.step_count}"
            + (f", compression={self.compression.name}" if self.compression.name != "none" else "")
        )
