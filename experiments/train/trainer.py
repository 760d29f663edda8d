"""The training loop of one job, over four collaborators that each own one concern.

:class:`Trainer` builds the data and the model, then hands the rest out:

- :class:`~experiments.train.step.TrainStep`: the wrapped model and one step
  (wrapper or ``allreduce`` baseline, AMP, the NaN policy, clipping); under
  ``engine=packed``, :class:`~experiments.train.packed.PackedStep` in its place,
  every worker of the job in this one process;
- :class:`~experiments.train.checkpointer.Checkpointer`: when to save, what,
  and how to resume;
- :class:`~experiments.train.metrics.Metrics`: the metrics window, the lines
  and the summary's history;
- :class:`~experiments.train.evaluation.Evaluator`: the globally averaged and
  local models on the test set, and consensus distance.

Under ``fault_tolerance=torchft`` membership is one more component
(:mod:`experiments.train.elastic`): the job is this host's, a world of one, its
step an :class:`~experiments.train.elastic.ElasticStep` over the elastic wrapper,
whose quorum before each batch may heal the step forward (the batches follow),
and its evaluator an :class:`~experiments.train.elastic.ElasticEvaluator`.

What is learnt (images or tokens: the data, the model, the loss, the
evaluation metrics) is the :class:`~experiments.train.task.Task`'s.

:meth:`Trainer.fit` is the loop. The hot path never waits on the host: a step
only queues work, and everything that reads the device (metrics lines,
evaluation, checkpoints, the non-finite-loss record) happens in a host phase,
on the steps that log, evaluate or save, the same steps on every rank. On
CUDA the throughput windows (``perf/samples_per_s``, ``perf/step_s``) close
after ``torch.cuda.synchronize()``. The one exception is fp16 loss scaling
(see :mod:`experiments.train.step`).

What is due when:

- a training metrics line every ``log.every`` steps and at the end, with the
  sketched ``consensus/distance_sketch`` (``log.consensus_sketch`` numbers);
- an evaluation every epoch and at the end, with the exact
  ``consensus/distance``, which also comes every ``log.consensus_every`` steps;
- a checkpoint every ``checkpoint.every_steps`` steps and at the end;
- every ``checkpoint.signal_check_every`` steps, one all-reduce of two
  integers: did any rank receive SIGTERM or the pre-emption signal? If so,
  every rank saves that step's checkpoint and the job exits to be requeued
  (:mod:`experiments.train.preempt`).

A little past 500 lines as one unit: the choice of collaborators for each
path (distributed, packed, elastic), the loop and its host phase, and the
summary all read the same few fields, and each collaborator keeps its own
policy in its own module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm.contrib.logging import logging_redirect_tqdm

from decent_dp.utils import get_device
from experiments.data.loaders import set_memory_format
from experiments.network.netem import apply_network
from experiments.network.wire import WireCounter
from experiments.schema import ConfigError
from experiments.train.checkpointer import Checkpointer
from experiments.train.config import ALLREDUCE, compression_arg, state_sync_arg
from experiments.train.elastic import ElasticEvaluator, ElasticHost, ElasticStep
from experiments.train.engine import engine_workers, is_packed
from experiments.train.evaluation import Evaluator
from experiments.train.fault_tolerance import is_elastic
from experiments.train.metrics import Metrics, host_tag
from experiments.train.optim import build_optim_fn, build_scheduler_fn
from experiments.train.outer import outer_every, outer_kwargs, outer_section
from experiments.train.packed import PackedData, PackedStep
from experiments.train.preempt import StopRequest
from experiments.train.sharding import build_mesh, shard_model
from experiments.train.step import TrainStep
from experiments.train.task import task_for

__all__ = ["Trainer", "CHECKPOINT_DIR", "per_worker_batch", "restart_count"]

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"


def per_worker_batch(train_cfg: Any, world_size: int) -> int:
    """Samples per worker per step: ``train.global_batch_size / world_size`` when set.

    Args:
        train_cfg: The ``train`` config section.
        world_size: Number of ranks.

    Returns:
        ``train.batch_size``, or the global batch split evenly over the ranks.

    Raises:
        ConfigError: If the global batch is not a positive multiple of ``world_size``.
    """
    total = train_cfg.get("global_batch_size")
    if total is None:
        return int(train_cfg.batch_size)
    if not (isinstance(total, int) and total > 0 and total % world_size == 0):
        raise ConfigError(
            f"train.global_batch_size={total} is invalid; it must be a positive multiple "
            f"of the world size {world_size}"
        )
    return total // world_size


def restart_count(environ: Any = None) -> int:
    """How many times this job was started again: torchrun's restarts plus SLURM's requeues.

    Args:
        environ: The environment to read; ``os.environ`` by default.

    Returns:
        ``TORCHELASTIC_RESTART_COUNT`` + ``SLURM_RESTART_COUNT`` (each 0 when unset).
    """
    env = os.environ if environ is None else environ
    total = 0
    for key in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        raw = str(env.get(key, "") or "0")
        total += int(raw) if raw.isdigit() else 0
    return total


class Trainer:
    """One job: data, model and the collaborators that train, save, log and evaluate it.

    Args:
        cfg: The composed config.
        run_dir: The run directory, the same on every rank.
        config_hash: The resolved config's hash (:func:`experiments.train.run.config_hash`).
        rank: This process's rank.
        world_size: Number of ranks.
        wall_start: When the job started (``time.time()``), for the summary.
        host: Under ``fault_tolerance=torchft``, this process's host (rank 0 of a world of
            one; ``run_dir`` is then the host's own directory).

    Example::

        trainer = Trainer(cfg, run_dir, config_hash(cfg), rank, world_size, time.time())
        try:
            trainer.metrics.open(MetricsLogger(run_dir, enabled=rank == 0))
            summary = trainer.fit()
        finally:
            trainer.close()
    """

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        config_hash: str,
        rank: int,
        world_size: int,
        wall_start: float,
        host: ElasticHost | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.config_hash = cfg, run_dir, config_hash
        self.rank, self.world_size, self.wall_start = rank, world_size, wall_start
        self.device = get_device()
        self.topology = str(cfg.topology.name)
        self.step = 0
        self._before: list[torch.Tensor] | None = (
            None  # the model before a logged step (log.update_norm)
        )
        t = cfg.train
        # engine=packed: this one process trains every worker of the job
        self.packs = is_packed(cfg)
        self.workers = engine_workers(cfg, world_size)
        self.batch_size = per_worker_batch(t, self.workers)
        self.task = task_for(cfg)
        # the seeds and the order of what draws from them are part of a run's identity
        torch.manual_seed(int(t.seed))
        random.seed(int(t.seed))
        # an elastic host reads the whole training set in its own order
        seed = int(t.seed) if host is None else host.data_seed(int(t.seed))
        placement = {"batch_size": self.batch_size, "seed": seed, "device": self.device}
        if self.packs:
            self.data: Any = PackedData.build(self.task, cfg, self.workers, **placement)
        else:
            self.data = self.task.build_data(
                cfg.dataset, cfg.model, rank=rank, world_size=world_size, **placement
            )
        if cfg.model.get("channels_last", False):  # batches made in the model's format
            set_memory_format(self.data, torch.channels_last)
        self.steps_per_epoch = len(self.data.train)
        self.total_steps = (
            int(t.max_steps) if t.max_steps is not None else int(t.epochs) * self.steps_per_epoch
        )
        model = self.task.build_model(cfg.model).to(self.device)
        shards = int(t.get("shard_size", 1))
        mesh = None
        if shards > 1:  # FSDP2 inside each replica of `shards` consecutive ranks
            mesh = build_mesh(shards, world_size, self.device.type)
            model = shard_model(model, mesh, hsdp=str(cfg.topology.name) == ALLREDUCE)
        # dropout and other model randomness differ per rank; the data order has its own generators
        torch.manual_seed(int(t.seed) * 1000 + rank)

        self.metrics = Metrics(
            cfg.log,
            self.device,
            rank=rank,
            world_size=world_size,
            batch_size=self.batch_size,
            steps_per_epoch=self.steps_per_epoch,
            workers=self.workers,
        )
        if self.task.tokens_per_sample:
            self.metrics.count_tokens(self.task.tokens_per_sample, self.task.flops_per_token)
        optim_fn = build_optim_fn(cfg.optim)
        scheduler_fn = build_scheduler_fn(cfg.scheduler, self.steps_per_epoch, self.total_steps)
        outer = outer_kwargs(cfg.get("outer"), cfg.topology)
        self.train_step: Any
        self.elastic: ElasticStep | None = None
        if host is not None and is_elastic(cfg):
            self.train_step = self.elastic = ElasticStep(
                model,
                t,
                cfg.topology,
                cfg.fault_tolerance,
                host,
                optim_fn,
                scheduler_fn,
                self.metrics.window,
                channels_last=bool(cfg.model.get("channels_last", False)),
                task=self.task,
                compression=compression_arg(cfg.get("compression")),
                outer=outer,
            )
        elif self.packs:
            self.train_step = PackedStep(
                model,
                self.workers,
                t,
                cfg.topology,
                optim_fn,
                scheduler_fn,
                self.metrics.window,
                task=self.task,
                outer=outer,
            )
        else:
            self.train_step = TrainStep(
                model,
                t,
                cfg.topology,
                optim_fn,
                scheduler_fn,
                self.metrics.window,
                rank=rank,
                world_size=world_size,
                channels_last=bool(cfg.model.get("channels_last", False)),
                task=self.task,
                compression=compression_arg(cfg.get("compression")),
                outer=outer,
                state_sync=state_sync_arg(cfg.optim.get("state_sync")),
                device_mesh=mesh,
            )
        try:
            self.network = apply_network(cfg.network, self.train_step.model, world_size)
        except BaseException:
            self.close()
            raise
        self.checkpointer = Checkpointer(
            cfg.checkpoint,
            run_dir / CHECKPOINT_DIR,
            self.train_step,
            self.metrics,
            rank=rank,
            world_size=world_size,
            config_hash=config_hash,
            loader=self.data.train,
        )
        evaluator = Evaluator if self.elastic is None else ElasticEvaluator
        self.evaluator = evaluator(self.data.test, self.train_step)
        self.stop = StopRequest(
            int(cfg.checkpoint.signal_check_every),
            # sharded replicas are saved unless HSDP, compression or outer (run.validate says so)
            bool(cfg.checkpoint.on_signal) and self._saveable(mesh, cfg),
            rank=rank,
            world_size=world_size,
            timeout_s=float(cfg.dist.timeout_s),
        )

    def _saveable(self, mesh: Any, cfg: Any) -> bool:
        """Whether the checkpointer can save this job (sharded replicas: not every kind)."""
        outer = cfg.get("outer")
        return mesh is None or (
            self.checkpointer.layout is not None  # not HSDP
            and self.train_step.compression is None
            and (outer is None or str(outer.name) == "none")
        )

    def close(self) -> None:
        """Release the hooks, the wrapper and the metrics sinks; safe to call twice."""
        try:
            self.train_step.close()
        finally:
            self.metrics.close()

    # ---------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        """Resume, train to ``total_steps``, evaluate at the end; return the summary.

        Raises:
            SystemExit: A rank received SIGTERM or the pre-emption signal: every rank
                saved the checkpoint of the step they agreed on (see
                :mod:`experiments.train.preempt`).
        """
        self.stop.install()
        try:
            return self._fit()
        finally:
            self.stop.restore()

    def _fit(self) -> dict[str, Any]:
        cfg = self.cfg
        self.metrics.start()
        self.step = self.checkpointer.resume()
        if self.checkpointer.resumed_from is not None:
            self.metrics.log(
                self.metrics.line(self.step, restarts=restart_count(), **{"resume/step": self.step})
            )
        dirichlet = str(cfg.dataset.get("partition", "iid")) == "dirichlet"
        if self.checkpointer.resumed_from is None and dirichlet:
            shards = self.data.shards if self.packs else [self.data]
            self.metrics.log_class_histogram(self.step, [d.class_histogram for d in shards])
        log.info(
            "training %s on %s with topology=%s, %d workers%s: %d steps (%d per epoch), batch %d per worker",
            cfg.model.name,
            cfg.dataset.name,
            self.topology,
            self.workers,
            " packed in one process" if self.packs else "",
            self.total_steps,
            self.steps_per_epoch,
            self.batch_size,
        )
        bar = self.metrics.progress(self.total_steps, self.step, self.topology)
        redirect = logging_redirect_tqdm() if not bar.disable else contextlib.nullcontext()
        self.train_step.model.train()
        # the throughput window counts training only: logging, evaluation and saving are excluded
        self.metrics.clock.start()
        # the link's bytes from here on: the start-up's broadcasts are not the steps'
        self.wire = WireCounter.from_env()
        track = bool(self.cfg.log.get("update_norm", False))
        with redirect:
            for x, y in self._batches():
                nxt = self.step + 1
                if track and self.metrics.line_due(nxt, nxt == self.total_steps):
                    self._before = [p.detach().clone() for p in self.train_step.params]
                self.train_step(x, y, self.step + 1)
                self.step += 1
                bar.update(1)
                self.metrics.clock.tick()
                self._after_step(bar)
                # the same steps on every rank decide whether to call the collective
                due = self.step < self.total_steps and self.stop.due(self.step)
                if due and self.stop.agreed():
                    bar.close()
                    self._stop_on_signal()
        bar.close()
        if self.evaluator.last_step != self.step:  # resumed at the very end: nothing was trained
            self._log_eval()
        return self._summary()

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches from the current step on, as a pure function of the step.

        An elastic host's quorum comes first, before the batch is read: healing may
        move the step forward, and the batches follow it.
        """
        expected, batches = -1, iter(())
        while self.step < self.total_steps:
            if self.elastic is not None:
                self.step = self.elastic.quorum()
                if self.step >= self.total_steps:  # healed to the end
                    return
            at = self.step
            if at != expected:  # the first batch, or a heal moved the step
                batches = self._batches_from(at)
            yield next(batches)
            expected = at + 1

    def _batches_from(self, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            epoch, start = divmod(step, self.steps_per_epoch)
            for x, y in self.data.train.iterate(epoch, start=start):
                yield x, y
                step += 1

    def _after_step(self, bar: Any) -> None:
        """Hand the step to the host phase if it logs, evaluates or saves; else return at once."""
        step, last = self.step, self.step == self.total_steps
        log_due = self.metrics.line_due(step, last)
        eval_due = step % self.steps_per_epoch == 0 or last
        save_due = self.checkpointer.due(step, last)
        # an evaluation line carries the exact value anyway
        cons_due = self.metrics.consensus_due(step) and not eval_due
        # an elastic host's quorum before this step: its members and their distance
        quorum = self.elastic.quorum_line(step) if self.elastic is not None else {}
        if log_due or eval_due or save_due or cons_due or quorum:
            self._host_phase(bar, log_due, eval_due, save_due, cons_due, quorum)

    def _host_phase(
        self,
        bar: Any,
        log_due: bool,
        eval_due: bool,
        save_due: bool,
        cons_due: bool,
        quorum: dict[str, Any],
    ) -> None:
        """Everything that reads the device or talks to the host; the same steps on every rank."""
        metrics, step = self.metrics, self.step
        if log_due:
            seconds, steps = metrics.clock.close()
        else:
            metrics.clock.pause()
        try:
            metrics.history.skipped += self.train_step.nan.check(
                metrics.window, step, self.checkpointer.root
            )
        except FloatingPointError:
            # every rank stops here together, so the summary's collective is safe; the loss
            # error stays the one reported
            try:
                self._summary(diverged_step=self.train_step.nan.diverged_step)
            except Exception:
                log.warning("the diverged run's summary could not be written", exc_info=True)
            raise
        line: dict[str, Any] | None = None
        if log_due:
            timers = {**self.train_step.pop_timers(), **self.wire.pop()}
            line = metrics.train_line(step, seconds, steps, timers, self.train_step.current_lr())
            line["comm/bytes_per_step"] = self.train_step.bytes_per_step()
            line["comm/peak_bytes_per_step"] = self.train_step.peak_bytes_per_step()
            if metrics.sketch > 0:
                line["consensus/distance_sketch"] = self.evaluator.consensus(metrics.sketch)
            delta = self.train_step.outer_delta_norm()
            if delta is not None:
                line["outer/delta_norm"] = delta
            if self._before is not None:
                with torch.no_grad():
                    sq = sum(
                        (p.detach().double() - b.double()).pow(2).sum()
                        for p, b in zip(self.train_step.params, self._before)
                    )
                line["train/update_norm"] = float(torch.as_tensor(sq).sqrt())
                self._before = None
        if cons_due:
            line = line if line is not None else metrics.line(step)
            line["consensus/distance"] = metrics.record_consensus(self.evaluator.consensus())
        if quorum:
            change = self.elastic.new_change() if self.elastic is not None else None
            if change is not None:
                metrics.log(metrics.line(step - 1, **{"elastic/change": change}))
            line = line if line is not None else metrics.line(step)
            distance = quorum.pop("consensus/distance")
            if "consensus/distance" not in line:  # log.consensus_every's, of this step, wins
                line["consensus/distance"] = metrics.record_consensus(distance)
            line.update(quorum)
        if line is not None:
            if self.elastic is not None:  # wall clock: the benches line up the hosts' steps
                line["time"] = time.time()
            metrics.log(line)
            metrics.show(bar, line)
        if eval_due:
            self._log_eval()
        if save_due:
            self.checkpointer.save(step)
        metrics.clock.resume()

    def _stop_on_signal(self) -> None:
        """Save this step's checkpoint on every rank (unless just saved) and leave."""
        if self.checkpointer.last_saved != self.step:
            self.checkpointer.save(self.step)
        log.warning(
            "stopping at step %d on %s; the checkpoint of this step is saved in %s",
            self.step,
            "+".join(self.stop.agreed_signals),
            self.checkpointer.root,
        )
        self.stop.leave()

    def _log_eval(self) -> None:
        result = self.evaluator.evaluate(self.step)
        self.metrics.record_consensus(result["consensus/distance"])
        self.metrics.log(self.metrics.line(self.step, **result))
        log.info(
            "step %d epoch %.2f: %s",
            self.step,
            self.step / self.steps_per_epoch,
            self.task.eval_message(result),
        )

    def _summary(self, diverged_step: int | None = None) -> dict[str, Any]:
        """The job's summary, the same on every rank; rank 0 writes ``summary.json``.

        A run stopped by a non-finite loss (``diverged_step``) has no final evaluation: its
        ``eval/*`` values are null, and it is marked ``diverged``.
        """
        cfg, history, last_eval = self.cfg, self.metrics.history, self.evaluator.last
        if diverged_step is not None:
            last_eval = {}
        summary: dict[str, Any] = {
            "topology": self.topology,
            "world_size": self.workers,
            "engine": "packed" if self.packs else "distributed",
            "train/steps": self.step,
            "train/loss": history.last_loss,
            "train/skipped_steps": history.skipped,
            "eval/acc": last_eval.get("eval/acc"),
            "eval/acc_local": last_eval.get("eval/acc_local"),
            "eval/loss": last_eval.get("eval/loss"),
            "perf/samples_per_s": self.metrics.mean("samples_per_s"),
            "consensus/distance": self.metrics.mean("consensus"),
            "wall_time_s": time.time() - self.wall_start,
            "dataset": str(cfg.dataset.name),
            "model": str(cfg.model.name),
            "optim": str(cfg.optim.name),
            "optim_kernels": self.train_step.optimizer_kernels(),
            "network": str(cfg.network.name),
            "compression": compression_arg(cfg.get("compression")) or "none",
            "comm/bytes_per_step": self.train_step.bytes_per_step(),
            "comm/peak_bytes_per_step": self.train_step.peak_bytes_per_step(),
            "outer": str(outer_section(cfg.get("outer")).name),
            "outer_every": outer_every(cfg.get("outer"), cfg.topology),
            "outer_fragments": int(outer_section(cfg.get("outer")).fragments),
            "outer_compression": str(outer_section(cfg.get("outer")).compression),
            "emulated": bool(self.network),
            "synthetic": self.task.synthetic,
            "restarts": restart_count(),
            "resumed_from_step": self.checkpointer.resumed_from,
            "resumed_from_checkpoint": self.checkpointer.resumed_path,
            "seed": int(cfg.train.seed),
            "batch_size": self.batch_size,
            "global_batch_size": self.batch_size * self.workers,
            "epochs": self.step / self.steps_per_epoch,
            "config_hash": self.config_hash,
            "run_dir": str(self.run_dir),
            "diverged": diverged_step is not None,
            "diverged_step": diverged_step,
            "host": host_tag(self.device),
            # what run() set for CUDA (train.cudnn_benchmark, train.tf32); nothing off CUDA
            "backend_flags": {
                "cudnn_benchmark": bool(cfg.train.get("cudnn_benchmark", True)),
                "tf32": bool(cfg.train.get("tf32", True)),
                "applied": self.device.type == "cuda",
            },
        }
        if self.elastic is not None:
            summary.update(self.elastic.summary())
        if self.task.tokens_per_sample:
            rates = self.metrics.token_rates(self.metrics.mean("samples_per_s"))
            tokens = {"tokens": self.metrics.tokens(self.step), "perf/tokens_per_s": None}
            tokens.update({"perf/mfu": None, **rates})
            summary.update(self.task.summary(last_eval, tokens))
        # rank 0's timings are the reference

        def diverged(_: dict[str, Any]) -> str:  # no final evaluation to tell
            return f"diverged: non-finite loss at step {diverged_step}"

        message = self.task.final_message if diverged_step is None else diverged
        return self.metrics.publish_summary(summary, self.run_dir, message)
