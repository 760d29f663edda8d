"""Configurations: runs that differ only in their seed, the factors a sweep varies, bands.

A run's *fields* say what was run: the topology first, then Hydra's task overrides
(``.hydra/overrides.yaml``) in their order, then the summary's ``optim``, ``model``,
``dataset``, ``network`` and ``world_size``. Without an overrides file, any other summary
field that varies across those runs counts too (seeds, timings and results never do).
A sub-key override such as ``dataset.alpha=0.1`` joins its group's value
(``digits (alpha=0.1)``). Runs with equal fields form one :class:`Config`; the fields that
vary across the configurations of a section are its :class:`Factor` s, in field order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from experiments.report.runs import ALLREDUCE, Run, num

__all__ = [
    "Band",
    "Config",
    "Factor",
    "Section",
    "band",
    "fill_missing",
    "find_factors",
    "make_section",
    "run_fields",
    "summary_extras",
]

BASE_FIELDS = ("topology", "optim", "model", "dataset", "network", "world_size")
# fields shown as their bare value in labels; others read "key=value"
_NAMED = {"topology", "optim", "model", "dataset", "network"}
_TITLES = {"world_size": "workers"}
_SEED_KEYS = {"seed", "train.seed"}
# summary fields that describe the outcome or the bookkeeping of a run, not what was run
_NOT_CONFIG = {
    "seed", "wall_time_s", "restarts", "resumed_from_step", "resumed_from_checkpoint", "config_hash", "run_dir",
    "tokens", "unigram_entropy", "emulated", "synthetic", "diverged", "diverged_step", "host",
}  # fmt: skip
MAX_POINTS = 400


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _parse(override: str) -> tuple[str, str] | None:
    """``(key, value)`` of a task override, ``None`` for seeds and ``hydra.*`` keys."""
    key, _, value = override.lstrip("+").partition("=")
    key = key.strip()
    if not key or key in _SEED_KEYS or key.startswith("hydra."):
        return None
    return key, value.strip()


def _extra_candidates(run: Run) -> dict[str, str]:
    """Summary fields that may say what was run: plain values, not metrics or bookkeeping."""
    found = {}
    for key, value in run.summary.items():
        if key in BASE_FIELDS or key in _NOT_CONFIG or "/" in key or key.endswith("_s"):
            continue
        if isinstance(value, (str, bool, int)) or (isinstance(value, float) and value.is_integer()):
            found[key] = _text(value)
    return found


def run_fields(run: Run, extras: Sequence[str] = ()) -> dict[str, str]:
    """What ``run`` ran, as ordered ``key -> value`` text (see the module docstring).

    Args:
        run: The run.
        extras: Summary fields to add for a run without Hydra overrides.

    Returns:
        The fields, sub-key overrides folded into their group's value.
    """
    base = {k: _text(run.summary[k]) for k in BASE_FIELDS if run.summary.get(k) is not None}
    base["network"] = run.network
    fields = {"topology": run.topology}
    for override in run.overrides or ():
        parsed = _parse(override)
        if parsed is not None:
            key, value = parsed
            fields[key] = base.get(key, value)  # the summary says what the name resolved to
    fields.update({k: v for k, v in base.items() if k not in fields})
    if run.overrides is None:
        candidates = _extra_candidates(run)
        fields.update({k: candidates[k] for k in extras if k in candidates})
    folded: dict[str, str] = {}
    subs: dict[str, list[str]] = {}
    for key, value in fields.items():
        group, dot, sub = key.partition(".")
        if dot and group in fields:  # the group takes the place of its first mention
            folded.setdefault(group, fields[group])
            subs.setdefault(group, []).append(f"{sub}={value}")
        else:
            folded.setdefault(key, value)
    for group, parts in subs.items():
        folded[group] += f" ({', '.join(parts)})"
    return folded


@dataclass
class Config:
    """Runs with equal fields: one configuration over its seeds.

    Args:
        fields: What was run (:func:`run_fields`).
        runs: Its runs, by seed.

    Example::

        section = make_section("vision", runs)
        for config in section.configs:
            print(section.label(config), len(config.runs))
    """

    fields: dict[str, str]
    runs: list[Run] = field(default_factory=list)

    @property
    def topology(self) -> str:
        """The topology with its folded sub-keys, e.g. ``local-sgd (period=8)``."""
        return self.fields["topology"]

    @property
    def is_allreduce(self) -> bool:
        """Whether this is an ``allreduce`` configuration."""
        return self.runs[0].topology == ALLREDUCE

    @property
    def name(self) -> str:
        """The table's row name: topology plus the emulation and synthetic-data tags."""
        return self.topology + self.runs[0].tags

    def finals(self, key: str) -> list[float]:
        """The final value of ``key`` of every run that has one."""
        return [v for v in (r.final(key) for r in self.runs) if v is not None]

    def means(self, key: str) -> list[float]:
        """The mean value of ``key`` of every run that has one."""
        return [v for v in (r.mean(key) for r in self.runs) if v is not None]

    def lasts(self, key: str) -> list[float]:
        """The last logged value of ``key`` of every run that logged it."""
        return [v for v in (r.last(key) for r in self.runs) if v is not None]


def _display(key: str, value: str | None) -> str:
    if value is None:
        return f"{key}=default"
    if key in _NAMED:
        return value
    return f"n={value}" if key == "world_size" else f"{key}={value}"


@dataclass(frozen=True)
class Factor:
    """Fields that vary together across configurations (usually one).

    Args:
        keys: The field names.
    """

    keys: tuple[str, ...]

    @property
    def title(self) -> str:
        """The legend's title for this factor."""
        return ", ".join(_TITLES.get(k, k) for k in self.keys)

    def value(self, config: Config) -> str:
        """This factor's value in ``config``, as a label."""
        return ", ".join(_display(k, config.fields.get(k)) for k in self.keys)


@dataclass
class Section:
    """The configurations of one kind of run (``vision`` or ``lm``) and their factors.

    Args:
        kind: ``"vision"`` or ``"lm"``.
        configs: Sorted configurations.
        factors: The varying fields, first (colour) to last; never empty.
    """

    kind: str
    configs: list[Config]
    factors: list[Factor]

    @property
    def runs(self) -> list[Run]:
        """Every run, configuration by configuration."""
        return [r for c in self.configs for r in c.runs]

    def label(self, config: Config) -> str:
        """``config`` named by its factor values, e.g. ``ring, qgm_sgd``."""
        return ", ".join(f.value(config) for f in self.factors)

    def constant(self, key: str) -> str | None:
        """The value of field ``key`` when every configuration has the same one."""
        values = {c.fields.get(key) for c in self.configs}
        return values.pop() if len(values) == 1 else None


def _config_sort_key(config: Config) -> tuple[Any, ...]:
    s, f = config.runs[0].summary, config.fields
    world = s.get("world_size")
    return (
        str(s.get("dataset")), f.get("dataset", ""), str(s.get("model")),
        config.runs[0].network != "none", config.runs[0].network,
        world if isinstance(world, int) else -1,
        not config.is_allreduce, config.topology,
        sorted(f.items()),
    )  # fmt: skip


def _run_sort_key(run: Run) -> tuple[Any, ...]:
    seed = run.seed
    return (not num(seed), seed if num(seed) else 0, str(seed), str(run.path))


def make_section(kind: str, runs: Sequence[Run]) -> Section:
    """Group ``runs`` into configurations and find the factors that vary across them.

    Args:
        kind: ``"vision"`` or ``"lm"``.
        runs: The runs of that kind.

    Returns:
        The section; a field present in some configurations only varies too (its
        missing value reads ``key=default``). Fields that vary in lock-step form one factor.
    """
    extras = summary_extras(runs)
    groups: dict[tuple[tuple[str, str], ...], Config] = {}
    every = [run_fields(run, extras) for run in runs]
    for run, fields in zip(runs, fill_missing(runs, every)):
        groups.setdefault(tuple(sorted(fields.items())), Config(fields)).runs.append(run)
    configs = sorted(groups.values(), key=_config_sort_key)
    for config in configs:
        config.runs.sort(key=_run_sort_key)
    found = find_factors([c.fields for c in configs]) or [Factor(("topology",))]
    return Section(kind, configs, found)


def fill_missing(runs: Sequence[Run], fields: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """Each run's fields, with a field that other runs set taken from its summary when it has it.

    A run that did not override ``outer`` still says ``"outer": "none"`` in ``summary.json``;
    its label then reads ``outer=none`` instead of ``outer=default``, and it groups with runs
    that set ``outer=none`` explicitly.

    Args:
        runs: The runs.
        fields: Their :func:`run_fields`, in the same order.

    Returns:
        New field dicts; a key still missing stays missing (``key=default`` in labels).
    """
    keys = list(dict.fromkeys(k for f in fields for k in f))
    filled = []
    for run, own in zip(runs, fields):
        extra = {}
        for key in keys:
            value = run.summary.get(key)
            if (
                key not in own
                and isinstance(value, (str, int, float))
                and not isinstance(value, bool)
            ):
                extra[key] = _text(value)
        filled.append({**own, **extra})
    return filled


def summary_extras(runs: Sequence[Run]) -> list[str]:
    """Summary fields that tell the runs without Hydra overrides apart (see :func:`run_fields`).

    Args:
        runs: Runs; those with an overrides file are ignored.

    Returns:
        The plain summary fields whose value varies across those runs, in first-seen order.
    """
    candidates = [_extra_candidates(r) for r in runs if r.overrides is None]
    keys = list(dict.fromkeys(k for c in candidates for k in c))
    return [k for k in keys if len({c.get(k) for c in candidates}) > 1]


def find_factors(fields: Sequence[Mapping[str, str]]) -> list[Factor]:
    """The fields that vary across ``fields`` (one mapping per configuration), in field order.

    Args:
        fields: The fields of every configuration.

    Returns:
        The factors; fields that vary in lock-step form one. Empty when nothing varies.
    """
    order = list(dict.fromkeys(k for f in fields for k in f))
    factors: dict[tuple[int, ...], list[str]] = {}
    for key in order:
        column = tuple(f.get(key) for f in fields)
        if len(set(column)) > 1:
            # the partition of the configurations, so that lock-step fields share a factor
            first: dict[str | None, int] = {}
            partition = tuple(first.setdefault(v, len(first)) for v in column)
            factors.setdefault(partition, []).append(key)
    return [Factor(tuple(k)) for k in factors.values()]


@dataclass
class Band:
    """A configuration's series over its seeds on one x grid.

    Args:
        x: The grid.
        mean: Mean over the seeds at each x.
        lo: Minimum over the seeds.
        hi: Maximum over the seeds.
        seeds: How many seeds cover the grid.
        interpolated: Whether the grid holds points some seed did not log.
    """

    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    seeds: int
    interpolated: bool = False


def _increasing(points: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted by x; of repeated x (steps recomputed after a resume) the last value is kept."""
    by_x = {float(x): float(y) for x, y in points}
    xs = np.array(sorted(by_x))
    return xs, np.array([by_x[x] for x in xs])


def band(
    series: Sequence[Sequence[tuple[float, float]]], max_points: int = MAX_POINTS
) -> Band | None:
    """Mean and min-max of several seeds' ``(x, y)`` series.

    Where the seeds' x values differ (wall time), each seed is linearly interpolated onto
    the union of their x values, restricted to where the most seeds overlap (no
    extrapolation), and thinned to about ``max_points`` points.

    Args:
        series: One list of ``(x, y)`` per seed; empty ones are ignored.
        max_points: Most grid points kept.

    Returns:
        The band, or ``None`` when every series is empty.
    """
    curves = [_increasing(s) for s in series if len(s)]
    if not curves:
        return None
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    covered = np.array([(grid >= x[0]) & (grid <= x[-1]) for x, _ in curves])
    count = covered.sum(axis=0)
    keep = count == count.max()
    grid, covered = grid[keep], covered[:, keep]
    if len(grid) > max_points:
        idx = np.unique(np.linspace(0, len(grid) - 1, max_points).round().astype(int))
        grid, covered = grid[idx], covered[:, idx]
    ys = np.array([np.interp(grid, x, y) for x, y in curves])
    ys = np.where(covered, ys, np.nan)
    return Band(
        x=grid,
        mean=np.nanmean(ys, axis=0),
        lo=np.nanmin(ys, axis=0),
        hi=np.nanmax(ys, axis=0),
        seeds=int(count.max()),
        interpolated=not all(np.isin(grid, x).all() for x, _ in curves),
    )
