"""The training loop behind ``train.py``: one Hydra job is one call of :func:`run`.

``run(cfg)`` goes through the same stages on every rank:

1. Validate the config (:func:`validate`) with no communication at all, so a
   bad value raises the same one-line :class:`ConfigError` on every rank and
   nothing waits for a peer that has already stopped. Under SLURM without
   torchrun the torchrun variables are first derived from SLURM's (:func:`slurm_env`).
2. Set up the process group once per process (:func:`decent_dp.utils.initialize_dist`;
   later jobs of a multirun reuse it).
3. One ``all_gather_object``: the hash of the resolved config must match on
   every rank, and every rank adopts rank 0's run directory (Hydra resolves
   it per process) and wandb names.
4. Build data, model and the parallel wrapper: :class:`DecentralizedDataParallel`
   for a registered topology, or torch ``DistributedDataParallel`` with an
   ordinary optimizer for ``topology=allreduce``. Both get their optimizer and
   scheduler from the same ``decent_dp.optim`` factories.
5. Resume from the newest complete checkpoint in ``<run dir>/checkpoints``.
6. Train for ``train.max_steps`` (or ``train.epochs``) steps, log metrics,
   evaluate every epoch and at the end, save checkpoints; write ``summary.json``.
7. Close the wrapper and the metrics sinks, in a ``finally``.

The hot path never waits on the host. A training step only queues work: the
window's loss, accuracy and sample sums stay on the device
(:class:`experiments.train.logger.TrainWindow`) and are read back once per metrics
line, and batches come from loaders that do not copy from pageable memory.
Every host read happens in a host phase, on steps that log, evaluate or save.
On CUDA the throughput windows (``perf/samples_per_s``, ``perf/step_s``) close
after ``torch.cuda.synchronize()``. The one exception is fp16 loss scaling
(``train.amp=fp16``): torch's ``GradScaler.step`` and the wrapper read the
found-inf flag on the host once per step, as they must to decide whether the
optimizer steps.

Consensus distance, in every run however short: the count-sketch estimate
``consensus/distance_sketch`` (``log.consensus_sketch`` numbers of communication)
on every training metrics line, and the exact ``consensus/distance`` on every
evaluation line (every epoch and at the end) and every ``log.consensus_every``
steps. Under ``allreduce`` both are 0 by construction and logged as 0.0, so
every topology has the keys. Both are collectives, computed at the same steps
on every rank.

Evaluation: ``eval/acc`` is the accuracy of the globally averaged model (the
wrapper's ``averaged()``, which also averages floating-point buffers such as
BatchNorm statistics when ``topology.sync_buffer_in_global_avg`` is true);
``eval/acc_local`` is every worker's own model on its shard of the test set,
correct answers summed over workers, i.e. the workers' mean accuracy
estimated on disjoint shards. Under ``allreduce`` all workers hold the same
model and both numbers coincide.

Non-finite losses are found without a per-step host read. Each step records on
the device whether its loss is finite; the next host phase reads that record.
``train.nan_policy=error`` then stops every rank together (one small
all-gather), naming the first such step and its rank, before any checkpoint
could save the damaged model: training may have gone on for up to
``log.every - 1`` steps past the bad one. ``train.nan_policy=skip``: gradient
hooks replace every gradient of a step whose loss is not finite by zeros
(``torch.where`` on the device flag), so that rank still takes part in the same
optimizer step and gossip as every other rank (with a zero gradient; momentum
and weight decay still apply). Skipping the backward instead would
desynchronise the ranks' step counters and hang the next gossip. Skipped steps
are counted and reported at the next host phase.

fp16 loss scaling: a step whose scaled gradients overflow skips both the
optimizer and the LR scheduler, in the wrapper and in the ``allreduce``
baseline alike (torch's usual recipe would step the scheduler anyway).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from decent_dp import optim as dopt
from decent_dp.ddp import DecentralizedDataParallel
from decent_dp.topo import TopologyReg
from decent_dp.utils import get_device, initialize_dist
from experiments.data.loaders import build_data
from experiments.models.vision import build_model
from experiments.network.netem import apply_network, profile_from_cfg
from experiments.train.checkpoint import (
    check_compatible,
    global_average_from_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_shard,
    save_checkpoint,
)
from experiments.train.config import ALLREDUCE, ConfigError, check_dataset, check_model, plain
from experiments.train.logger import (
    MetricsLogger,
    TrainWindow,
    WindowClock,
    json_safe,
    run_name_from_overrides,
)

__all__ = [
    "run",
    "validate",
    "config_hash",
    "slurm_env",
    "ConfigError",
    "OPTIM_FNS",
    "SCHEDULER_FNS",
]

log = logging.getLogger(__name__)

OPTIM_FNS: dict[str, Callable[..., Any]] = {
    "sgd": dopt.optim_fn_sgd,
    "qgm_sgd": dopt.optim_fn_qgm_sgd,
    "adam": dopt.optim_fn_adam,
    "adamw": dopt.optim_fn_adamw,
    "accum_adam": dopt.optim_fn_accum_adam,
    "accum_adamw": dopt.optim_fn_accum_adamw,
}
"""``optim.name`` -> optimizer factory of :mod:`decent_dp.optim`."""

SCHEDULER_FNS: dict[str, Callable[..., Any]] = {
    "cosine_warmup": dopt.lr_scheduler_fn_cosine_with_warmup,
    "constant": dopt.lr_scheduler_fn_constant,
    "step": dopt.lr_scheduler_fn_step,
}
"""``scheduler.name`` -> scheduler factory of :mod:`decent_dp.optim`."""

SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"


# ------------------------------------------------------------------ environment


def _first_host(nodelist: str) -> str:
    """First host of a SLURM node list such as ``gpu[003-010,012],cpu1`` -> ``gpu003``."""
    depth, first = 0, ""
    for ch in nodelist:
        if ch == "," and depth == 0:
            break
        depth += ch == "["
        depth -= ch == "]"
        first += ch
    m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", first)
    if not m:
        return first
    prefix, ranges, suffix = m.groups()
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


def slurm_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The torchrun variables for a rank started by ``srun`` (or submitit) without torchrun.

    Args:
        environ: The environment to read; ``os.environ`` by default.

    Returns:
        ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
        ``MASTER_ADDR`` and ``MASTER_PORT`` derived from ``SLURM_PROCID``,
        ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NTASKS_PER_NODE``, the
        first host of ``SLURM_JOB_NODELIST`` and the job id; an empty dict when
        ``WORLD_SIZE`` is already set or this is not a SLURM task.
    """
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" in env or "SLURM_PROCID" not in env:
        return {}
    ntasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS") or "1"
    per_node = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ntasks
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
    job_id = int(re.sub(r"\D", "", env.get("SLURM_JOB_ID", "0")) or 0)
    first_count = re.match(r"\d+", per_node)  # "8(x4)" or "8,4": the first node's count
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": ntasks,
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": first_count.group(0) if first_count else "1",
        "MASTER_ADDR": env.get("MASTER_ADDR") or _first_host(nodelist),
        "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + job_id % 20000),
    }


# ------------------------------------------------------------------ validation


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optim_hyper(optim_cfg: Any) -> dict[str, Any]:
    hyper = {
        k: v
        for k, v in plain(OmegaConf.to_container(optim_cfg, resolve=True)).items()
        if k != "name"
    }
    if "betas" in hyper:
        hyper["betas"] = tuple(hyper["betas"])
    return hyper


def validate(cfg: DictConfig, world_size: int) -> None:
    """Check every value that could make the run fail later, without communicating.

    The same config and world size give the same outcome on every rank, so
    all ranks stop together with the same message.

    Args:
        cfg: The composed config.
        world_size: Number of ranks.

    Raises:
        ConfigError: A one-line message naming the key, the bad value and what is allowed.
    """
    t, d, s, topo = cfg.train, cfg.dataset, cfg.scheduler, cfg.topology
    steps_ok = (
        _is_int(t.epochs) and t.epochs > 0
        if t.max_steps is None
        else _is_int(t.max_steps) and t.max_steps > 0
    )
    lws = topo.local_world_size
    # (key, value, valid, what is allowed)
    rules: list[tuple[str, Any, bool, str]] = [
        (
            "train.batch_size",
            t.batch_size,
            _is_int(t.batch_size) and t.batch_size > 0,
            "an integer > 0",
        ),
        (
            "train.max_steps" if t.max_steps is not None else "train.epochs",
            t.max_steps if t.max_steps is not None else t.epochs,
            steps_ok,
            "an integer > 0",
        ),
        ("train.grad_clip_norm", t.grad_clip_norm, t.grad_clip_norm >= 0, ">= 0 (0 disables)"),
        ("train.label_smoothing", t.label_smoothing, 0 <= t.label_smoothing < 1, "in [0, 1)"),
        ("train.seed", t.seed, t.seed >= 0, ">= 0"),
        ("log.every", cfg.log.every, cfg.log.every >= 1, ">= 1"),
        (
            "log.consensus_every",
            cfg.log.consensus_every,
            cfg.log.consensus_every >= 0,
            ">= 0 (0 = only at evaluations)",
        ),
        (
            "log.consensus_sketch",
            cfg.log.consensus_sketch,
            _is_int(cfg.log.consensus_sketch) and cfg.log.consensus_sketch >= 0,
            "an integer >= 0 (0 = no sketch)",
        ),
        (
            "checkpoint.every_steps",
            cfg.checkpoint.every_steps,
            cfg.checkpoint.every_steps >= 0,
            ">= 0 (0 = off)",
        ),
        ("checkpoint.keep", cfg.checkpoint.keep, cfg.checkpoint.keep >= 1, ">= 1"),
        (
            "dist.backend",
            cfg.dist.backend,
            cfg.dist.backend in (None, "nccl", "gloo"),
            "nccl, gloo or null (auto)",
        ),
        ("dist.timeout_s", cfg.dist.timeout_s, cfg.dist.timeout_s > 0, "> 0"),
        ("dataset.num_workers", d.num_workers, d.num_workers >= 0, ">= 0"),
        (
            "dataset.alpha",
            d.alpha,
            d.partition != "dirichlet" or d.alpha > 0,
            "> 0 for the dirichlet partition",
        ),
        ("topology.local_world_size", lws, lws is None or lws >= 1, ">= 1 or null"),
        ("topology.bucket_size_in_mb", topo.bucket_size_in_mb, topo.bucket_size_in_mb > 0, "> 0"),
    ]
    if s.name == "cosine_warmup":
        rules += [
            ("scheduler.warmup_epochs", s.warmup_epochs, s.warmup_epochs >= 0, ">= 0"),
            ("scheduler.eta_min", s.eta_min, s.eta_min >= 0, ">= 0"),
            ("scheduler.warmup_decay", s.warmup_decay, 0 < s.warmup_decay <= 1, "in (0, 1]"),
        ]
    elif s.name == "step":
        rules += [
            ("scheduler.step_size_epochs", s.step_size_epochs, s.step_size_epochs > 0, "> 0"),
            ("scheduler.gamma", s.gamma, s.gamma > 0, "> 0"),
        ]
    for key, value, valid, allowed in rules:
        if not valid:
            raise ConfigError(f"{key}={value} is invalid; it must be {allowed}")
    check_dataset(d)
    check_model(cfg.model)

    # the factories check their own hyper-parameters (lr >= 0, betas, accum_iter, ...)
    try:
        OPTIM_FNS[str(cfg.optim.name)]([(torch.zeros(2, 2), "probe")], **_optim_hyper(cfg.optim))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"optim={cfg.optim.name}: {exc}") from None
    if topo.name != ALLREDUCE:
        try:
            TopologyReg.create(
                str(topo.name), world_size, topo.local_world_size, **dict(topo.kwargs)
            )
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"topology={topo.name} with world size {world_size}: {exc}") from None
    try:
        profile_from_cfg(cfg.network)
    except ValueError as exc:
        raise ConfigError(f"network={cfg.network.name}: {exc}") from None


def config_hash(cfg: DictConfig) -> str:
    """A short hash of the resolved config without the ``hydra`` node.

    Args:
        cfg: The composed config.

    Returns:
        16 hex digits; equal on every rank iff every rank resolved the same config.
    """
    container = plain(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    container.pop("hydra", None)
    text = json.dumps(container, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------ job agreement


@dataclass
class _Job:
    run_dir: Path
    run_name: str | None
    group: str | None
    config_hash: str
    config: dict[str, Any]


def _hydra_view() -> dict[str, Any]:
    """Run directory, sweep directory and overrides of the current Hydra job, if any."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        output_dir = hc.runtime.output_dir
    except Exception:  # not under @hydra.main (e.g. compose() in tests)
        return {}
    multirun = str(hc.mode).endswith("MULTIRUN")
    return {
        "run_dir": str(output_dir),
        "sweep_dir": str(hc.sweep.dir) if multirun else None,
        "overrides": list(hc.overrides.task),
    }


def _agree_on_job(cfg: DictConfig, run_dir: str | os.PathLike[str] | None, world_size: int) -> _Job:
    """One collective: check the config hash and adopt rank 0's directories and names."""
    view = _hydra_view()
    mine = {
        "hash": config_hash(cfg),
        "run_dir": str(run_dir) if run_dir is not None else view.get("run_dir"),
        "sweep_dir": view.get("sweep_dir"),
        "overrides": view.get("overrides"),
        "now": time.strftime("%Y-%m-%d/%H-%M-%S"),
    }
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    differ = [r for r, g in enumerate(gathered) if g["hash"] != gathered[0]["hash"]]
    if differ:
        raise ConfigError(
            f"the resolved config of rank(s) {differ} differs from rank 0's; "
            "launch every rank with the same command line and config files"
        )
    chosen = gathered[0]
    folder = Path(chosen["run_dir"] or Path("outputs") / chosen["now"])
    sweep = chosen["sweep_dir"]
    group = "_".join(Path(sweep).parts[-2:]) if sweep else None
    name = run_name_from_overrides(chosen["overrides"]) if chosen["overrides"] is not None else None
    config = plain(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    config.pop("hydra", None)
    return _Job(folder, name, group, chosen["hash"], config)


# ------------------------------------------------------------------ helpers


def _all_reduce(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


@dataclass
class _History:
    """What the summary averages, saved in checkpoints so a resumed run sums the same."""

    samples_per_s: list[float] = field(default_factory=list)
    consensus: list[float] = field(default_factory=list)
    last_loss: float | None = None
    skipped: int = 0


# ------------------------------------------------------------------ the run


def _planned_world_size() -> int:
    """The world size ``initialize_dist`` will create (or has created)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer") from None


def run(cfg: DictConfig, run_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Train and evaluate one configuration; return the summary (also in ``summary.json``).

    Args:
        cfg: The composed config (``conf/config.yaml`` plus overrides).
        run_dir: Where to write; by default Hydra's ``runtime.output_dir`` of
            rank 0 (or ``outputs/<date>/<time>`` outside a Hydra job).

    Returns:
        The summary dict (same on every rank).

    Raises:
        ConfigError: Invalid config (same on every rank, before any collective).
        FloatingPointError: A non-finite loss with ``train.nan_policy=error``.
    """
    wall_start = time.time()
    os.environ.update(slurm_env())
    # a bad value stops every rank alike, before the rendezvous and any collective
    validate(cfg, _planned_world_size())
    rank, world_size = initialize_dist(
        backend=cfg.dist.backend, timeout_s=float(cfg.dist.timeout_s)
    )
    job = _agree_on_job(cfg, run_dir, world_size)
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    trainer: _Trainer | None = None
    ok = False
    try:
        trainer = _Trainer(cfg, job, rank, world_size, wall_start)
        # opened once data and model exist, so a job that cannot start leaves no empty run behind
        trainer.logger = MetricsLogger(
            job.run_dir,
            enabled=rank == 0,
            wandb_cfg=cfg.logger,
            config=job.config,
            run_name=job.run_name,
            group=job.group,
        )
        summary = trainer.fit()
        ok = True
        return summary
    finally:
        if trainer is not None:
            try:
                trainer.close()
            except Exception:
                if ok:
                    raise
                # after an error (a lost peer, say) the first error is the one to report
                log.warning("closing the job after an error failed too", exc_info=True)
        # only a clean job waits for its peers; after an error a peer may never arrive
        if ok and dist.is_initialized():
            dist.barrier()


class _Trainer:
    """State of one job: data, model, wrapper, optimizer and bookkeeping."""

    def __init__(
        self,
        cfg: DictConfig,
        job: _Job,
        rank: int,
        world_size: int,
        wall_start: float,
    ) -> None:
        self.cfg, self.job, self.rank, self.world_size = cfg, job, rank, world_size
        self.wall_start = wall_start
        self.logger = MetricsLogger(job.run_dir, enabled=False)
        self.device = get_device()
        self.topology = str(cfg.topology.name)
        self.decentralized = self.topology != ALLREDUCE
        self.ckpt_root = job.run_dir / CHECKPOINT_DIR
        self.history = _History()
        self.window = TrainWindow(self.device)
        self.clock = WindowClock(self.device)
        self._handles: list[Any] = []  # hooks this job put on the model and optimizer
        # the device flag that the gradient hooks of nan_policy=skip read
        self._loss_finite: torch.Tensor | None = None
        self._optimizer_stepped = False
        self.step = 0
        self.time_offset = 0.0
        self.resumed_from: int | None = None
        self.last_eval: dict[str, float] = {}
        self.last_eval_step = -1

        t = cfg.train
        torch.manual_seed(int(t.seed))
        random.seed(int(t.seed))
        self.data = build_data(
            cfg.dataset,
            rank=rank,
            world_size=world_size,
            batch_size=int(t.batch_size),
            seed=int(t.seed),
            device=self.device,
        )
        self.steps_per_epoch = len(self.data.train)
        self.total_steps = (
            int(t.max_steps) if t.max_steps is not None else int(t.epochs) * self.steps_per_epoch
        )
        model = build_model(
            cfg.model,
            num_classes=self.data.num_classes,
            in_channels=self.data.in_channels,
            image_size=self.data.image_size,
        ).to(self.device)
        self.channels_last = bool(cfg.model.get("channels_last", False))
        # dropout and other model randomness differ per rank; the data order has its own generators
        torch.manual_seed(int(t.seed) * 1000 + rank)
        self._setup_amp()
        self._wrap(model)
        try:
            self.criterion = nn.CrossEntropyLoss(label_smoothing=float(t.label_smoothing))
            self.network = apply_network(cfg.network, self.model, world_size)
            if str(t.nan_policy) == "skip":
                self._mask_nonfinite_grads()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the hooks, the wrapper and the metrics sinks; safe to call twice."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        try:
            model = getattr(self, "model", None)
            if hasattr(model, "close"):  # the wrapper frees its hooks, groups and buffers
                model.close()
        finally:
            self.logger.close()

    # ---------------------------------------------------------------- setup
    def _setup_amp(self) -> None:
        amp = str(self.cfg.train.amp)
        self.amp_dtype: torch.dtype | None = None
        self.scaler: Any = None
        if amp == "off":
            return
        if self.device.type != "cuda":
            log.warning("train.amp=%s is ignored on %s; training in float32", amp, self.device.type)
            return
        self.amp_dtype = torch.bfloat16 if amp == "bf16" else torch.float16
        if amp == "fp16":
            self.scaler = torch.amp.GradScaler("cuda")

    def _optim_fn(self) -> Any:
        return partial(OPTIM_FNS[str(self.cfg.optim.name)], **_optim_hyper(self.cfg.optim))

    def _scheduler_fn(self) -> Any:
        s, spe, total = self.cfg.scheduler, self.steps_per_epoch, self.total_steps
        name = str(s.name)
        if name == "cosine_warmup":
            warmup = min(total, round(float(s.warmup_epochs) * spe))
            return partial(
                SCHEDULER_FNS[name],
                t_max=total,
                t_warmup=warmup,
                eta_min=float(s.eta_min),
                warmup_decay=float(s.warmup_decay),
            )
        if name == "step":
            step_size = max(1, round(float(s.step_size_epochs) * spe))
            return partial(SCHEDULER_FNS[name], step_size=step_size, gamma=float(s.gamma))
        return SCHEDULER_FNS[name]

    def _wrap(self, model: nn.Module) -> None:
        topo = self.cfg.topology
        self.params = list(model.parameters())
        self.module = model
        if self.decentralized:
            self.model: nn.Module = DecentralizedDataParallel(
                model,
                self._optim_fn(),
                self._scheduler_fn(),
                topology=self.topology,
                scaler=self.scaler,
                grad_clip_norm=float(self.cfg.train.grad_clip_norm),
                sync_buffer_in_global_avg=bool(topo.sync_buffer_in_global_avg),
                bucket_size_in_mb=float(topo.bucket_size_in_mb),
                local_world_size=topo.local_world_size,
                topology_kwargs=dict(topo.kwargs),
            )
            self.optimizer: Any = None
            self.scheduler: Any = None
        else:
            self.model = DistributedDataParallel(
                model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=float(topo.bucket_size_in_mb),
            )
            self.optimizer = self._optim_fn()(list(model.named_parameters()))
            self.scheduler = self._scheduler_fn()(self.optimizer)
            # GradScaler.step skips optimizer.step on overflow; this is how the loop learns of it
            self._handles.append(self.optimizer.register_step_post_hook(self._note_step))

    def _note_step(self, *_: Any) -> None:
        self._optimizer_stepped = True

    def _mask_nonfinite_grads(self) -> None:
        """nan_policy=skip: zero every gradient of a step whose loss is not finite, on the device.

        The hooks run before the gradient reaches ``.grad``, so before the wrapper's
        step hooks and before DDP's all-reduce: the rank contributes exact zeros.
        """

        def mask(grad: torch.Tensor) -> torch.Tensor:
            finite = self._loss_finite
            return grad if finite is None else torch.where(finite, grad, 0.0)

        for p in self.params:
            if p.requires_grad:
                self._handles.append(p.register_hook(mask))

    @property
    def ddp(self) -> DecentralizedDataParallel:
        assert isinstance(self.model, DecentralizedDataParallel)
        return self.model

    # ---------------------------------------------------------------- state
    def _training_state(self) -> dict[str, Any]:
        if self.decentralized:
            return self.ddp.training_state_dict()
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def _load_training_state(self, state: dict[str, Any]) -> None:
        if self.decentralized:
            self.ddp.load_training_state_dict(state)
            return
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])

    def _load_model(self, state: dict[str, Any]) -> None:
        if self.decentralized:
            self.ddp.load_state_dict(state)
        else:
            self.module.load_state_dict(state)

    def _rng_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def _save(self) -> None:
        epoch, batch = divmod(self.step, self.steps_per_epoch)
        shard = {
            "model": self.module.state_dict(),
            "training": self._training_state(),
            "rng": self._rng_state(),
            "step": self.step,
            "epoch": epoch,
            "batch": batch,
            "time_s": self._elapsed(),
            "window": self.window.state(),
            "history": {
                "samples_per_s": list(self.history.samples_per_s),
                "consensus": list(self.history.consensus),
                "last_loss": self.history.last_loss,
                "skipped": self.history.skipped,
            },
        }
        meta = {
            "step": self.step,
            "world_size": self.world_size,
            "topology": self.topology,
            "config_hash": self.job.config_hash,
        }
        save_checkpoint(self.ckpt_root, self.step, shard, meta, keep=int(self.cfg.checkpoint.keep))

    def _resume(self) -> None:
        info = latest_checkpoint(self.ckpt_root)
        seen: list[Any] = [None] * self.world_size
        dist.all_gather_object(seen, None if info is None else info.step)
        if len(set(seen)) > 1:
            raise RuntimeError(
                f"ranks see different latest checkpoints in {self.ckpt_root} (steps {seen}); "
                "every rank must see the same checkpoint directory"
            )
        if info is None:
            return
        self.resumed_from = info.step
        if check_compatible(
            info,
            world_size=self.world_size,
            topology=self.topology,
            allow_reshard=bool(self.cfg.checkpoint.allow_reshard),
        ):
            # a new world size or topology cannot reuse per-rank state: restart from the mean
            self._load_model(global_average_from_checkpoint(info, key="model"))
            log.warning(
                "resharded: every worker starts from the global average of the checkpoint at step %d "
                "(optimizer state, schedule and data position start afresh)",
                info.step,
            )
            if int(self.cfg.checkpoint.every_steps) > 0:
                self._retire_old_layout(info.step, info.world_size)
            return
        shard = load_shard(info, self.rank)
        self._load_model(shard["model"])
        self._load_training_state(shard["training"])
        torch.set_rng_state(shard["rng"]["torch"])
        if "cuda" in shard["rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(shard["rng"]["cuda"], self.device)
        self.step = int(shard["step"])
        self.time_offset = float(shard.get("time_s", 0.0))
        self.window.load_state(shard.get("window", {}))
        h = shard.get("history", {})
        self.history = _History(
            samples_per_s=[float(v) for v in h.get("samples_per_s", [])],
            consensus=[float(v) for v in h.get("consensus", [])],
            last_loss=h.get("last_loss"),
            skipped=int(h.get("skipped", 0)),
        )
        dropped = self.logger.drop_after(self.step)
        log.info(
            "resumed from step %d (%s); %d metrics lines after it will be recomputed",
            info.step,
            info.path,
            dropped,
        )

    def _retire_old_layout(self, step: int, world_size: int) -> None:
        """Save step 0 of the resharded run, then move the old layout's checkpoints aside.

        Left in place, their higher steps would stay the latest, so a crash before this
        run passed them would reshard again instead of resuming it. They are moved oldest
        first, so a crash in between leaves the same newest one to reshard from.
        """
        with warnings.catch_warnings():  # the old checkpoints are newer, for a moment
            warnings.filterwarnings("ignore", message=".*holds complete checkpoints newer")
            self._save()
        aside = self.ckpt_root / f"before_reshard_step{step}_ws{world_size}"
        error: str | None = None
        if self.rank == 0:
            try:
                aside.mkdir(exist_ok=True)
                for old in list_checkpoints(self.ckpt_root):
                    if old.step != self.step:
                        os.replace(old.path, aside / old.path.name)
            except OSError as exc:
                error = f"{type(exc).__name__}: {exc}"
        # gathered rather than a barrier, so that a failure on rank 0 stops every rank
        errors: list[str | None] = [None] * self.world_size
        dist.all_gather_object(errors, error)
        if errors[0] is not None:
            raise RuntimeError(f"could not move the old checkpoints to {aside}: {errors[0]}")
        log.info("moved the checkpoints of the old layout to %s", aside)

    # ---------------------------------------------------------------- metrics
    def _elapsed(self) -> float:
        return self.time_offset + (time.time() - self.train_start)

    def _line(self, **metrics: Any) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.step / self.steps_per_epoch,
            "time_s": self._elapsed(),
            **metrics,
        }

    def _log_class_histogram(self) -> None:
        hists: list[Any] = [None] * self.world_size
        dist.all_gather_object(hists, [int(c) for c in self.data.class_histogram])
        if self.rank == 0:
            self.logger.log(self._line(**{"data/class_histogram": hists}))
            for r, h in enumerate(hists):
                log.info("rank %d class histogram: %s", r, h)

    def _log_train(self, window_time: float, window_steps: int) -> dict[str, Any]:
        """The metrics line of the window that ends now (one small all-reduce)."""
        timers = self.ddp.pop_timers() if self.decentralized else {}
        keys = sorted(timers)
        extra = torch.tensor([timers[k] for k in keys], dtype=torch.float64)
        both = torch.cat([self.window.sums(), extra.to(self.device)])
        dist.all_reduce(both)
        totals = both.tolist()
        line = self._line()
        if totals[1] > 0:
            line["train/loss"] = totals[0] / totals[1]
            self.history.last_loss = line["train/loss"]
        if totals[3] > 0:
            line["train/acc"] = totals[2] / totals[3]
        line["train/lr"] = (
            self.ddp.current_lr()
            if self.decentralized
            else float(self.optimizer.param_groups[0]["lr"])
        )
        if window_time > 0 and window_steps > 0:
            sps = self.world_size * int(self.cfg.train.batch_size) * window_steps / window_time
            line["perf/samples_per_s"] = sps
            line["perf/step_s"] = window_time / window_steps
            self.history.samples_per_s.append(sps)
        # the wrapper's timers: seconds per step, averaged over ranks
        for k, total in zip(keys, totals[4:]):
            line[k] = total / self.world_size / max(window_steps, 1)
        self.window.reset()
        return line

    def _consensus(self, sketch: int | None = None) -> float:
        """Consensus distance (a collective); 0 under allreduce, whose workers agree exactly."""
        if not self.decentralized:
            return 0.0
        return self.ddp.consensus_distance(sketch=sketch)

    def _check_finite(self) -> None:
        """Read the non-finite-loss record of the steps since the last host phase.

        Under ``nan_policy=error`` every rank learns of every rank's record (one
        all-gather) and all stop with the same message, so none waits for a peer
        that has stopped.
        """
        count, first = self.window.pop_nonfinite()
        if str(self.cfg.train.nan_policy) != "error":
            if count:
                self.history.skipped += count
                log.warning(
                    "rank %d: %d step(s) up to step %d had a non-finite loss (first at step %d); "
                    "their gradients were replaced by zeros",
                    self.rank,
                    count,
                    self.step,
                    first,
                )
            return
        mine = torch.tensor(
            [math.inf if first is None else float(first)], dtype=torch.float64, device=self.device
        )
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        firsts = torch.cat(gathered).tolist()
        bad = min(range(self.world_size), key=lambda r: (firsts[r], r))
        if math.isinf(firsts[bad]):
            return
        kept = f"; checkpoints in {self.ckpt_root} are kept" if self.ckpt_root.exists() else ""
        raise FloatingPointError(
            f"non-finite loss at step {int(firsts[bad])} on rank {bad}{kept}; "
            "lower optim.lr or set train.nan_policy=skip"
        )

    @torch.no_grad()
    def _evaluate_local(self) -> list[float]:
        """(correct, loss sum, count) of the current parameters on this rank's test shard."""
        module = self.module
        was_training = module.training
        module.eval()
        correct = torch.zeros((), dtype=torch.float64, device=self.device)
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        count = 0
        for x, y in self.data.test:
            if self.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            with self._autocast():
                out = module(x)
            loss += nn.functional.cross_entropy(out.float(), y, reduction="sum").double()
            correct += (out.argmax(dim=1) == y).sum()
            count += y.numel()
        module.train(was_training)
        return [float(correct), float(loss), float(count)]

    def _evaluate(self) -> dict[str, float]:
        if self.decentralized:
            with self.ddp.averaged():
                avg = self._evaluate_local()
            own = self._evaluate_local()
        else:
            # the bare module: test shards may differ in batch count, DDP's forward would not
            avg = own = self._evaluate_local()
        c_avg, l_avg, n, c_own = _all_reduce([avg[0], avg[1], avg[2], own[0]], self.device)
        n = max(n, 1.0)
        result = {"eval/acc": c_avg / n, "eval/acc_local": c_own / n, "eval/loss": l_avg / n}
        result["consensus/distance"] = self._consensus()
        self.history.consensus.append(result["consensus/distance"])
        self.last_eval, self.last_eval_step = result, self.step
        return result

    # ---------------------------------------------------------------- training
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches from the current step on, epoch after epoch, as a pure function of the step."""
        step = self.step
        while step < self.total_steps:
            epoch, start = divmod(step, self.steps_per_epoch)
            for x, y in self.data.train.iterate(epoch, start=start):
                yield x, y
                step += 1
                if step >= self.total_steps:
                    return

    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with self._autocast():
            out = self.model(x)
            loss = self.criterion(out.float(), y)
        # recorded on the device; the next host phase reads it (see _check_finite)
        correct = (out.detach().argmax(dim=1) == y).sum()
        finite = self.window.add(loss, correct, y.numel(), self.step + 1)
        self._loss_finite = finite  # read by the gradient hooks of nan_policy=skip
        backward_loss = self.scaler.scale(loss) if self.scaler is not None else loss
        backward_loss.backward()  # the wrapper steps and gossips inside backward
        if not self.decentralized:
            self._allreduce_step()
        self.step += 1

    def _allreduce_step(self) -> None:
        clip = float(self.cfg.train.grad_clip_norm)
        if self.scaler is not None:
            if clip > 0:
                self.scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.params, clip)
            # GradScaler.step reads its found-inf flag on the host and skips optimizer.step on
            # overflow; the step hook tells us, so no second read is needed
            self._optimizer_stepped = False
            self.scaler.step(self.optimizer)
            self.scaler.update()
            # as in the wrapper: a skipped step holds the schedule back too
            if self._optimizer_stepped:
                self.scheduler.step()
        else:
            if clip > 0:
                nn.utils.clip_grad_norm_(self.params, clip)
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def fit(self) -> dict[str, Any]:
        cfg = self.cfg
        self.train_start = time.time()
        self._resume()
        if self.resumed_from is None and str(cfg.dataset.partition) == "dirichlet":
            self._log_class_histogram()
        log.info(
            "training %s on %s with topology=%s, world size %d: %d steps (%d per epoch), batch %d per worker",
            cfg.model.name,
            cfg.dataset.name,
            self.topology,
            self.world_size,
            self.total_steps,
            self.steps_per_epoch,
            int(cfg.train.batch_size),
        )
        bar = self._progress()
        redirect = logging_redirect_tqdm() if not bar.disable else contextlib.nullcontext()
        self.model.train()
        # the throughput window counts training only: logging, evaluation and saving are excluded
        self.clock.start()
        with redirect:
            for x, y in self._batches():
                self._train_step(x, y)
                bar.update(1)
                self.clock.tick()
                self._after_step(bar)
        bar.close()
        if self.last_eval_step != self.step:  # resumed at the very end: nothing was trained
            self._log_eval()
        return self._finish()

    def _after_step(self, bar: Any) -> None:
        """Hand the step to the host phase if it logs, evaluates or saves; else return at once."""
        cfg, step, last = self.cfg, self.step, self.step == self.total_steps
        every, cons_every = int(cfg.log.every), int(cfg.log.consensus_every)
        ck_every = int(cfg.checkpoint.every_steps)
        log_due = step % every == 0 or last
        eval_due = step % self.steps_per_epoch == 0 or last
        save_due = ck_every > 0 and (step % ck_every == 0 or last)
        # an evaluation line carries the exact value anyway
        cons_due = cons_every > 0 and step % cons_every == 0 and not eval_due
        if log_due or eval_due or save_due or cons_due:
            self._host_phase(bar, log_due, eval_due, save_due, cons_due)

    def _host_phase(
        self, bar: Any, log_due: bool, eval_due: bool, save_due: bool, cons_due: bool
    ) -> None:
        """Everything that reads the device or talks to the host; the same steps on every rank."""
        if log_due:
            seconds, steps = self.clock.close()
        else:
            self.clock.pause()
        self._check_finite()
        line: dict[str, Any] | None = None
        if log_due:
            line = self._log_train(seconds, steps)
            sketch = int(self.cfg.log.consensus_sketch)
            if sketch > 0:
                line["consensus/distance_sketch"] = self._consensus(sketch=sketch)
        if cons_due:
            line = line if line is not None else self._line()
            line["consensus/distance"] = self._consensus()
            self.history.consensus.append(line["consensus/distance"])
        if line is not None:
            self.logger.log(line)
            self._report(bar, line)
        if eval_due:
            self._log_eval()
        if save_due:
            self._save()
        self.clock.resume()

    def _log_eval(self) -> None:
        result = self._evaluate()
        self.logger.log(self._line(**result))
        log.info(
            "step %d epoch %.2f: eval/acc %.4f eval/acc_local %.4f",
            self.step,
            self.step / self.steps_per_epoch,
            result["eval/acc"],
            result["eval/acc_local"],
        )

    def _progress(self) -> Any:
        return tqdm(
            total=self.total_steps,
            initial=self.step,
            disable=not (self.rank == 0 and bool(self.cfg.log.progress)),
            dynamic_ncols=True,
            desc=self.topology,
        )

    def _report(self, bar: Any, line: dict[str, Any]) -> None:
        shown = {
            k.split("/")[-1]: line[k] for k in ("train/loss", "perf/samples_per_s") if k in line
        }
        if bar.disable:
            if "train/loss" in line:
                log.info(
                    "step %d: loss %.4f, %.0f samples/s",
                    line["step"],
                    line["train/loss"],
                    line.get("perf/samples_per_s", float("nan")),
                )
        else:
            bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()}, refresh=False)

    def _finish(self) -> dict[str, Any]:
        cfg, h = self.cfg, self.history
        summary: dict[str, Any] = {
            "topology": self.topology,
            "world_size": self.world_size,
            "train/steps": self.step,
            "train/loss": h.last_loss,
            "train/skipped_steps": h.skipped,
            "eval/acc": self.last_eval.get("eval/acc"),
            "eval/acc_local": self.last_eval.get("eval/acc_local"),
            "eval/loss": self.last_eval.get("eval/loss"),
            "perf/samples_per_s": sum(h.samples_per_s) / len(h.samples_per_s)
            if h.samples_per_s
            else None,
            "consensus/distance": sum(h.consensus) / len(h.consensus) if h.consensus else None,
            "wall_time_s": time.time() - self.wall_start,
            "dataset": str(cfg.dataset.name),
            "model": str(cfg.model.name),
            "optim": str(cfg.optim.name),
            "network": str(cfg.network.name),
            "emulated": bool(self.network),
            "synthetic": bool(self.data.synthetic),
            "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            "resumed_from_step": self.resumed_from,
            "seed": int(cfg.train.seed),
            "batch_size": int(cfg.train.batch_size),
            "global_batch_size": int(cfg.train.batch_size) * self.world_size,
            "epochs": self.step / self.steps_per_epoch,
            "config_hash": self.job.config_hash,
            "run_dir": str(self.job.run_dir),
        }
        # rank 0's timings are the reference; every rank returns the same dict
        box = [json_safe(summary)]
        dist.broadcast_object_list(box, src=0)
        summary = box[0]
        if self.rank == 0:
            path = self.job.run_dir / SUMMARY_FILE
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            os.replace(tmp, path)
            self.logger.summary(summary)
            log.info(
                "done: eval/acc %.4f, eval/acc_local %.4f after %d steps; %s",
                summary["eval/acc"],
                summary["eval/acc_local"],
                summary["train/steps"],
                path,
            )
        return summary
