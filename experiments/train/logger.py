"""Metrics sinks of the training loop: a JSONL file and, optionally, wandb.

Only rank 0 writes. Every call of :meth:`MetricsLogger.log` appends one JSON
object to ``<run dir>/metrics.jsonl`` (flushed at once, so a crashed or
running job can still be read by ``experiments.report``) and forwards the
same numbers to wandb when it is on. wandb is imported lazily, on rank 0
only, and runs offline by default with its files in ``<run dir>/wandb``.

What a metrics line summarises is gathered by :class:`TrainWindow` (training
sums kept on the device, read back once per line) and :class:`WindowClock`
(training seconds of the window, host phases excluded).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["MetricsLogger", "TrainWindow", "WindowClock", "run_name_from_overrides", "json_safe"]

METRICS_FILE = "metrics.jsonl"


def json_safe(value: Any) -> Any:
    """Make ``value`` strict-JSON serialisable: non-finite floats become ``None``.

    Args:
        value: Numbers, strings, ``None``, tensors with one element, and
            lists/dicts of those.

    Returns:
        The same structure with only JSON types.
    """
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item"):  # a one-element tensor or a numpy scalar
        return json_safe(value.item())
    return str(value)


def run_name_from_overrides(overrides: Sequence[str]) -> str:
    """A readable run name from Hydra's task overrides, e.g. ``topology=ring,train.seed=1``.

    Args:
        overrides: ``HydraConfig.get().overrides.task``.

    Returns:
        The non-``hydra.*`` overrides joined with commas, or ``"default"``.
    """
    kept = [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]
    return ",".join(kept) if kept else "default"


class MetricsLogger:
    """Append metrics to ``metrics.jsonl`` and mirror them to wandb.

    Args:
        run_dir: The run directory (created if missing).
        enabled: ``False`` on ranks other than 0: every call is then a no-op.
        wandb_cfg: The ``logger`` config section; wandb is used when its
            ``name`` is ``"wandb"`` and its ``mode`` is not ``"disabled"``.
        config: The resolved run config, stored in wandb.
        run_name: The wandb run name.
        group: The wandb group when ``wandb_cfg.group`` is not set.

    Example::

        logger = MetricsLogger(run_dir, enabled=rank == 0)
        logger.log({"step": 10, "epoch": 0.5, "time_s": 1.2, "train/loss": 0.7})
        logger.close()
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        enabled: bool = True,
        wandb_cfg: Any = None,
        config: Mapping[str, Any] | None = None,
        run_name: str | None = None,
        group: str | None = None,
    ) -> None:
        self.enabled = bool(enabled)
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self._file = None
        self._run: Any = None
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # appending keeps the lines of an interrupted run that is being resumed
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if wandb_cfg is not None and str(wandb_cfg.get("name")) == "wandb":
            mode = str(wandb_cfg.get("mode", "offline"))
            if mode != "disabled":
                self._start_wandb(wandb_cfg, mode, config, run_name, group)

    def drop_after(self, step: int) -> int:
        """Forget the lines logged after ``step``: a resumed run logs those steps again.

        Returns:
            The number of lines removed (0 on ranks other than 0).
        """
        if not self.enabled or self._file is None or not self.path.exists():
            return 0
        self._file.close()
        keep, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                logged = json.loads(line).get("step")
            except (ValueError, AttributeError):
                logged = None  # not ours to judge: keep it
            if isinstance(logged, (int, float)) and logged > step:
                dropped += 1
            else:
                keep.append(line)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(f"{line}\n" for line in keep), encoding="utf-8")
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        return dropped

    def _start_wandb(
        self,
        cfg: Any,
        mode: str,
        config: Mapping[str, Any] | None,
        run_name: str | None,
        group: str | None,
    ) -> None:
        import wandb  # lazily: only rank 0 of a run with the wandb logger pays for it

        init: Any = wandb.init
        self._run = init(
            project=str(cfg.get("project") or "decent-dp"),
            entity=cfg.get("entity"),
            group=cfg.get("group") or group,
            tags=[str(t) for t in (cfg.get("tags") or [])],
            name=run_name,
            dir=str(self.run_dir),
            mode=mode,
            config=dict(config or {}),
            settings=wandb.Settings(silent=True),
        )

    @property
    def wandb_dir(self) -> str | None:
        """The wandb run's files directory, or ``None`` without wandb."""
        return None if self._run is None else str(self._run.dir)

    def log(self, metrics: Mapping[str, Any]) -> None:
        """Write one metrics line (and a wandb log at ``metrics["step"]``).

        Args:
            metrics: Must hold ``step``; by convention also ``epoch`` and ``time_s``.
        """
        if not self.enabled or self._file is None:
            return
        line = json_safe(dict(metrics))
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        if self._run is not None:
            step = int(metrics.get("step", 0))
            numbers = {
                k: v
                for k, v in line.items()
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            if numbers:
                self._run.log(numbers, step=step)

    def summary(self, summary: Mapping[str, Any]) -> None:
        """Store the final summary in the wandb run (the JSON file is written by the loop)."""
        if self._run is not None:
            self._run.summary.update(json_safe(dict(summary)))

    def close(self) -> None:
        """Close the file and finish the wandb run; safe to call twice."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._run is not None:
            run, self._run = self._run, None
            run.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
