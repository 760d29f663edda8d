"""Metrics sinks of a training job: a JSONL file and, optionally, wandb.

Only rank 0 writes. Every call of :meth:`MetricsLogger.log` appends one JSON
object to ``<run dir>/metrics.jsonl`` (flushed at once, so a crashed or
running job can still be read by ``experiments.report``) and forwards the
same numbers to wandb when it is on. wandb is imported lazily, on rank 0
only, and runs offline by default with its files in ``<run dir>/wandb``.

What a metrics line holds, and when one is due, is decided in
:mod:`experiments.train.metrics`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "run_name_from_overrides", "json_safe"]

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
        """Store the final summary in the wandb run (``summary.json`` is written by the trainer)."""
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
