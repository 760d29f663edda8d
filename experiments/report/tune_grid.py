"""The ranking behind tuning: runs grouped by everything but the tuned key and the seed.

:func:`tune_runs` gives, for each group, every value of the key that was tried
(:class:`GridValue`: the final metric of each seed) and the best one
(:class:`TunedGroup`). The rules (what a value is, which metric, ties, edges, diverged runs)
are in :mod:`experiments.report.tune`'s docstring; the tables, ``tuned.json`` and the plot
made of the groups are in :mod:`experiments.report.tune_output`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.report.configs import Config, fill_missing, run_fields, summary_extras
from experiments.report.runs import SUMMARY_FILE, Run, num

__all__ = [
    "EDGE",
    "SINGLE",
    "GridValue",
    "TunedGroup",
    "key_value",
    "lower_is_better",
    "number",
    "tune_runs",
]

EDGE = "edge: widen the grid"
SINGLE = "single value"
_TIE = 1e-12  # relative difference of two means below which they are a tie


def lower_is_better(metric: str) -> bool:
    """Whether a smaller ``metric`` is better: names holding ``loss`` or ``ppl``."""
    name = metric.lower()
    return "loss" in name or "ppl" in name


def number(text: str) -> float | None:
    """``text`` as a finite float, ``None`` when it is not one (``adamw``, ``nan``)."""
    try:
        value = float(text.strip().strip("'\""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _override(override: str) -> tuple[str, str] | None:
    """``(key, value)`` of a ``key=value`` override, ``+`` and ``++`` prefixes dropped."""
    key, eq, value = override.lstrip("+").partition("=")
    return (key.strip(), value.strip()) if eq else None


def key_value(run: Run, key: str) -> str | None:
    """The text of ``run``'s value of ``key``: its override, else the field derived for it.

    Args:
        run: The run.
        key: An override key such as ``optim.lr``.

    Returns:
        The override's text exactly as in ``overrides.yaml`` (``2e-3``), else the value of
        the field ``key`` of :func:`run_fields`, else ``None``.
    """
    found = None
    for override in run.overrides or ():
        parsed = _override(override)
        if parsed is not None and parsed[0] == key:
            found = parsed[1]  # Hydra rejects a key given twice; the last one would win
    if found is not None:
        return found
    return run_fields(run, [key]).get(key)


def _group_fields(run: Run, key: str, extras: Sequence[str]) -> dict[str, str]:
    """``run``'s fields as if ``key`` had never been set, seeds excluded."""
    # without the key in the summary, its sub-key overrides (optim.lr when tuning optim)
    # stay fields of their own instead of being folded into the key's value
    summary = {k: v for k, v in run.summary.items() if k != key}
    overrides = run.overrides
    if overrides is not None:
        overrides = [o for o in overrides if (p := _override(o)) is None or p[0] != key]
    fields = run_fields(replace(run, summary=summary, overrides=overrides), extras)
    fields.pop(key, None)
    return fields


@dataclass(frozen=True)
class GridValue:
    """One value of the tuned key in a group, with the final metric of its runs.

    Args:
        text: The value as its override reads (of several texts of one number, the smallest).
        value: The value as a number, ``None`` when it is not one.
        finals: The final metric of each run, in the order of ``runs``.
        runs: The run directories, sorted.
    """

    text: str
    value: float | None
    finals: tuple[float, ...]
    runs: tuple[Path, ...]

    @property
    def order(self) -> tuple[int, float, str]:
        """Sort key: numbers first, by number, then texts."""
        return (0, self.value, "") if self.value is not None else (1, 0.0, self.text)

    @property
    def n(self) -> int:
        """How many runs (seeds) tried this value."""
        return len(self.finals)

    @property
    def diverged(self) -> int:
        """How many of the runs diverged (a NaN or infinite final metric)."""
        return sum(not math.isfinite(f) for f in self.finals)

    @property
    def mean(self) -> float:
        """Mean final metric over the seeds; the worst (infinite) when a run diverged."""
        return statistics.fmean(self.finals)

    @property
    def std(self) -> float | None:
        """Sample standard deviation over the seeds, ``None`` for one seed or a diverged run."""
        return statistics.stdev(self.finals) if self.n > 1 and not self.diverged else None

    @property
    def lo(self) -> float:
        """Smallest final metric over the seeds."""
        return min(self.finals)

    @property
    def hi(self) -> float:
        """Largest final metric over the seeds."""
        return max(self.finals)


def _tie(a: float, b: float) -> bool:
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b  # a diverged value ties only with another
    return abs(a - b) <= _TIE * max(abs(a), abs(b))


@dataclass
class TunedGroup:
    """Runs that differ only in the tuned key and the seed, and the best value of the key.

    Args:
        config: The group's fields (without the key and the seed) and its runs.
        key: The tuned key.
        metric: The final metric compared.
        lower_is_better: Whether a smaller metric is better.
        grid: Every value tried, in value order (see :attr:`GridValue.order`).

    Example::

        for group in tune_runs(runs, "optim.lr"):
            print(group.fields, group.best.text, group.best.mean, group.flag)
    """

    config: Config
    key: str
    metric: str
    lower_is_better: bool
    grid: list[GridValue]

    @property
    def fields(self) -> dict[str, str]:
        """What the group's runs share (:func:`run_fields` without the key and the seed)."""
        return self.config.fields

    @property
    def numeric(self) -> bool:
        """Whether every value tried is a number."""
        return all(v.value is not None for v in self.grid)

    @property
    def best(self) -> GridValue:
        """The value with the best mean; of tied means, the first in value order."""
        sign = 1.0 if self.lower_is_better else -1.0
        top = min(sign * v.mean for v in self.grid)
        return next(v for v in self.grid if _tie(sign * v.mean, top))

    @property
    def edge(self) -> bool:
        """Whether the best is the smallest or largest of two or more numeric values."""
        best = self.best
        ends = best is self.grid[0] or best is self.grid[-1]
        return len(self.grid) > 1 and self.numeric and ends

    @property
    def side(self) -> str:
        """Where the best sits: ``low`` or ``high`` at an edge (:attr:`edge`), else ``inside``."""
        if not self.edge:
            return "inside"
        return "low" if self.best is self.grid[0] else "high"

    @property
    def flag(self) -> str:
        """``edge: widen the grid``, ``single value``, or ``""`` for an interior best."""
        if len(self.grid) == 1:
            return SINGLE
        return EDGE if self.edge else ""


def _final(run: Run, name: str, key: str) -> float:
    """``run``'s final ``name``, the worst value (infinite) when the run diverged.

    A run diverged when its summary says so (it stopped on a non-finite loss) or its value is
    null (as the trainer writes a non-finite one), NaN or infinite.
    """
    final: Any = run.summary.get(name)
    nonfinite = isinstance(final, float) and not math.isfinite(final)
    if run.diverged or nonfinite or (final is None and name in run.summary):
        # a diverged run ranks worst, so a grid that reaches divergence still picks
        return math.inf if lower_is_better(name) else -math.inf
    if not num(final):
        why = f"{final!r}, not a finite number" if name in run.summary else "missing"
        raise ValueError(f"run {run.path}: {name} is {why} in {SUMMARY_FILE}; cannot tune {key}")
    return float(final)


def _default_metric(runs: Sequence[Run]) -> str:
    kinds = {r.is_lm for r in runs}
    if len(kinds) > 1:
        raise ValueError(
            f"the group of {runs[0].path} mixes language-model and image runs; name the metric"
        )
    return "eval/loss" if kinds.pop() else "eval/acc"


def tune_runs(runs: Sequence[Run], key: str, metric: str | None = None) -> list[TunedGroup]:
    """The best value of ``key`` for each group of runs that differ only in it and the seed.

    Args:
        runs: The runs (any order).
        key: The tuned override key, e.g. ``optim.lr``.
        metric: The final metric to compare (a ``summary.json`` key); ``None`` for
            ``eval/loss`` of language-model runs and ``eval/acc`` of image runs.

    Returns:
        The groups, ``allreduce`` ones first, then by their fields.

    Raises:
        ValueError: No run or no key; a run has no value of ``key``; a run of a group lacks
            the metric (missing or not a number in ``summary.json``), or every run of a group
            has it null, none logged it and none diverged; a group mixes language-model and
            image runs while ``metric`` is ``None``. The message is one line. A diverged run
            (marked ``diverged``, or a null, NaN or infinite final) is no error: it ranks
            worst.
    """
    if not key:
        raise ValueError("no key to tune given")
    if not runs:
        raise ValueError(f"no run to tune {key} over")
    ordered = sorted(runs, key=lambda r: str(r.path))
    texts = [key_value(r, key) for r in ordered]
    lacking = [r for r, t in zip(ordered, texts) if t is None]
    if lacking:
        raise ValueError(
            f"{len(lacking)} of {len(runs)} run(s) have no value of {key} (no override "
            f"{key}=... and no field {key}), e.g. {lacking[0].path}"
        )
    extras = summary_extras(ordered)
    members: dict[tuple[tuple[str, str], ...], tuple[Config, list[str]]] = {}
    every = fill_missing(ordered, [_group_fields(r, key, extras) for r in ordered])
    for run, text, fields in zip(ordered, texts, every):
        config, values = members.setdefault(tuple(sorted(fields.items())), (Config(fields), []))
        config.runs.append(run)
        values.append(str(text))
    groups = []
    for config, values in members.values():
        name = metric or _default_metric(config.runs)
        nulls = all(r.summary.get(name, 0) is None and not r.diverged for r in config.runs)
        if nulls and not any(name in row for r in config.runs for row in r.metrics):
            # null everywhere, never logged, no run stopped: a metric these runs do not have
            # (eval/acc of language models), not a grid that diverged throughout
            raise ValueError(
                f"{name} is null in every run of the group of {config.runs[0].path}, none "
                f"logged it and none diverged; name a metric they have to tune {key}"
            )
        found: dict[tuple[int, float, str], list[tuple[str, Run, float]]] = {}
        for run, text in zip(config.runs, values):
            final = _final(run, name, key)
            value = number(text)
            order = (0, value, "") if value is not None else (1, 0.0, text)
            found.setdefault(order, []).append((text, run, final))
        grid = [
            GridValue(
                text=min(t for t, _, _ in found[order]),
                value=None if order[0] else order[1],
                finals=tuple(f for _, _, f in found[order]),
                runs=tuple(r.path for _, r, _ in found[order]),
            )
            for order in sorted(found)
        ]
        groups.append(TunedGroup(config, key, name, lower_is_better(name), grid))
    groups.sort(key=lambda g: (not g.config.is_allreduce, sorted(g.fields.items())))
    return groups
