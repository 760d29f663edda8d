"""One Hydra job is one call of :func:`run`: check, agree, build, train, summarise.

``torchrun --standalone --nproc_per_node=4 train.py topology=ring`` (or ``make
train``) calls ``run(cfg)`` on every rank, which goes through the same stages
on each:

1. Validate the config (:func:`validate`) with no communication at all, so a
   bad value raises the same one-line :class:`ConfigError` on every rank and
   nothing waits for a peer that has already stopped. A section naming a
   user's class or function by ``_target_`` is typed first, then imported and
   built (:mod:`experiments.train.targets`). Under SLURM without torchrun the
   torchrun variables are first derived from SLURM's (:func:`slurm_env`).
2. Set up the process group once per process
   (:func:`decent_dp.utils.initialize_dist`; later jobs of a multirun reuse it).
3. One ``all_gather_object``: the hash of the resolved config
   (:func:`config_hash`) must match on every rank, and every rank adopts rank
   0's run directory (Hydra resolves it per process) and wandb names.
4. Build the :class:`~experiments.train.trainer.Trainer`: data, model, the
   parallel wrapper and its optimizer (:mod:`experiments.train.step`),
   checkpoints, metrics and evaluation; then open the metrics sinks
   (:mod:`experiments.train.logger`).
5. ``Trainer.fit()``: resume from the newest complete checkpoint in
   ``<run dir>/checkpoints``, train for ``train.max_steps`` (or
   ``train.epochs``) steps, log, evaluate, checkpoint, write ``summary.json``.
   On SIGTERM or the pre-emption signal every rank saves the checkpoint of an
   agreed step and exits to be requeued (:mod:`experiments.train.preempt`).
6. Close the wrapper and the metrics sinks, in a ``finally``; a clean job
   ends with a barrier.

A little past 500 lines as one unit: the stages above, and the checks of
stage 1 that need the whole config at once (each group's own checks live
with its schema).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from decent_dp.optim import check_state_sync
from decent_dp.utils import get_device, initialize_dist
from experiments.network.netem import profile_from_cfg
from experiments.schema import require
from experiments.train.config import (
    ALLREDUCE,
    ConfigError,
    check_dataset,
    check_model,
    plain,
    state_sync_arg,
)
from experiments.train.elastic import ElasticHost
from experiments.train.engine import engine_workers, is_packed
from experiments.train.fault_tolerance import check_fault_tolerance, is_elastic
from experiments.train.logger import MetricsLogger, run_name_from_overrides
from experiments.train.optim import build_optim_fn
from experiments.train.outer import outer_every
from experiments.train.packed import check_engine
from experiments.train.peer_loss import PeerLostError, comm_failure
from experiments.train.preempt import preemption_signal
from experiments.train.targets import build_topology, check_targets, resolve_targets
from experiments.train.task import task_for
from experiments.train.trainer import Trainer, per_worker_batch

__all__ = ["run", "validate", "config_hash", "slurm_env", "ConfigError"]

log = logging.getLogger(__name__)


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


def _at_least(key: str, value: Any, low: int, note: str = "") -> tuple[str, Any, bool, str]:
    """A rule of :func:`validate`: ``value >= low``."""
    return (key, value, value >= low, f">= {low}{note}")


def validate(cfg: DictConfig, world_size: int) -> None:
    """Check every value that could make the run fail later, without communicating.

    The same config and world size give the same outcome on every rank, so
    all ranks stop together with the same message.

    A ``_target_`` section is imported and built here too (the dataset's splits are kept
    for the job's build).

    Args:
        cfg: The composed config.
        world_size: Number of ranks.

    Raises:
        ConfigError: A one-line message naming the key, the bad value and what is allowed.
    """
    cfg = resolve_targets(cfg)
    check_fault_tolerance(cfg, world_size)  # what cannot be elastic, first
    check_engine(cfg, world_size)  # what packed workers cannot do, and their one process
    workers = engine_workers(cfg, world_size)
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
        _at_least("log.every", cfg.log.every, 1),
        _at_least("log.consensus_every", cfg.log.consensus_every, 0, " (0 = only at evaluations)"),
        (
            "log.consensus_sketch",
            cfg.log.consensus_sketch,
            _is_int(cfg.log.consensus_sketch) and cfg.log.consensus_sketch >= 0,
            "an integer >= 0 (0 = no sketch)",
        ),
        _at_least("checkpoint.every_steps", cfg.checkpoint.every_steps, 0, " (0 = off)"),
        _at_least("checkpoint.keep", cfg.checkpoint.keep, 1),
        _at_least("checkpoint.signal_check_every", cfg.checkpoint.signal_check_every, 1),
        (
            "dist.backend",
            cfg.dist.backend,
            cfg.dist.backend in (None, "nccl", "gloo"),
            "nccl, gloo or null (auto)",
        ),
        ("dist.timeout_s", cfg.dist.timeout_s, cfg.dist.timeout_s > 0, "> 0"),
        ("topology.local_world_size", lws, lws is None or lws >= 1, ">= 1 or null"),
        ("topology.bucket_size_in_mb", topo.bucket_size_in_mb, topo.bucket_size_in_mb > 0, "> 0"),
        ("log.peak_flops", cfg.log.peak_flops, cfg.log.peak_flops > 0, "> 0"),
    ]
    pph = cfg.network.get("procs_per_host", 1)
    rules.append(
        (
            "network.procs_per_host",
            pph,
            _is_int(pph) and pph >= 1 and world_size % pph == 0,
            f"an integer >= 1 dividing the world size {world_size}",
        )
    )
    if s.name == "cosine_warmup":
        steps = s.get("warmup_steps")
        rules += [
            ("scheduler.warmup_epochs", s.warmup_epochs, s.warmup_epochs >= 0, ">= 0"),
            ("scheduler.warmup_steps", steps, steps is None or steps >= 0, ">= 0 or null"),
            ("scheduler.eta_min", s.eta_min, s.eta_min >= 0, ">= 0"),
            ("scheduler.warmup_decay", s.warmup_decay, 0 < s.warmup_decay <= 1, "in (0, 1]"),
        ]
    elif s.name == "step":
        rules += [
            ("scheduler.step_size_epochs", s.step_size_epochs, s.step_size_epochs > 0, "> 0"),
            ("scheduler.gamma", s.gamma, s.gamma > 0, "> 0"),
        ]
    comp = cfg.get("compression")
    if comp is not None:
        rules += [
            ("compression.ratio", comp.ratio, 0 < comp.ratio <= 1, "in (0, 1]"),
            (
                "compression.name",
                comp.name,
                str(comp.name) == "none" or str(topo.name) != ALLREDUCE,
                "none with topology=allreduce (torch DDP all-reduces exact gradients)",
            ),
        ]
    for key in ("cudnn_benchmark", "tf32"):
        value = t.get(key, True)
        rules.append((f"train.{key}", value, isinstance(value, bool), "true or false"))
    shards = t.get("shard_size", 1)
    rules.append(
        (
            "train.shard_size",
            shards,
            _is_int(shards) and shards >= 1 and world_size % shards == 0,
            f"an integer >= 1 dividing the world size {world_size}",
        )
    )
    if _is_int(shards) and shards > 1:
        rules.append(
            (
                "train.nan_policy",
                t.nan_policy,
                str(t.nan_policy) == "error",
                "error with train.shard_size > 1 (skip's gradient hooks sit on the "
                "parameters autograd sees, which FSDP replaces by unsharded ones)",
            )
        )
        # sharded replicas are checkpointed through decent_dp.save_sharded_checkpoint,
        # which keeps neither HSDP's optimizer, nor compressed gossip, nor outer copies
        comp_name = str(comp.name) if comp is not None else "none"
        outer_name = str(cfg.outer.name) if cfg.get("outer") is not None else "none"
        blocker = (
            "topology=allreduce"
            if str(topo.name) == ALLREDUCE
            else f"compression={comp_name}"
            if comp_name != "none"
            else f"outer={outer_name}"
            if outer_name != "none"
            else None
        )
        why = "(sharded checkpoints need a gossip topology, exact gossip and no outer optimizer)"
        rules.append(
            (
                "checkpoint.every_steps",
                cfg.checkpoint.every_steps,
                cfg.checkpoint.every_steps == 0 or blocker is None,
                f"0 with train.shard_size > 1 and {blocker} {why}",
            )
        )
        # a stop on a signal saves a checkpoint first: with none to save, it would be ignored
        rules.append(
            (
                "checkpoint.on_signal",
                cfg.checkpoint.on_signal,
                not cfg.checkpoint.on_signal or blocker is None,
                f"false with train.shard_size > 1 and {blocker} {why}",
            )
        )
    for rule in rules:
        require(*rule)
    check_dataset(d)
    check_model(cfg.model)
    per_worker_batch(t, workers)
    # images or tokens: the dataset and the model must agree (block size, vocabulary)
    task_for(cfg).check(cfg)

    # the factories check their own hyper-parameters (lr >= 0, betas, accum_iter, ...)
    try:
        build_optim_fn(cfg.optim)([(torch.zeros(2, 2), "probe")])
    except ConfigError:  # a _target_'s own line
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"optim={cfg.optim.name}: {exc}") from None
    # with train.shard_size, the topology is over the replicas (packed: check_engine built it)
    if not is_packed(cfg):
        build_topology(topo, world_size // shards)
    outer_every(cfg.get("outer"), topo)  # its own one-line errors
    sync = state_sync_arg(cfg.optim.get("state_sync"))
    if sync:
        try:
            check_state_sync(sync)
        except ValueError as exc:
            raise ConfigError(f"optim.state_sync: {exc}") from None
        require(
            "optim.state_sync",
            sync,
            str(topo.name) != ALLREDUCE,
            "empty with topology=allreduce (one optimizer state for every worker)",
        )
        outer_name = str(cfg.outer.name) if cfg.get("outer") is not None else "none"
        require("optim.state_sync", sync, outer_name == "none", "empty with an outer optimizer")
    if cfg.checkpoint.on_signal:
        preemption_signal()  # a bad SUBMITIT_PREEMPT_SIGNAL: its own one-line ConfigError
    try:
        profile_from_cfg(cfg.network)
    except ValueError as exc:
        raise ConfigError(f"network={cfg.network.name}: {exc}") from None
    check_targets(cfg)  # last: it imports the user's code and builds the dataset


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
    hosts: list[str]  # each rank's host, to name the ones lost


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


def host_label() -> str:
    """This process's host: the testbed's ``host <i>`` (its hosts share a hostname), else the hostname."""
    testbed = os.environ.get("TESTBED_HOST")
    return f"host {testbed}" if testbed is not None else socket.gethostname()


def _elastic_job(
    cfg: DictConfig, run_dir: str | os.PathLike[str] | None, host: ElasticHost
) -> _Job:
    """An elastic host's job: its own directory under the run directory, no collective.

    Every host is rank 0 of a world of one; what the hosts share goes through their
    quorum (:mod:`experiments.train.elastic`).
    """
    view = _hydra_view()
    folder = run_dir or view.get("run_dir") or Path("outputs") / time.strftime("%Y-%m-%d/%H-%M-%S")
    config = plain(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    config.pop("hydra", None)
    return _Job(Path(folder) / host.name, host.name, None, config_hash(cfg), config, [host_label()])


def _agree_on_job(cfg: DictConfig, run_dir: str | os.PathLike[str] | None, world_size: int) -> _Job:
    """One collective: check the config hash and adopt rank 0's directories and names."""
    view = _hydra_view()
    mine = {
        "hash": config_hash(cfg),
        "run_dir": str(run_dir) if run_dir is not None else view.get("run_dir"),
        "sweep_dir": view.get("sweep_dir"),
        "overrides": view.get("overrides"),
        "now": time.strftime("%Y-%m-%d/%H-%M-%S"),
        "host": host_label(),
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
    return _Job(folder, name, group, chosen["hash"], config, [g["host"] for g in gathered])


# ------------------------------------------------------------------ the run


def _planned_world_size() -> int:
    """The world size ``initialize_dist`` will create (or has created)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer") from None


def set_backend_flags(train_cfg: Any, device: torch.device) -> dict[str, bool]:
    """Apply ``train.cudnn_benchmark`` and ``train.tf32`` on CUDA; change nothing elsewhere.

    Args:
        train_cfg: The ``train`` section (keys left out count as ``true``).
        device: This rank's device.

    Returns:
        The flags set, by their torch name; empty off CUDA.
    """
    if device.type != "cuda":
        return {}
    benchmark = bool(train_cfg.get("cudnn_benchmark", True))
    tf32 = bool(train_cfg.get("tf32", True))
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return {
        "cudnn.benchmark": benchmark,
        "cuda.matmul.allow_tf32": tf32,
        "cudnn.allow_tf32": tf32,
    }


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
    cfg = resolve_targets(cfg)
    # a bad value stops every rank alike, before the rendezvous and any collective
    validate(cfg, _planned_world_size())
    host: ElasticHost | None = None
    if is_elastic(cfg):  # one replica of an elastic job per host: no process group of its own
        host = ElasticHost.from_config(cfg)
        rank, world_size = 0, 1
        job = _elastic_job(cfg, run_dir, host)
    else:
        rank, world_size = initialize_dist(
            backend=cfg.dist.backend, timeout_s=float(cfg.dist.timeout_s)
        )
        job = _agree_on_job(cfg, run_dir, world_size)
    set_backend_flags(cfg.train, get_device())
    # the trainer's modules log through the package's logger: rank 0 informs, all ranks warn
    logging.getLogger("experiments.train").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    trainer: Trainer | None = None
    ok = False
    try:
        trainer = Trainer(cfg, job.run_dir, job.config_hash, rank, world_size, wall_start, host)
        # opened once data and model exist, so a job that cannot start leaves no empty run behind
        sink = MetricsLogger(
            job.run_dir,
            enabled=rank == 0,
            wandb_cfg=cfg.logger,
            config=job.config,
            run_name=job.run_name,
            group=job.group,
        )
        trainer.metrics.open(sink)
        try:
            summary = trainer.fit()
        except PeerLostError as exc:
            raise exc.on_hosts(job.hosts, rank) from exc
        except RuntimeError as exc:  # a collective of every rank (metrics, evaluation, saving)
            reason = comm_failure(exc)
            if reason is None:
                raise
            others = [r for r in range(world_size) if r != rank]
            raise PeerLostError(trainer.step, others, reason, job.hosts, rank) from exc
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
