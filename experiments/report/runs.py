"""Loading run directories: ``summary.json``, ``metrics.jsonl`` and Hydra's overrides."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Run", "find_run_dirs", "load_run", "load", "load_all", "read_overrides", "num", "count",
    "ALLREDUCE", "UNKNOWN_HOST",
]  # fmt: skip

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
ALLREDUCE = "allreduce"
UNKNOWN_HOST = "unknown host"
_SKIP_DIRS = {"wandb", "checkpoints", "__pycache__"}
# keys that name a language-model run, in its summary or its metrics lines
_LM_KEYS = ("eval/ppl", "perf/tokens_per_s", "tokens")


def num(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (``bool`` is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def count(value: float, _pos: Any = None) -> str:
    """A large count for people: ``196608`` reads ``197k``, ``2.5e9`` reads ``2.5B``.

    ``_pos`` lets it serve as a matplotlib tick formatter.
    """
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:g}"


@dataclass
class Run:
    """One run directory, loaded.

    Args:
        path: The run directory.
        summary: ``summary.json``.
        metrics: The valid lines of ``metrics.jsonl``, in file order.
        overrides: Hydra's task overrides (``.hydra/overrides.yaml``), ``None`` without
            that file.

    Example::

        run = load_run(Path("multirun/2024-01-01/12-00-00/0"))
        if run is not None:
            print(run.name, run.final("eval/acc"))
    """

    path: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    overrides: list[str] | None = None

    @property
    def topology(self) -> str:
        """Topology name, or ``allreduce``."""
        return str(self.summary.get("topology"))

    @property
    def network(self) -> str:
        """Network profile name, ``none`` when the real interconnect was used."""
        return str(self.summary.get("network") or "none")

    @property
    def emulated(self) -> bool:
        """Whether network emulation was on."""
        return bool(self.summary.get("emulated"))

    @property
    def seed(self) -> Any:
        """The run's seed, from its summary."""
        return self.summary.get("seed")

    @property
    def host(self) -> str:
        """The kind of machine it ran on (CPU model, cores, GPU), ``unknown host`` untagged.

        The host name is left out: nodes of one partition share the hardware, and a
        container's name changes from run to run.
        """
        tag = self.summary.get("host")
        if not isinstance(tag, dict):
            return UNKNOWN_HOST
        parts = [str(tag.get("cpu") or "unknown CPU"), f"{tag.get('cores')} cores"]
        return ", ".join(parts + ([str(tag["gpu"])] if tag.get("gpu") else []))

    @property
    def diverged(self) -> bool:
        """Whether the run stopped on a non-finite loss (``train.nan_policy=error``)."""
        return self.summary.get("diverged") is True

    @property
    def is_lm(self) -> bool:
        """Whether this is a language-model run (it logs tokens, perplexity or tokens/s)."""
        if any(num(self.summary.get(k)) for k in _LM_KEYS):
            return True
        return any(num(row.get("tokens")) or num(row.get("eval/ppl")) for row in self.metrics)

    @property
    def name(self) -> str:
        """The table's row name: topology, plus the emulation and synthetic-data tags."""
        return self.topology + self.tags

    @property
    def tags(self) -> str:
        """`` (emulated <network>)`` and `` (synthetic)`` where they apply, else ``""``."""
        tags = f" (emulated {self.network})" if self.emulated else ""
        return tags + (" (synthetic)" if self.summary.get("synthetic") else "")

    def series(self, x: str, y: str) -> list[tuple[float, float]]:
        """``(x, y)`` pairs of the lines that hold both as numbers."""
        return [(row[x], row[y]) for row in self.metrics if num(row.get(x)) and num(row.get(y))]

    def final(self, key: str) -> float | None:
        """The summary's value of ``key``, else the last logged one."""
        if num(self.summary.get(key)):
            return float(self.summary[key])
        return self.last(key)

    def last(self, key: str) -> float | None:
        """The last logged value of ``key``."""
        for row in reversed(self.metrics):
            if num(row.get(key)):
                return float(row[key])
        return None

    def mean(self, key: str) -> float | None:
        """The summary's value of ``key`` (a mean there), else the mean of the logged values."""
        if num(self.summary.get(key)):
            return float(self.summary[key])
        values = [float(row[key]) for row in self.metrics if num(row.get(key))]
        return sum(values) / len(values) if values else None

    def time_to(self, target: float) -> float | None:
        """``time_s`` of the first line with ``eval/acc >= target``."""
        for t, acc in self.series("time_s", "eval/acc"):
            if acc >= target:
                return float(t)
        return None


def find_run_dirs(dirs: Iterable[str | Path]) -> list[Path]:
    """Every directory under ``dirs`` that holds ``metrics.jsonl`` or ``summary.json``.

    Raises:
        ValueError: A given path is not a directory.
    """
    found: list[Path] = []
    for top in dirs:
        top = Path(top)
        if not top.is_dir():
            raise ValueError(f"{str(top)!r} is not a directory; give sweep or run directories")
        for root, subdirs, files in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS and d[0] != ".")
            if METRICS_FILE in files or SUMMARY_FILE in files:
                found.append(Path(root))
    return list(dict.fromkeys(found))


def load_run(path: str | Path) -> Run | None:
    """Load one run directory; ``None`` (with a warning) when it cannot be used.

    Args:
        path: The run directory.

    Returns:
        The run, or ``None`` when ``summary.json`` is missing or unreadable or
        ``metrics.jsonl`` is missing or has no valid line (a diverged run, which may have
        stopped before its first line, needs none).
    """
    loaded = load(Path(path))
    if isinstance(loaded, str):
        warnings.warn(f"skipping run {path}: {loaded}", stacklevel=2)
        return None
    return loaded


def load_all(dirs: Iterable[str | Path]) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Every run directory under ``dirs``, loaded, and those that could not be, with why.

    Args:
        dirs: Sweep or run directories (searched recursively).

    Returns:
        ``(runs, skipped)``; nothing is warned about here, the caller reports ``skipped``.

    Raises:
        ValueError: A given path is not a directory.
    """
    runs: list[Run] = []
    skipped: list[tuple[Path, str]] = []
    for path in find_run_dirs(dirs):
        loaded = load(path)
        if isinstance(loaded, str):
            skipped.append((path, loaded))
        else:
            runs.append(loaded)
    return runs, skipped


def load(path: Path) -> Run | str:
    """The run, or why it cannot be used (malformed lines and overrides only warn)."""
    summary_path, metrics_path = path / SUMMARY_FILE, path / METRICS_FILE
    if not summary_path.is_file():
        return f"no {SUMMARY_FILE} (the run did not finish)"
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{SUMMARY_FILE} is not valid JSON ({exc})"
    if not isinstance(summary, dict) or not summary.get("topology"):
        return f"{SUMMARY_FILE} has no topology"
    # a run that diverged before its first metrics line still counts: tuning ranks it worst
    lines_needed = summary.get("diverged") is not True
    if not metrics_path.is_file():
        if not lines_needed:
            return Run(path, summary, [], read_overrides(path / OVERRIDES_FILE))
        return f"no {METRICS_FILE}"
    try:
        lines = metrics_path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"{METRICS_FILE} cannot be read ({exc})"
    metrics, bad = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad.append(number)
            continue
        if isinstance(row, dict) and num(row.get("step")):
            metrics.append(row)
        else:
            bad.append(number)
    if bad:
        warnings.warn(
            f"{metrics_path}: skipped {len(bad)} malformed line(s), first at line {bad[0]}",
            stacklevel=3,
        )
    if not metrics and lines_needed:
        return f"{METRICS_FILE} has no valid line"
    return Run(path, summary, metrics, read_overrides(path / OVERRIDES_FILE))


def read_overrides(path: Path) -> list[str] | None:
    """Hydra's task overrides as ``key=value`` strings; ``None`` when absent or unreadable."""
    if not path.is_file():
        return None
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        warnings.warn(f"{path}: ignored, not readable YAML ({exc})", stacklevel=4)
        return None
    if data is None:
        return []
    if not isinstance(data, list) or not all(isinstance(o, str) for o in data):
        warnings.warn(f"{path}: ignored, not a list of overrides", stacklevel=4)
        return None
    return list(data)
