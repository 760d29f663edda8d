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

The checks of stage 1 here are those that need the whole config at once;
each group's own checks live on its schema's dataclass (``__post_init__``),
run once as the config becomes :class:`~experiments.train.config.MainConfig`.
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
from submitit.helpers import TorchDistributedEnvironment
from submitit.slurm.slurm import _parse_node_list

from decent_dp.optim import check_state_sync
from decent_dp.utils import get_device, initialize_dist
from experiments.schema import require
from experiments.train.config import (
    ALLREDUCE,
    ConfigError,
    config_object,
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
    return _parse_node_list(nodelist)[0]  # submitit's reading of SLURM_JOB_NODELIST


def slurm_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The torchrun variables for a rank started by ``srun`` (or submitit) without torchrun.

    In a submitit job they are submitit's (``TorchDistributedEnvironment``: the first
    host of the job, a port drawn from the job id unless ``MASTER_PORT`` is set, the
    tasks per node of an even split). Under a plain ``srun``, or for a given
    ``environ``, submitit has no job to read, so they are derived here from
    ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NTASKS_PER_NODE``,
    the first host of ``SLURM_JOB_NODELIST`` and the job id.

    Args:
        environ: The environment to read; ``os.environ`` by default.

    Returns:
        ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``
        and ``MASTER_PORT``; an empty dict when ``WORLD_SIZE`` is already set or this is
        not a SLURM task.
    """
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" in env or "SLURM_PROCID" not in env:
        return {}
    if environ is None and env.get("SUBMITIT_EXECUTOR") == "slurm":
        job = TorchDistributedEnvironment()
        return {
            "RANK": str(job.rank),
            "WORLD_SIZE": str(job.world_size),
            "LOCAL_RANK": str(job.local_rank),
            "LOCAL_WORLD_SIZE": str(job.local_world_size),
            "MASTER_ADDR": job.master_addr,
            "MASTER_PORT": str(job.master_port),
        }
    # no submitit job (TorchDistributedEnvironment needs one): the same variables from SLURM's
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


def validate(cfg: DictConfig, world_size: int) -> None:
    """Check every value that could make the run fail later, without communicating.

    The same config and world size give the same outcome on every rank, so
    all ranks stop together with the same message. Each group's own values are
    checked by its schema as the config becomes its
    :class:`~experiments.train.config.MainConfig` (:func:`config_object`); what is
    left here are the rules that span groups or need the world size, and the builds
    that check by building (the optimizer, the topology, a ``_target_``).

    A ``_target_`` section is imported and built here too (the dataset's splits are kept
    for the job's build).

    Args:
        cfg: The composed config.
        world_size: Number of ranks.

    Raises:
        ConfigError: A one-line message naming the key, the bad value and what is allowed.
    """
    cfg = resolve_targets(cfg)
    c = config_object(cfg)  # every group's own checks
    check_fault_tolerance(c, world_size)  # what cannot be elastic, first
    check_engine(cfg, world_size)  # what packed workers cannot do, and their one process
    workers = engine_workers(cfg, world_size)
    t, topo = c.train, c.topology
    comp = str(c.compression.name) if c.compression is not None else "none"
    outer = str(c.outer.name) if c.outer is not None else "none"
    allreduce = str(topo.name) == ALLREDUCE
    dividing = f"an integer >= 1 dividing the world size {world_size}"
    pph, shards = c.network.procs_per_host, t.shard_size
    # (key, value, valid, what is allowed)
    rules: list[tuple[str, Any, bool, str]] = [
        ("network.procs_per_host", pph, pph >= 1 and world_size % pph == 0, dividing),
        (
            "compression.name",
            comp,
            comp == "none" or not allreduce,
            "none with topology=allreduce (torch DDP all-reduces exact gradients)",
        ),
        ("train.shard_size", shards, shards >= 1 and world_size % shards == 0, dividing),
    ]
    # the sharded path's rules: nan_policy's too, though it reads train alone, so that the
    # elastic path (check_fault_tolerance) refuses sharding before any of them
    if shards > 1:
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
        blocker = (
            "topology=allreduce"
            if allreduce
            else f"compression={comp}"
            if comp != "none"
            else f"outer={outer}"
            if outer != "none"
            else None
        )
        why = "(sharded checkpoints need a gossip topology, exact gossip and no outer optimizer)"
        every = c.checkpoint.every_steps
        rules.append(
            (
                "checkpoint.every_steps",
                every,
                every == 0 or blocker is None,
                f"0 with train.shard_size > 1 and {blocker} {why}",
            )
        )
        # a stop on a signal saves a checkpoint first: with none to save, it would be ignored
        on_signal = c.checkpoint.on_signal
        rules.append(
            (
                "checkpoint.on_signal",
                on_signal,
                not on_signal or blocker is None,
                f"false with train.shard_size > 1 and {blocker} {why}",
            )
        )
    for rule in rules:
        require(*rule)
    per_worker_batch(cfg.train, workers)
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
        build_topology(cfg.topology, world_size // shards)
    outer_every(cfg.get("outer"), cfg.topology)  # what the outer round needs of the topology
    sync = state_sync_arg(cfg.optim.get("state_sync"))
    if sync:
        try:
            check_state_sync(sync)
        except ValueError as exc:
            raise ConfigError(f"optim.state_sync: {exc}") from None
        require(
            "optim.state_sync",
            sync,
            not allreduce,
            "empty with topology=allreduce (one optimizer state for every worker)",
        )
        require("optim.state_sync", sync, outer == "none", "empty with an outer optimizer")
    if c.checkpoint.on_signal:
        preemption_signal()  # a bad SUBMITIT_PREEMPT_SIGNAL: its own one-line ConfigError
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
