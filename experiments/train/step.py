"""One training step: forward, backward, and the optimizer step of the chosen parallelism.

:class:`TrainStep` wraps the model once, as ``topology`` asks:

- a registered topology: :class:`~decent_dp.ddp.DecentralizedDataParallel`,
  which steps its per-bucket optimizers and gossips inside the backward pass
  (gradient clipping and fp16 loss scaling happen there too);
- ``topology=allreduce``: torch ``DistributedDataParallel`` with one ordinary
  optimizer and scheduler, stepped after the backward, with the same
  clipping and loss scaling.

Both get their optimizer and scheduler from the same factories
(:mod:`experiments.train.optim`).

A step only queues work on the device. Its loss, accuracy and sample count go
into the metrics window (:class:`experiments.train.metrics.TrainWindow`), and
whether its loss was finite stays a device flag. :class:`NanPolicy` acts on
that flag: under ``train.nan_policy=skip`` gradient hooks replace every
gradient of a step whose loss is not finite by zeros (``torch.where`` on the
flag), so that rank still takes part in the same optimizer step and gossip as
every other rank (with a zero gradient; momentum and weight decay still
apply); skipping the backward instead would desynchronise the ranks' step
counters and hang the next gossip. Under ``train.nan_policy=error`` the next
host phase stops every rank together (one small all-gather), naming the first
such step and its rank, before any checkpoint could save the damaged model.

AMP (``train.amp``, CUDA only): ``bf16`` autocasts; ``fp16`` also scales the
loss with a ``GradScaler``. A step whose scaled gradients overflow skips both
the optimizer and the LR scheduler, in the wrapper and in the ``allreduce``
baseline alike (torch's usual recipe would step the scheduler anyway). This is
the one host read per step: ``GradScaler.step`` and the wrapper read the
found-inf flag to decide whether the optimizer steps.

The module is past 500 lines and holds one idea, a process's training step:
:class:`TrainStep` with its AMP set-up and :class:`NanPolicy`, and :class:`StepBase`,
the part that :class:`~experiments.train.packed.PackedStep` shares with it.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from decent_dp.ddp import DecentralizedDataParallel
from decent_dp.optim import optimizer_kernels, prefer_fused_kernels
from decent_dp.utils import unwrap_compiled
from experiments.train.config import ALLREDUCE
from experiments.train.metrics import TrainWindow
from experiments.train.peer_loss import PeerLostError, comm_failure
from experiments.train.targets import build_topology
from experiments.train.task import ImageClassification, Task

__all__ = ["StepBase", "TrainStep", "NanPolicy", "amp_setup", "autocast_to"]

log = logging.getLogger(__name__)


def amp_setup(amp: str, device: torch.device) -> tuple[torch.dtype | None, Any]:
    """The autocast dtype and the gradient scaler that ``train.amp`` asks for on ``device``.

    Args:
        amp: ``off``, ``bf16`` or ``fp16``.
        device: The training device; AMP is ignored (with a warning) off CUDA.

    Returns:
        ``(dtype or None, GradScaler or None)``; a scaler for ``fp16`` only.
    """
    if amp == "off":
        return None, None
    if device.type != "cuda":
        log.warning("train.amp=%s is ignored on %s; training in float32", amp, device.type)
        return None, None
    if amp == "bf16":
        return torch.bfloat16, None
    return torch.float16, torch.amp.GradScaler("cuda")


def autocast_to(
    dtype: torch.dtype | None, device: torch.device
) -> contextlib.AbstractContextManager[Any]:
    """Autocast to ``dtype`` on ``device``, or nothing when ``dtype`` is ``None`` (AMP off)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class NanPolicy:
    """What happens to a step whose loss is not finite (``train.nan_policy``).

    Args:
        policy: ``error`` or ``skip``.
        rank: This process's rank.
        world_size: Number of ranks.
        device: The training device.

    Example::

        nan = NanPolicy("skip", rank=0, world_size=1, device=torch.device("cpu"))
        handles = nan.mask_gradients(model.parameters())
        nan.loss_finite = window.add(loss, correct, len(y), step)  # before backward
        skipped = nan.check(window, step, checkpoints)  # at a host phase
    """

    def __init__(self, policy: str, *, rank: int, world_size: int, device: torch.device) -> None:
        self.policy = policy
        self.rank, self.world_size, self.device = rank, world_size, device
        # the device flag of the current step, read by the gradient hooks
        self.loss_finite: torch.Tensor | None = None
        # under ``error``, the first non-finite step of any rank, once check() has found one
        self.diverged_step: int | None = None

    def mask_gradients(self, params: Iterable[nn.Parameter]) -> list[Any]:
        """Under ``skip``: hooks that zero the gradients of a step whose loss is not finite.

        The hooks run before the gradient reaches ``.grad``, so before the
        wrapper's step hooks and before DDP's all-reduce: the rank contributes
        exact zeros.

        Returns:
            The hook handles (none under ``error``), for the caller to remove.
        """
        if self.policy != "skip":
            return []

        def mask(grad: torch.Tensor) -> torch.Tensor:
            finite = self.loss_finite
            return grad if finite is None else torch.where(finite, grad, 0.0)

        return [p.register_hook(mask) for p in params if p.requires_grad]

    def check(self, window: TrainWindow, step: int, checkpoints: Path) -> int:
        """Read the non-finite-loss record of the steps since the last host phase.

        Under ``error`` every rank learns of every rank's record (one all-gather)
        and all stop with the same message, so none waits for a peer that has
        stopped.

        Args:
            window: The metrics window that recorded the steps.
            step: The current step.
            checkpoints: The checkpoint directory, named in the error if it exists.

        Returns:
            The number of steps skipped on this rank (0 under ``error``).

        Raises:
            FloatingPointError: Under ``error``, some rank had a non-finite loss (its step
                is then :attr:`diverged_step`).
        """
        count, first = window.pop_nonfinite()
        if self.policy != "error":
            if count:
                log.warning(
                    "rank %d: %d step(s) up to step %d had a non-finite loss (first at step %d); "
                    "their gradients were replaced by zeros",
                    self.rank,
                    count,
                    step,
                    first,
                )
            return count
        mine = torch.tensor(
            [math.inf if first is None else float(first)], dtype=torch.float64, device=self.device
        )
        gathered = [mine]
        if self.world_size > 1:  # an elastic host is a world of one beside its quorum's group
            gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(gathered, mine)
        firsts = torch.cat(gathered).tolist()
        bad = min(range(self.world_size), key=lambda r: (firsts[r], r))
        if math.isinf(firsts[bad]):
            return 0
        self.diverged_step = int(firsts[bad])
        kept = f"; checkpoints in {checkpoints} are kept" if checkpoints.exists() else ""
        raise FloatingPointError(
            f"non-finite loss at step {int(firsts[bad])} on rank {bad}{kept}; "
            "lower optim.lr or set train.nan_policy=skip"
        )


class StepBase:
    """What every step holds: the device, metrics window, task, AMP set-up and NaN policy.

    Args:
        train_cfg: The ``train`` config section (``amp``, ``nan_policy``).
        window: Where each step's loss, accuracy and samples are summed (on the device).
        task: What the model learns.
        rank: This process's rank.
        world_size: Number of ranks.

    Example::

        base = StepBase(cfg.train, window, task, rank=0, world_size=1)
        with base.autocast():
            loss, correct, count = task.forward(model, base.prepare(x), y)
    """

    def __init__(
        self, train_cfg: Any, window: TrainWindow, task: Task, *, rank: int, world_size: int
    ) -> None:
        self.device = window.device
        self.window, self.task = window, task
        self.amp_dtype, self.scaler = amp_setup(str(train_cfg.amp), self.device)
        self.nan = NanPolicy(
            str(train_cfg.nan_policy), rank=rank, world_size=world_size, device=self.device
        )

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast to the AMP dtype, or nothing when AMP is off."""
        return autocast_to(self.amp_dtype, self.device)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The input in the memory format the model wants: as it is, unless a step says otherwise."""
        return x


class TrainStep(StepBase):
    """The wrapped model and everything one training step needs.

    Args:
        model: The bare model, already on ``device``.
        train_cfg: The ``train`` config section (``amp``, ``grad_clip_norm``,
            ``label_smoothing``, ``nan_policy``).
        topology_cfg: The ``topology`` config section.
        optim_fn: ``optim_fn(named_params) -> Optimizer``.
        scheduler_fn: ``lr_scheduler_fn(optimizer) -> LRScheduler``.
        window: Where each step's loss, accuracy and samples are summed.
        rank: This process's rank.
        world_size: Number of ranks.
        channels_last: Feed 4-d inputs in ``channels_last`` memory format.
        task: What the model learns (its loss); image classification by default.
        compression: The wrapper's ``compression=`` (``None``: exact gossip).
        outer: The wrapper's ``outer_optim_fn``, ``outer_every``, ``outer_fragments``
            and ``outer_compression`` (:func:`experiments.train.outer.outer_kwargs`);
            empty for none.
        state_sync: The wrapper's ``state_sync`` (``optim.state_sync``): named
            optimizer states averaged with the gossip every K steps; empty for none.

    Example::

        train_step = TrainStep(model, cfg.train, cfg.topology, optim_fn, scheduler_fn,
                               window, rank=0, world_size=1)
        for number, (x, y) in enumerate(batches, start=1):
            train_step(x, y, number)
        train_step.close()
    """

    def __init__(
        self,
        model: nn.Module,
        train_cfg: Any,
        topology_cfg: Any,
        optim_fn: Callable[..., Any],
        scheduler_fn: Callable[..., Any],
        window: TrainWindow,
        *,
        rank: int,
        world_size: int,
        channels_last: bool = False,
        task: Task | None = None,
        compression: str | None = None,
        outer: dict[str, Any] | None = None,
        state_sync: dict[str, int] | None = None,
        device_mesh: Any = None,
    ) -> None:
        task = ImageClassification(train_cfg) if task is None else task
        super().__init__(train_cfg, window, task, rank=rank, world_size=world_size)
        # train.shard_size > 1: the model is fully_shard-ed in replicas (experiments.train.sharding)
        self.device_mesh = device_mesh
        self._state_sync = dict(state_sync or {})
        self._outer = dict(outer or {})
        self.channels_last = channels_last
        self.compression = compression
        self.topology = str(topology_cfg.name)
        self.decentralized = self.topology != ALLREDUCE
        self.grad_clip_norm = float(train_cfg.grad_clip_norm)
        self._last_scale = self.scaler.get_scale() if self.scaler is not None else 1.0
        self.module = model
        self.params = list(model.parameters())
        self.optimizer: Any = None
        self.scheduler: Any = None
        self._handles: list[Any] = []  # hooks this job put on the model and optimizer
        self._optimizer_stepped = False
        self.model = self._wrap(model, topology_cfg, optim_fn, scheduler_fn, world_size)
        try:
            self._handles += self.nan.mask_gradients(self.params)
        except BaseException:
            self.close()
            raise

    def _wrap(
        self,
        model: nn.Module,
        topo: Any,
        optim_fn: Callable[..., Any],
        scheduler_fn: Callable[..., Any],
        world_size: int,
    ) -> nn.Module:
        if self.decentralized:
            # a registered name and a user's _target_ alike: the topology, built for this world
            mesh = self.device_mesh
            replicas = world_size // mesh["shard"].size() if mesh is not None else world_size
            topology = build_topology(topo, replicas)
            return DecentralizedDataParallel(
                model,
                optim_fn=optim_fn,
                lr_scheduler_fn=scheduler_fn,
                topology=topology,
                scaler=self.scaler,
                grad_clip_norm=self.grad_clip_norm,
                sync_buffer_in_global_avg=bool(topo.sync_buffer_in_global_avg),
                bucket_size_in_mb=float(topo.bucket_size_in_mb),
                compression=self.compression,
                state_sync=self._state_sync or None,
                device_mesh=mesh,
                **self._outer,
            )
        # sharded over the 2-D mesh, the model is its own all-reducing wrapper (HSDP)
        wrapped = model
        if self.device_mesh is None:
            wrapped = DistributedDataParallel(
                model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=float(topo.bucket_size_in_mb),
            )
        self.optimizer = optim_fn(list(model.named_parameters()))
        # the kernels the wrapper picks per bucket, so that throughput compares the gossip only
        prefer_fused_kernels(self.optimizer, self.device)
        self.scheduler = scheduler_fn(self.optimizer)
        # GradScaler.step skips optimizer.step on overflow; this is how the step learns of it
        self._handles.append(self.optimizer.register_step_post_hook(self._note_step))
        return wrapped

    def _note_step(self, *_: Any) -> None:
        self._optimizer_stepped = True

    @property
    def ddp(self) -> DecentralizedDataParallel:
        """The decentralized wrapper (registered topologies only)."""
        assert isinstance(self.model, DecentralizedDataParallel)
        return self.model

    def close(self) -> None:
        """Remove the hooks and close the wrapper (its hooks, groups and buffers); idempotent."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        # absent when building the wrapper failed; torch's DDP has nothing to close
        model: Any = getattr(self, "model", None)
        if hasattr(model, "close"):
            model.close()

    # ------------------------------------------------------------ the step
    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The input in the memory format the model wants."""
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def __call__(self, x: torch.Tensor, y: torch.Tensor, number: int) -> None:
        """Train on one batch; ``number`` is the step's 1-based number (for the NaN record).

        Raises:
            PeerLostError: The step's collective failed because a peer stopped answering.
        """
        try:
            self._step(x, y, number)
        except RuntimeError as exc:
            reason = comm_failure(exc)
            if reason is None:
                raise
            raise PeerLostError(number, self.peers_at(number), reason) from exc

    def _step(self, x: torch.Tensor, y: torch.Tensor, number: int) -> None:
        x = self.prepare(x)
        with self.autocast():
            loss, correct, count = self.task.forward(self.model, x, y)
        # recorded on the device; the next host phase reads it (NanPolicy.check)
        self.nan.loss_finite = self.window.add(loss, correct, count, number)
        backward_loss = self.scaler.scale(loss) if self.scaler is not None else loss
        backward_loss.backward()  # the wrapper steps and gossips inside backward
        if not self.decentralized:
            self._allreduce_step()

    def peers_at(self, number: int) -> list[int]:
        """The other ranks of the group step ``number`` waits on (all of them under ``allreduce``).

        Step ``t`` mixes in the gossip of the topology's round ``(t - 1) mod period``;
        where this rank is alone in that round, the gossip it launches for the next.
        """
        rank = dist.get_rank() if dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_initialized() else 1
        if self.decentralized:
            topology = self.ddp.topology
            for r in (number - 1, number):
                peers = sorted(set(topology.get_edge(r, rank).ranks) - {rank})
                if peers:
                    return peers
        return [r for r in range(world) if r != rank]

    def _allreduce_step(self) -> None:
        clip = self.grad_clip_norm
        if self.scaler is not None:
            if clip > 0:
                self.scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.params, clip)
            # GradScaler.step reads its found-inf flag on the host and skips optimizer.step on
            # overflow; the step hook tells us, so no second read is needed
            self._optimizer_stepped = False
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if getattr(self.optimizer, "_step_supports_amp_scaling", False):
                # a fused kernel is called on overflow too and skips inside; the scale backs off
                scale = self.scaler.get_scale()
                self._optimizer_stepped = scale >= self._last_scale
                self._last_scale = scale
            # as in the wrapper: a skipped step holds the schedule back too
            if self._optimizer_stepped:
                self.scheduler.step()
        else:
            if clip > 0:
                nn.utils.clip_grad_norm_(self.params, clip)
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------ what the others read
    def current_lr(self) -> float:
        """The learning rate of the next step."""
        if self.decentralized:
            return self.ddp.current_lr()
        return float(self.optimizer.param_groups[0]["lr"])

    def optimizer_kernels(self) -> dict[str, Any]:
        """The optimizer kernels in use (:func:`decent_dp.optim.optimizer_kernels`)."""
        return optimizer_kernels(self.model if self.decentralized else self.optimizer)

    def pop_timers(self) -> dict[str, float]:
        """The wrapper's ``comm/*`` timers since the last call; none under ``allreduce``."""
        return self.ddp.pop_timers() if self.decentralized else {}

    def bytes_per_step(self) -> float:
        """Bytes this rank sends per step (``comm/bytes_per_step``), from the schedule.

        The wrapper counts its gossip (:meth:`DecentralizedDataParallel.comm_bytes_per_step`);
        ``allreduce`` counts torch DDP's ring all-reduce of every gradient,
        ``2 (n-1) / n`` of their bytes.
        """
        if self.decentralized:
            return self.ddp.comm_bytes_per_step()
        n = dist.get_world_size() if dist.is_initialized() else 1
        grads = sum(p.numel() * p.element_size() for p in self.params if p.requires_grad)
        return 2.0 * (n - 1) / n * grads

    def peak_bytes_per_step(self) -> float:
        """The most bytes this rank sends in one step (``comm/peak_bytes_per_step``).

        The wrapper's :meth:`DecentralizedDataParallel.comm_peak_bytes_per_step`
        (the busiest step of its schedule: a period's averaging round, an outer
        round, one fragment's); ``allreduce`` sends the same every step.
        """
        if self.decentralized:
            return self.ddp.comm_peak_bytes_per_step()
        return self.bytes_per_step()

    def outer_delta_norm(self) -> float | None:
        """``||x_outer - xbar||`` at the latest outer step; ``None`` without one (reads the device)."""
        return self.ddp.outer_delta_norm() if self.decentralized else None

    def training_state(self) -> dict[str, Any]:
        """Optimizer, scheduler and scaler state, for a checkpoint."""
        if self.decentralized:
            return self.ddp.training_state_dict()
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_training_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`training_state`."""
        if self.decentralized:
            self.ddp.load_training_state_dict(state)
            return
        self.optimizer.load_state_dict(state["optimizer"])
        prefer_fused_kernels(self.optimizer, self.device)  # the loaded groups bring their flags
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
            self._last_scale = self.scaler.get_scale()

    def model_state(self) -> dict[str, Any]:
        """The bare model's state dict: its own keys, without ``torch.compile``'s ``_orig_mod.``."""
        if self.decentralized:
            return self.ddp.state_dict()
        return unwrap_compiled(self.module).state_dict()

    def load_model(self, state: dict[str, Any]) -> None:
        """Load the bare model's parameters (through the wrapper, which keeps its own copies).

        Keys saved under ``model.compile=whole`` before checkpoints dropped the
        compile prefix still load.
        """
        state = plain_keys(state)
        if self.decentralized:
            self.ddp.load_state_dict(state)
        else:
            unwrap_compiled(self.module).load_state_dict(state)


_COMPILED_PREFIX = "_orig_mod."


def plain_keys(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the ``_orig_mod.`` prefix of a compiled module's keys removed."""
    if not any(k.startswith(_COMPILED_PREFIX) for k in state):
        return state
    return {k.removeprefix(_COMPILED_PREFIX): v for k, v in state.items()}
