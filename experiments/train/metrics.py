"""What a metrics line says, and how its numbers are measured without stalling a step.

One job's metrics go through :class:`Metrics`: it keeps the current window of
training sums on the device (:class:`TrainWindow`), times the window's
training steps only (:class:`WindowClock`), turns both into a metrics line
with one small all-reduce, and remembers what the final summary averages
(:class:`History`). The lines go to the sinks of
:mod:`experiments.train.logger` (``metrics.jsonl`` and wandb), from rank 0.

Names follow the project's convention: ``train/loss``, ``train/acc``,
``train/lr``, ``perf/samples_per_s``, ``perf/step_s`` and the wrapper's
``comm/*`` timers (seconds per step, averaged over ranks); every line also has
``step``, ``epoch`` and ``time_s`` (training seconds, resumed runs included).
A language model's lines also have ``tokens`` (training tokens so far, all ranks
together) and its training lines ``perf/tokens_per_s`` (all ranks) and
``perf/mfu``: ``flops_per_token`` (``6 N``) times the tokens per second of one
rank, over ``log.peak_flops``, the peak FLOP/s of one device.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from experiments.train.logger import MetricsLogger, json_safe

__all__ = ["Metrics", "History", "TrainWindow", "WindowClock", "SUMMARY_FILE", "host_tag"]

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"


def _cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else what ``platform`` knows."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", errors="replace") as info:
        for line in info:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown"


def host_tag(device: torch.device) -> dict[str, Any]:
    """Rank 0's machine for the summary, ``{"name", "cpu", "cores", "gpu"}`` (``gpu``: the
    CUDA device's name, else None); the report compares throughput only within one."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"name": socket.gethostname(), "cpu": _cpu_model(), "cores": os.cpu_count(), "gpu": gpu}


@dataclass
class History:
    """What the summary averages, saved in checkpoints so a resumed run sums the same.

    Attributes:
        samples_per_s: Throughput of every metrics window.
        consensus: Every exact consensus distance logged.
        last_loss: The newest ``train/loss``.
        skipped: Steps whose gradients ``train.nan_policy=skip`` replaced by zeros.
    """

    samples_per_s: list[float] = field(default_factory=list)
    consensus: list[float] = field(default_factory=list)
    last_loss: float | None = None
    skipped: int = 0

    def state(self) -> dict[str, Any]:
        """Plain values, for a checkpoint."""
        return {
            "samples_per_s": list(self.samples_per_s),
            "consensus": list(self.consensus),
            "last_loss": self.last_loss,
            "skipped": self.skipped,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> History:
        """The inverse of :meth:`state`; missing keys start empty."""
        return cls(
            samples_per_s=[float(v) for v in state.get("samples_per_s", [])],
            consensus=[float(v) for v in state.get("consensus", [])],
            last_loss=state.get("last_loss"),
            skipped=int(state.get("skipped", 0)),
        )


class Metrics:
    """The metrics lines of one job: when they are due, what they hold, where they go.

    Args:
        log_cfg: The ``log`` config section (``every``, ``consensus_every``,
            ``consensus_sketch``, ``progress``).
        device: The training device (where the window's sums live).
        rank: This process's rank; only rank 0 writes.
        world_size: Number of ranks (processes).
        batch_size: Samples per step on each worker.
        steps_per_epoch: Training steps in one epoch.
        workers: Workers of the job (``engine.workers`` under ``engine=packed``, whose one
            process trains them all); the world size by default.

    Example::

        metrics = Metrics(cfg.log, device, rank=0, world_size=1, batch_size=32, steps_per_epoch=45)
        metrics.open(MetricsLogger(run_dir))
        metrics.start()
        ...  # training steps add to metrics.window; metrics.clock.tick() after each
        seconds, steps = metrics.clock.close()
        metrics.log(metrics.train_line(step, seconds, steps, timers={}, lr=0.1))
    """

    def __init__(
        self,
        log_cfg: Any,
        device: torch.device,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        steps_per_epoch: int,
        workers: int | None = None,
    ) -> None:
        self.every = int(log_cfg.every)
        # images count no tokens; count_tokens() turns the token metrics on
        self.tokens_per_sample, self.flops_per_token = 0, 0
        self.peak_flops = float(log_cfg.get("peak_flops", 312e12))
        self.consensus_every = int(log_cfg.consensus_every)
        self.sketch = int(log_cfg.consensus_sketch)
        self.show_progress = bool(log_cfg.progress)
        self.rank, self.world_size = rank, world_size
        self.workers = world_size if workers is None else int(workers)
        self.batch_size, self.steps_per_epoch = batch_size, steps_per_epoch
        self.window = TrainWindow(device)
        self.clock = WindowClock(device)
        self.history = History()
        self.sink = MetricsLogger(Path(os.devnull), enabled=False)
        self.time_offset = 0.0  # training seconds before a resume
        self.train_start = time.time()

    def open(self, sink: MetricsLogger) -> None:
        """Write to ``sink`` from now on (opened once the job could start)."""
        self.sink = sink

    def close(self) -> None:
        """Close the sinks; safe to call twice."""
        self.sink.close()

    # ------------------------------------------------------------ when
    def line_due(self, step: int, last: bool) -> bool:
        """Whether a training metrics line ends at ``step``."""
        return step % self.every == 0 or last

    def consensus_due(self, step: int) -> bool:
        """Whether ``log.consensus_every`` asks for the exact consensus distance at ``step``."""
        return self.consensus_every > 0 and step % self.consensus_every == 0

    # ------------------------------------------------------------ what
    def start(self) -> None:
        """Training starts (or resumes) now: ``time_s`` counts from here."""
        self.train_start = time.time()

    def elapsed(self) -> float:
        """Training seconds of the run so far, those before a resume included."""
        return self.time_offset + (time.time() - self.train_start)

    def line(self, step: int, **metrics: Any) -> dict[str, Any]:
        """A metrics line at ``step``: ``step``, ``epoch``, ``time_s`` (and ``tokens``), ``metrics``."""
        line: dict[str, Any] = {
            "step": step,
            "epoch": step / self.steps_per_epoch,
            "time_s": self.elapsed(),
        }
        if self.tokens_per_sample:
            line["tokens"] = self.tokens(step)
        line.update(metrics)
        return line

    def count_tokens(self, tokens_per_sample: int, flops_per_token: int) -> None:
        """Add ``tokens``, ``perf/tokens_per_s`` and ``perf/mfu`` to the lines from now on.

        Args:
            tokens_per_sample: Tokens in one sample (a language model's ``block_size``).
            flops_per_token: Training FLOPs per token of the model (``6 N``), for ``perf/mfu``.
        """
        self.tokens_per_sample, self.flops_per_token = tokens_per_sample, flops_per_token

    def tokens(self, step: int) -> int:
        """Training tokens consumed by all workers in ``step`` steps."""
        return step * self.workers * self.batch_size * self.tokens_per_sample

    def token_rates(self, samples_per_s: float | None) -> dict[str, float]:
        """``perf/tokens_per_s`` and ``perf/mfu`` of a throughput in samples per second."""
        if not self.tokens_per_sample or samples_per_s is None:
            return {}
        tokens_per_s = samples_per_s * self.tokens_per_sample
        per_rank = tokens_per_s / self.world_size  # per process, so per device
        return {
            "perf/tokens_per_s": tokens_per_s,
            "perf/mfu": self.flops_per_token * per_rank / self.peak_flops,
        }

    def train_line(
        self, step: int, seconds: float, steps: int, timers: Mapping[str, float], lr: float
    ) -> dict[str, Any]:
        """The line of the window that ends now, summed over ranks (one small all-reduce).

        Args:
            step: The step that ends the window.
            seconds: Training seconds of the window (:meth:`WindowClock.close`).
            steps: Training steps of the window.
            timers: The wrapper's timers since the last line (seconds summed over steps).
            lr: The learning rate the next step uses.

        Returns:
            The line; the window starts afresh.
        """
        keys = sorted(timers)
        extra = torch.tensor([timers[k] for k in keys], dtype=torch.float64)
        both = torch.cat([self.window.sums(), extra.to(self.window.device)])
        if self.world_size > 1:  # an elastic host is a world of one beside its quorum's group
            dist.all_reduce(both)
        totals = both.tolist()
        line = self.line(step)
        if totals[1] > 0:
            line["train/loss"] = totals[0] / totals[1]
            self.history.last_loss = line["train/loss"]
        if totals[3] > 0:
            line["train/acc"] = totals[2] / totals[3]
        line["train/lr"] = lr
        if seconds > 0 and steps > 0:
            sps = self.workers * self.batch_size * steps / seconds
            line["perf/samples_per_s"] = sps
            line["perf/step_s"] = seconds / steps
            line.update(self.token_rates(sps))
            self.history.samples_per_s.append(sps)
        for k, total in zip(keys, totals[4:]):
            line[k] = total / self.world_size / max(steps, 1)
        self.window.reset()
        return line

    def record_consensus(self, value: float | None) -> float | None:
        """Remember an exact consensus distance for the summary's mean; return it.

        ``None`` (an elastic host's members could not measure it) is not remembered.
        """
        if value is not None:
            self.history.consensus.append(value)
        return value

    # ------------------------------------------------------------ where
    def log(self, line: Mapping[str, Any]) -> None:
        """Write one line to the sinks (rank 0 only)."""
        self.sink.log(line)

    def log_class_histogram(self, step: int, histograms: list[Any]) -> None:
        """Log every worker's class counts once (one ``all_gather_object``).

        Args:
            step: The step of the line.
            histograms: This process's workers' class counts, one list each (one worker
                per process, except under ``engine=packed``).
        """
        gathered: list[Any] = [[[int(c) for c in h] for h in histograms]]
        if self.world_size > 1:
            gathered = [None] * self.world_size
            dist.all_gather_object(gathered, [[int(c) for c in h] for h in histograms])
        hists = [h for part in gathered for h in part]
        if self.rank == 0:
            self.log(self.line(step, **{"data/class_histogram": hists}))
            for r, h in enumerate(hists):
                log.info("worker %d class histogram: %s", r, h)

    def drop_after(self, step: int) -> int:
        """Forget the lines after ``step``, which a resumed run logs again."""
        return self.sink.drop_after(step)

    def progress(self, total: int, initial: int, desc: str) -> Any:
        """A progress bar on rank 0 with ``log.progress``; a disabled one elsewhere."""
        return tqdm(
            total=total,
            initial=initial,
            disable=not (self.rank == 0 and self.show_progress),
            dynamic_ncols=True,
            desc=desc,
        )

    def show(self, bar: Any, line: Mapping[str, Any]) -> None:
        """Show a line's loss and throughput on the bar, or in the log without one."""
        if not bar.disable:
            shown = {
                k.split("/")[-1]: line[k] for k in ("train/loss", "perf/samples_per_s") if k in line
            }
            bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()}, refresh=False)
        elif "train/loss" in line:
            log.info(
                "step %d: loss %.4f, %.0f samples/s",
                line["step"],
                line["train/loss"],
                line.get("perf/samples_per_s", float("nan")),
            )

    def publish_summary(
        self, summary: dict[str, Any], run_dir: Path, message: Any = None
    ) -> dict[str, Any]:
        """Give every rank rank 0's summary; rank 0 writes ``summary.json`` and tells wandb.

        Args:
            summary: This rank's summary (rank 0's timings are the reference).
            run_dir: The run directory.
            message: ``message(summary) -> str | None``, the last line rank 0 logs; by
                default (or ``None``) the final ``eval/acc`` and ``eval/acc_local``.

        Returns:
            Rank 0's summary, made strict-JSON safe, on every rank.
        """
        box = [json_safe(summary)]
        if self.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        summary = box[0]
        if self.rank == 0:
            path = run_dir / SUMMARY_FILE
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            os.replace(tmp, path)
            self.sink.summary(summary)
            text = None if message is None else message(summary)
            if text is None:
                log.info(
                    "done: eval/acc %.4f, eval/acc_local %.4f after %d steps; %s",
                    summary["eval/acc"],
                    summary["eval/acc_local"],
                    summary["train/steps"],
                    path,
                )
            else:
                log.info("%s; %s", text, path)
        return summary

    # ------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """``time_s``, ``window`` and ``history``: this object's part of a checkpoint shard."""
        return {
            "time_s": self.elapsed(),
            "window": self.window.state(),
            "history": self.history.state(),
        }

    def load_state(self, shard: Mapping[str, Any]) -> None:
        """Continue from a shard's ``time_s``, ``window`` and ``history``."""
        self.time_offset = float(shard.get("time_s", 0.0))
        self.window.load_state(shard.get("window", {}))
        self.history = History.from_state(shard.get("history", {}))

    def mean(self, name: str) -> float | None:
        """The mean of ``samples_per_s`` or ``consensus`` over the run, ``None`` if empty."""
        values = getattr(self.history, name)
        return sum(values) / len(values) if values else None


class TrainWindow:
    """Training sums since the last metrics line, kept on the device.

    :meth:`add` queues a few small kernels and never reads a value back, so a
    training step does not wait for the device. A non-finite loss is left out
    of the sums and counted instead, with the first step at which it happened;
    the caller reads those with :meth:`pop_nonfinite` when it next talks to the
    host (a metrics line, an evaluation, a checkpoint).

    Args:
        device: Where the sums live (the model's device).

    Example::

        window = TrainWindow(device)
        finite = window.add(loss, correct=(out.argmax(1) == y).sum(), samples=len(y), step=7)
        count, first = window.pop_nonfinite()  # host values, at a log step only
        loss_sum, batches, correct, samples = window.sums().tolist()
    """

    KEYS = ("loss_sum", "batches", "correct", "samples")

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self._sums = torch.zeros(len(self.KEYS), dtype=torch.float64, device=self.device)
        self._nonfinite = torch.zeros((), dtype=torch.float64, device=self.device)
        self._first_bad = torch.full((), math.inf, dtype=torch.float64, device=self.device)

    def add(
        self, loss: torch.Tensor, correct: torch.Tensor, samples: int, step: int
    ) -> torch.Tensor:
        """Add one step; return whether its loss is finite, as a 0-d bool tensor on the device.

        Args:
            loss: The step's mean loss (0-d).
            correct: Number of correct predictions (0-d).
            samples: Batch size.
            step: The step's number (1-based), remembered if the loss is not finite.
        """
        loss = loss.detach().to(torch.float64)
        finite = torch.isfinite(loss)
        ok = finite.to(torch.float64)
        row = torch.stack(
            [
                torch.where(finite, loss, 0.0),
                ok,
                correct.detach().to(torch.float64) * ok,
                ok * samples,
            ]
        )
        self._sums += row
        self._nonfinite += 1.0 - ok
        self._first_bad = torch.where(finite, self._first_bad, self._first_bad.clamp(max=step))
        return finite

    def sums(self) -> torch.Tensor:
        """``(loss_sum, batches, correct, samples)`` as a float64 device tensor (a copy)."""
        return self._sums.clone()

    def reset(self) -> None:
        """Start a new window (the non-finite count is kept until popped)."""
        self._sums.zero_()

    def pop_nonfinite(self) -> tuple[int, int | None]:
        """Non-finite losses since the last call and the first step with one; reads the device."""
        count, first = torch.stack([self._nonfinite, self._first_bad]).tolist()
        self._nonfinite.zero_()
        self._first_bad.fill_(math.inf)
        return int(count), (None if math.isinf(first) else int(first))

    def state(self) -> dict[str, float]:
        """The sums as plain floats, for a checkpoint (reads the device)."""
        return dict(zip(self.KEYS, self._sums.tolist()))

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`; missing keys count as zero."""
        values = [float(state.get(k, 0.0)) for k in self.KEYS]
        self._sums.copy_(torch.tensor(values, dtype=torch.float64))


class WindowClock:
    """Training seconds and steps of the current metrics window.

    Host phases (logging, evaluation, checkpoints) are cut out with
    :meth:`pause` and :meth:`resume`. On CUDA the clock is read only after
    ``torch.cuda.synchronize()``, at the window's ends and around host phases,
    so a window counts the device work it queued and never the previous
    window's; it never synchronizes inside a step.

    Args:
        device: The training device.

    Example::

        clock = WindowClock(device)
        clock.start()
        for step in ...:
            train_step()
            clock.tick()
            if log_step:
                seconds, steps = clock.close()  # also pauses
                ...  # host work
                clock.resume()
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.steps = 0
        self._start = 0.0
        self._paused_at: float | None = None

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self) -> None:
        """Open a new window now."""
        self._start, self.steps, self._paused_at = self._now(), 0, None

    def tick(self) -> None:
        """Count one training step (host only)."""
        self.steps += 1

    def pause(self) -> None:
        """Stop counting time: a host phase begins."""
        if self._paused_at is None:
            self._paused_at = self._now()

    def resume(self) -> None:
        """Count time again; a window closed during the pause starts afresh now."""
        if self._paused_at is None:
            return
        now = self._now()
        if self.steps == 0:
            self._start = now
        else:
            self._start += now - self._paused_at
        self._paused_at = None

    def close(self) -> tuple[float, int]:
        """End the window (and pause): its training seconds and steps; the next starts on resume."""
        self.pause()
        assert self._paused_at is not None
        seconds, steps = self._paused_at - self._start, self.steps
        self.steps = 0
        return seconds, steps
