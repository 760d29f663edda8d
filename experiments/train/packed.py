"""``engine=packed``: the job's ``N`` workers trained in one process by :class:`decent_dp.PackedWorkers`.

``python train.py engine=packed engine.workers=32 topology=one-peer-exp`` runs the
same job as ``torchrun --nproc_per_node=32 train.py topology=one-peer-exp`` would,
on one CPU or one GPU: the same model, data partition (worker ``i`` reads rank
``i``'s shard, IID or Dirichlet), optimizer, schedule and topology, the same
mathematics (:mod:`decent_dp.packed`), and the same metrics under the same names.
It goes through the one :class:`~experiments.train.trainer.Trainer`; this module
holds its three collaborators:

- :class:`PackedData`: every worker's data, its training batches stacked on a
  leading worker dimension, step by step;
- :class:`PackedStep`: what :class:`~experiments.train.step.TrainStep` is to a
  process group, for the packed workers (forward, backward, step, the state of a
  checkpoint, the bytes a worker would send);
- :func:`packed_eval_sums`: the averaged model on every worker's test shard and
  each worker's own model on its own shard, as the ranks' evaluation sums them.

The process group is one process (``python train.py``); ``engine.workers`` is the
world the topology, the batch split, the partition and the throughput count.
What needs real processes or a real wire is refused in one line by
:func:`check_engine`, before anything is built.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from decent_dp.metrics import consensus_distance_sketch
from decent_dp.optim import optimizer_kernels
from decent_dp.packed import ALLREDUCE, ELEMENTWISE_OPTIMIZERS, PackedWorkers
from experiments.schema import ConfigError, is_int, require
from experiments.train.engine import is_packed
from experiments.train.optim import build_optim_fn
from experiments.train.step import StepBase
from experiments.train.targets import build_topology
from experiments.train.task import LanguageModeling, Task

__all__ = ["PackedData", "PackedStep", "check_engine", "packed_eval_sums", "packed_topology"]


def _refusals(cfg: Any) -> list[tuple[str, Any, bool, str]]:
    """What packed workers cannot take: ``(key, value, whether it is fine, what it needs)``."""
    t, outer = cfg.train, cfg.get("outer")
    comp = str(cfg.compression.name) if cfg.get("compression") is not None else "none"
    ft = str(cfg.fault_tolerance.name) if cfg.get("fault_tolerance") is not None else "none"
    sync = {k: v for k, v in dict(cfg.optim.get("state_sync") or {}).items() if int(v)}
    compiled = str(cfg.model.get("compile", "off"))
    channels_last = bool(cfg.model.get("channels_last", False))
    shards = t.get("shard_size", 1)
    # fmt: off
    rules = [
        ("compression.name", comp, comp == "none", "bytes on a wire"),
        ("fault_tolerance.name", ft, ft == "none", "hosts that come and go"),
        ("train.shard_size", shards, shards == 1, "a model sharded over processes"),
        ("train.nan_policy", t.nan_policy, str(t.nan_policy) == "error",
         "skip's zeroed gradient still moves an optimizer's state; error stops"),
        ("train.amp", t.amp, str(t.amp) != "fp16", "a GradScaler; bf16 or off"),
        ("network.name", cfg.network.name, str(cfg.network.name) == "none",
         "an emulated link between processes"),
        ("optim.state_sync", sync, not sync, "optimizer states gossiped between processes"),
        ("model.compile", compiled, compiled == "off",
         "torch.compile of the module; packed workers run it under vmap"),
        ("model.channels_last", channels_last, not channels_last,
         "4-d inputs; packed ones carry a worker dimension"),
    ]
    if outer is not None and str(outer.name) != "none":
        rules += [
            ("outer.fragments", outer.fragments, int(outer.fragments) == 1,
             "streamed outer rounds, per bucket"),
            ("outer.compression", outer.compression, str(outer.compression) == "none",
             "bytes on a wire"),
        ]
    # fmt: on
    return rules


def check_engine(cfg: Any, world_size: int) -> None:
    """The ``engine`` section's one-line checks, before anything is built (no communication).

    ``engine=distributed`` takes its workers from the world size, so an
    ``engine.workers`` other than null or the world size is refused; ``engine=packed``
    refuses what needs processes or a wire (:func:`_refusals`), a non-elementwise
    optimizer and a worker count its topology cannot take.

    Args:
        cfg: The composed config.
        world_size: The number of processes (1 under ``engine=packed``).

    Raises:
        ConfigError: One line naming the key, its value and what is allowed.
    """
    section = cfg.get("engine")
    if section is None:
        return
    workers = section.workers
    if not is_packed(cfg):
        require(
            "engine.workers",
            workers,
            workers is None or workers == world_size,
            f"null or the world size {world_size} with engine=distributed (one process per "
            "worker; engine=packed trains engine.workers in one process)",
        )
        return
    require("engine.workers", workers, is_int(workers) and workers >= 1, "an integer >= 1")
    if world_size != 1:
        raise ConfigError(
            f"engine=packed runs its {workers} workers in one process, but this job has "
            f"{world_size}; launch it with python train.py (not torchrun --nproc_per_node="
            f"{world_size})"
        )
    for key, value, ok, why in _refusals(cfg):
        if not ok:
            raise ConfigError(
                f"{key}={value} is invalid with engine=packed ({why}); "
                f"use engine=distributed for it"
            )
    probe = _probe_optimizer(cfg)
    if type(probe) not in ELEMENTWISE_OPTIMIZERS:
        allowed = ", ".join(k.__name__ for k in ELEMENTWISE_OPTIMIZERS)
        raise ConfigError(
            f"optim={cfg.optim.name} builds {type(probe).__name__}, which packed workers "
            f"cannot step exactly; engine=packed takes {allowed}"
        )
    if str(cfg.topology.get("name", "")) != ALLREDUCE:
        packed_topology(cfg.topology, int(workers))  # a worker count the topology cannot take


def _probe_optimizer(cfg: Any) -> Any:
    return build_optim_fn(cfg.optim)([(torch.zeros(2, 2, requires_grad=True), "probe")])


def packed_topology(section: Any, workers: int) -> Any:
    """The topology of ``workers`` packed workers; ``topology.local_world_size`` is 1 when null."""
    if section.get("local_world_size") is None:
        section = OmegaConf.merge(section, {"local_world_size": 1})
    return build_topology(section, workers)


# ---------------------------------------------------------------------- data


class StackedLoader:
    """Every worker's training loader in lockstep: batch ``b`` is their batches ``b``, stacked.

    Args:
        loaders: One training loader per worker (rank ``i``'s shard for worker ``i``).
    """

    def __init__(self, loaders: list[Any]) -> None:
        self.loaders = loaders

    def __len__(self) -> int:
        return len(self.loaders[0])

    def iterate(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The stacked batches ``start ..`` of ``epoch``: ``x`` and ``y`` of shape ``(N, batch, ...)``."""
        for batches in zip(*(loader.iterate(epoch, start=start) for loader in self.loaders)):
            xs, ys = zip(*batches)
            yield torch.stack(xs), torch.stack(ys)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.iterate(0)


class _PositionedLoader(StackedLoader):
    """A :class:`StackedLoader` of loaders that keep a position (token windows): one for all."""

    def state_dict(self) -> dict[str, Any]:
        return dict(self.loaders[0].state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for loader in self.loaders:
            loader.load_state_dict(state)


class PackedData:
    """Every worker's data: stacked training batches and the test shards, one per worker.

    The other attributes (classes, image shape, vocabulary, ...) are worker 0's, the same
    for every worker.

    Args:
        shards: One :func:`experiments.data.build_data` result per worker.
    """

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards
        loaders = [s.train for s in shards]
        kind = _PositionedLoader if hasattr(loaders[0], "state_dict") else StackedLoader
        self.train = kind(loaders)
        self.test = [s.test for s in shards]

    @classmethod
    def build(cls, task: Task, cfg: Any, workers: int, **placement: Any) -> PackedData:
        """Worker ``i``'s data is rank ``i`` of ``workers``'s (``placement``: batch size, seed, device)."""
        shards = [
            task.build_data(cfg.dataset, cfg.model, rank=i, world_size=workers, **placement)
            for i in range(workers)
        ]
        return cls(shards)

    def __getattr__(self, name: str) -> Any:
        if name == "shards":  # before __init__ set it (copy, pickle)
            raise AttributeError(name)
        return getattr(self.shards[0], name)


# ---------------------------------------------------------------------- the step


class PackedStep(StepBase):
    """The packed workers and everything one of their steps needs (a ``TrainStep`` twin).

    The device, window, task, AMP (bf16 or off: :func:`check_engine` refuses fp16's
    scaler) and NaN policy are :class:`~experiments.train.step.StepBase`'s, as a world of one.

    Args:
        model: The bare model, on the device; every worker starts from it.
        workers: ``N``.
        train_cfg: The ``train`` section (``amp``, ``grad_clip_norm``, ``nan_policy``).
        topology_cfg: The ``topology`` section (a registered name, ``allreduce`` or a
            ``_target_``; ``local_world_size`` 1 when null).
        *factories: :class:`~experiments.train.step.TrainStep`'s ``optim_fn``
            (``optim_fn(named_params) -> Optimizer``, elementwise here), ``scheduler_fn``
            (``lr_scheduler_fn(optimizer) -> LRScheduler``) and ``window`` (where the
            workers' mean loss, correct answers and samples are summed), in its order.
        task: What the model learns.
        outer: The outer optimizer's arguments (:func:`experiments.train.outer.outer_kwargs`).
    """

    packs = True
    compression = None
    device_mesh = None

    def __init__(
        self,
        model: nn.Module,
        workers: int,
        train_cfg: Any,
        topology_cfg: Any,
        *factories: Any,
        task: Task,
        outer: dict[str, Any] | None = None,
    ) -> None:
        optim_fn, scheduler_fn, window = factories
        super().__init__(train_cfg, window, task, rank=0, world_size=1)
        self.name = str(topology_cfg.name)
        # a checkpoint's layout: packed shards resume only into packed runs of as many workers
        self.topology = f"{self.name}@packed{workers}"
        self.decentralized = self.name != ALLREDUCE
        self.sync_buffers = bool(topology_cfg.get("sync_buffer_in_global_avg", False))
        outer = dict(outer or {})
        outer.pop("outer_fragments", None)  # 1, as check_engine saw to
        outer.pop("outer_compression", None)  # none
        topology: Any = ALLREDUCE
        if self.decentralized:
            topology = packed_topology(topology_cfg, workers)
        self.module = self.model = model
        self.packed = PackedWorkers(
            model,
            workers,
            optim_fn,
            scheduler_fn,
            topology,
            grad_clip_norm=float(train_cfg.grad_clip_norm),
            **outer,
        )
        self.params = self.packed.params
        # images count their predictions; a language model's lines have no accuracy
        self._counts = not isinstance(task, LanguageModeling)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, number: int) -> None:
        """Every worker's step on its batch (``x``, ``y``: a leading worker dimension)."""
        task = self.task

        def forward(module: nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> Any:
            loss, correct, _ = task.forward(module, xs, ys)
            return loss, correct

        with self.autocast():
            losses, correct = self.packed.map(forward, x, y)
        count = y.numel() if self._counts else 0
        # the workers' mean loss, as the ranks' lines average theirs
        self.nan.loss_finite = self.window.add(losses.mean(), correct.sum(), count, number)
        losses.sum().backward()  # worker i's loss reads worker i's parameters alone
        self.packed.step()

    # ------------------------------------------------------------ what the others read
    def current_lr(self) -> float:
        """The learning rate of the next step."""
        return float(self.packed.optimizer.param_groups[0]["lr"])

    def optimizer_kernels(self) -> dict[str, Any]:
        """The optimizer kernels in use (:func:`decent_dp.optim.optimizer_kernels`)."""
        return optimizer_kernels(self.packed.optimizer)

    def pop_timers(self) -> dict[str, float]:
        """No communication to time."""
        return {}

    def bytes_per_step(self) -> float:
        """Bytes a worker would send per step (:meth:`PackedWorkers.comm_bytes_per_step`)."""
        return self.packed.comm_bytes_per_step()

    def peak_bytes_per_step(self) -> float:
        """The most bytes a worker would send in one step of the schedule."""
        return self.packed.comm_peak_bytes_per_step()

    def outer_delta_norm(self) -> float | None:
        """``||x_outer - xbar||`` at the latest outer round; ``None`` without one."""
        return self.packed.outer_delta_norm()

    def consensus(self, sketch: int | None = None) -> float:
        """The workers' consensus distance, exact, or estimated from a ``sketch``-number count sketch."""
        if not sketch:
            return float(self.packed.consensus_distance())
        workers = [[p[i] for p in self.params] for i in range(self.packed.workers)]
        return consensus_distance_sketch(workers, int(sketch), seed=self.packed.step_count)

    # ------------------------------------------------------------ checkpoints
    def model_state(self) -> dict[str, Any]:
        """Every worker's model, optimizer, schedule and outer state (one shard holds them all)."""
        return self.packed.state_dict()

    def training_state(self) -> dict[str, Any]:
        """Nothing apart: :meth:`model_state` holds the training state too."""
        return {}

    def load_model(self, state: dict[str, Any]) -> None:
        """A packed shard in full; a plain model (a reshard's global average) into every worker."""
        if "workers" in state:
            self.packed.load_state_dict(state)
        else:
            self.packed.load_model_state(state)

    def load_training_state(self, state: dict[str, Any]) -> None:
        """Nothing to do: :meth:`load_model` loaded it."""

    def close(self) -> None:
        """Nothing is held outside the process."""


@torch.no_grad()
def packed_eval_sums(step: PackedStep, tests: list[Any]) -> tuple[list[float], list[float]]:
    """The averaged model's and the own models' evaluation sums over every worker's test shard.

    The averaged model keeps each worker's buffers on that worker's shard unless
    ``topology.sync_buffer_in_global_avg`` averages them, as the wrapper's ``averaged()``.
    """
    task, packed = step.task, step.packed
    module = copy.deepcopy(step.module).eval()
    avg: torch.Tensor | None = None
    own: torch.Tensor | None = None
    if step.sync_buffers:
        module.load_state_dict(packed.averaged_state_dict())
    was = step.module.training
    step.module.eval()  # the own models run through the template module: its mode is theirs
    try:
        for i, test in enumerate(tests):
            if not step.sync_buffers:
                module.load_state_dict(packed.averaged_state_dict(buffers_of=i))
            for x, y in test:
                with step.autocast():
                    a = task.eval_sums(module(x), y)
                    o = task.eval_sums(packed.call(i, x), y)
                avg = a if avg is None else avg + a
                own = o if own is None else own + o
    finally:
        step.module.train(was)
    if avg is None or own is None:
        return [0.0] * task.eval_width, [0.0] * task.eval_width
    return avg.tolist(), own.tolist()
