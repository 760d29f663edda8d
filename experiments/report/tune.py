"""Tuning one override key (a learning rate, say) over runs: the best value per group.

:func:`tune_runs` groups the runs by all of their fields
(:func:`experiments.report.configs.run_fields`) except the tuned key and the seed, and gives
for each group every value of the key that was tried, with the mean, sample standard
deviation and count over seeds of the final metric, and the best value.

* A run's value of the key is the text of its Hydra override (``.hydra/overrides.yaml``),
  else the field the report derives of that name (``topology``, ``world_size``, a summary
  field of a run without overrides). A text that parses as a finite float is a number:
  values are ordered, merged (``2e-3`` and ``0.002`` are one value, shown by the smaller
  text) and plotted by number; other texts come after the numbers, in text order.
* The metric is the final value in ``summary.json``: ``eval/loss`` (lower is better) for
  language-model runs, ``eval/acc`` (higher is better) for image runs, or the given name,
  lower is better when it contains ``loss`` or ``ppl``. A run without a finite value of it
  is an error, not a skipped run.
* The best value has the best mean. Means equal to within a relative 1e-12 are a tie, which
  goes to the value ordered first: the smaller number, else the smaller text. The choice
  depends neither on the order of the runs nor on their directory names.
* A best at the smallest or largest of two or more numeric values is flagged ``edge: widen
  the grid``; a group that tried one value reads ``single value``.

``python -m experiments.report DIR... --tune optim.lr`` adds a section of these to the
report, with ``tuned.json`` and ``tune_optim_lr.png``. For scripts::

    python -m experiments.report.tune DIR... --key optim.lr [--metric NAME] [--best]

prints a markdown table of each group's grid; with ``--best``, only the best value's
override text (``4e-3``) on stdout. It exits 2 with one ``error:`` line on stderr when there
is no run, a run lacks the key or the metric, or (with ``--best``) the runs form more than
one group.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.report.configs import (
    Config,
    Factor,
    Section,
    fill_missing,
    find_factors,
    run_fields,
    summary_extras,
)
from experiments.report.plots import (
    _NEUTRAL,
    DPI,
    Drawn,
    Plot,
    Styles,
    _context,
    _pyplot,
    _stack_legends,
)
from experiments.report.runs import SUMMARY_FILE, Run, load_all, num

__all__ = [
    "EDGE",
    "SINGLE",
    "TUNED_FILE",
    "GridValue",
    "TunedGroup",
    "geometric",
    "grid_tables",
    "key_value",
    "lower_is_better",
    "main",
    "number",
    "plot_name",
    "report_section",
    "tune_plot",
    "tune_runs",
    "tuned_json",
    "tuned_section",
]

TUNED_FILE = "tuned.json"
EDGE = "edge: widen the grid"
SINGLE = "single value"
_TIE = 1e-12  # relative difference of two means below which they are a tie
_RATIO_SPREAD = 1.05  # consecutive ratios within 5 % of each other: a geometric grid
_WIDE = 8.0  # a grid spanning this factor or more reads better on a log axis too
_MAX_TICKS = 12  # up to this many values, each gets its own tick, labelled by its text
_MAX_LABELS = 6  # groups named in the error of --best


def plot_name(key: str) -> str:
    """The plot's file name for ``key``: ``optim.lr`` gives ``tune_optim_lr.png``."""
    return "tune_" + re.sub(r"[^A-Za-z0-9_-]", "_", key) + ".png"


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
    def flag(self) -> str:
        """``edge: widen the grid``, ``single value``, or ``""`` for an interior best."""
        if len(self.grid) == 1:
            return SINGLE
        return EDGE if self.edge else ""


def _missing(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return f"{value!r}, not a finite number"


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
            the metric (missing, null or not a number in ``summary.json``); a group mixes
            language-model and image runs while ``metric`` is ``None``. The message is one
            line. A NaN or infinite final (a diverged run) is no error: it ranks worst.
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
        found: dict[tuple[int, float, str], list[tuple[str, Run, float]]] = {}
        for run, text in zip(config.runs, values):
            final: Any = run.summary.get(name)
            if isinstance(final, float) and not math.isfinite(final):
                # a diverged run ranks worst, so a grid that reaches divergence still picks
                final = math.inf if lower_is_better(name) else -math.inf
            elif not num(final):
                why = _missing(final) if name in run.summary else "missing"
                raise ValueError(
                    f"run {run.path}: {name} is {why} in {SUMMARY_FILE}; cannot tune {key}"
                )
            value = number(text)
            order = (0, value, "") if value is not None else (1, 0.0, text)
            found.setdefault(order, []).append((text, run, float(final)))
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


def tuned_section(groups: Sequence[TunedGroup]) -> Section:
    """The groups as a report section, for their labels, factors and plot styles.

    Args:
        groups: From :func:`tune_runs` (at least one).

    Returns:
        A section with one configuration per group, in order; with a single group the
        factor is its topology (or its first field), so that labels are never empty.
    """
    configs = [g.config for g in groups]
    factors = find_factors([c.fields for c in configs])
    if not factors:
        first = configs[0].fields
        factors = [
            Factor(("topology",) if "topology" in first else (next(iter(first), "topology"),))
        ]
    kind = "lm" if all(r.is_lm for c in configs for r in c.runs) else "vision"
    return Section(kind, configs, factors)


def _metric_of(groups: Sequence[TunedGroup]) -> str | None:
    """The metric every group compares, ``None`` when they differ."""
    metrics = {g.metric for g in groups}
    return metrics.pop() if len(metrics) == 1 else None


def _better(groups: Sequence[TunedGroup]) -> str:
    ways = {g.lower_is_better for g in groups}
    if len(ways) > 1:
        return ""
    return "lower is better" if ways.pop() else "higher is better"


def _fmt(value: float | None, like: float | None = None) -> str:
    """Four decimals (as the report's tables), or three significant digits for values far
    from one; ``like`` picks the format instead (a std is written as its mean)."""
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return "diverged"
    scale = value if like is None else like
    if scale == 0 or 1e-2 <= abs(scale) < 1e6:
        return f"{value:.4f}"
    return f"{value:.3e}"


def _stat(value: GridValue) -> str:
    """``mean ± sample std``, the bare mean for one seed."""
    std = value.std
    return _fmt(value.mean) if std is None else f"{_fmt(value.mean)} ± {_fmt(std, value.mean)}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _summary_table(groups: Sequence[TunedGroup], section: Section) -> list[str]:
    """One row per group: its factors, the best value, its metric, seeds, the grid, the flag."""
    key = groups[0].key
    metric = _metric_of(groups)
    head = [f.title for f in section.factors] + [key]
    head += [f"final {metric}" if metric else "metric", "seeds", "tried (mean)", "note"]
    numbers = {"final", "seeds"}
    lines = [_row(head), _row(["---:" if h.split()[0] in numbers else "---" for h in head])]
    for group, config in zip(groups, section.configs):
        best = group.best
        tried = ", ".join(
            f"**{v.text}: {_fmt(v.mean)}**" if v is best else f"{v.text}: {_fmt(v.mean)}"
            for v in group.grid
        )
        stat = _stat(best) if metric else f"{group.metric} {_stat(best)}"
        cells = [f.value(config) for f in section.factors]
        lines.append(_row([*cells, best.text, stat, str(best.n), tried, group.flag]))
    return lines


def grid_tables(groups: Sequence[TunedGroup]) -> list[str]:
    """A short markdown table of each group's grid, the best value marked.

    Args:
        groups: From :func:`tune_runs`.

    Returns:
        Markdown lines.
    """
    section = tuned_section(groups)
    lines: list[str] = []
    for group, config in zip(groups, section.configs):
        better = "lower" if group.lower_is_better else "higher"
        note = f" ({group.flag})" if group.flag else ""
        lines += [
            f"### {section.label(config)}",
            "",
            f"Final `{group.metric}` ({better} is better); best {group.key}={group.best.text}"
            f"{note}.",
            "",
            _row([group.key, "mean", "std", "seeds", "best"]),
            _row(["---:", "---:", "---:", "---:", "---"]),
        ]
        lines += [
            _row(
                [
                    v.text,
                    _fmt(v.mean),
                    _fmt(v.std, v.mean),
                    str(v.n),
                    "best" if v is group.best else "",
                ]
            )
            for v in group.grid
        ]
        lines.append("")
    return lines[:-1]


def _finite(value: float | None) -> float | None:
    """``None`` for a diverged value: strict JSON has no infinity."""
    return value if num(value) else None


def _value_json(value: GridValue) -> dict[str, Any]:
    return {"text": value.text, "value": value.value, "mean": _finite(value.mean),
            "std": value.std, "n": value.n, "diverged": value.diverged}  # fmt: skip


def tuned_json(groups: Sequence[TunedGroup]) -> dict[str, Any]:
    """What ``tuned.json`` holds: the key, the metric and, per group, the best and the grid.

    Args:
        groups: From :func:`tune_runs` (at least one).

    Returns:
        ``{"key", "metric" (None when the groups compare different metrics), "groups": [{
        "label", "fields", "factors", "metric", "lower_is_better", "best": {"text", "value",
        "mean", "std", "n"}, "edge", "flag", "grid": [{"text", "value", "mean", "std", "n",
        "min", "max", "runs"}]}]}``; ``value`` is ``None`` for a text that is no number and
        ``std`` for a single seed.
    """
    section = tuned_section(groups)
    out = []
    for group, config in zip(groups, section.configs):
        out.append({
            "label": section.label(config),
            "fields": dict(config.fields),
            "factors": {f.title: f.value(config) for f in section.factors},
            "metric": group.metric,
            "lower_is_better": group.lower_is_better,
            "best": _value_json(group.best),
            "edge": group.edge,
            "flag": group.flag,
            "grid": [
                {**_value_json(v), "min": _finite(v.lo), "max": _finite(v.hi),
                 "runs": [str(p) for p in v.runs]}  # fmt: skip
                for v in group.grid
            ],
        })  # fmt: skip
    return {"key": groups[0].key, "metric": _metric_of(groups), "groups": out}


def geometric(values: Sequence[float]) -> bool:
    """Whether a grid reads better on a log axis.

    It does when every value is positive and either the consecutive ratios of its
    distinct values agree to within 5 % (three values or more), or the largest value is
    at least 8 times the smallest.

    Args:
        values: The grid's numbers, any order, repeats allowed.

    Returns:
        ``True`` for a log axis.
    """
    xs = sorted(set(values))
    if len(xs) < 2 or xs[0] <= 0:
        return False
    if xs[-1] / xs[0] >= _WIDE:
        return True
    ratios = [b / a for a, b in zip(xs, xs[1:])]
    return len(ratios) > 1 and max(ratios) <= _RATIO_SPREAD * min(ratios)


def tune_plot(groups: Sequence[TunedGroup]) -> Plot:
    """The final metric against the tuned key: a line per group, the best point starred.

    Each point is the mean over the seeds with min-max error bars. Numeric grids are drawn
    by number, on a log axis when :func:`geometric`; other grids one tick per value.

    Args:
        groups: From :func:`tune_runs` (at least one).

    Returns:
        The figure (not saved) and what it drew.
    """
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    plt = _pyplot()
    section = tuned_section(groups)
    styles = Styles(section)
    key = groups[0].key
    texts: dict[tuple[int, float, str], str] = {}
    for group in groups:
        for v in group.grid:
            texts[v.order] = min(v.text, texts.get(v.order, v.text))
    order = sorted(texts)
    numeric = all(g.numeric for g in groups)
    index = {o: float(i) for i, o in enumerate(order)}

    def x_of(v: GridValue) -> float:
        return v.value if v.value is not None and numeric else index[v.order]

    ticks = [o[1] for o in order] if numeric else list(index.values())
    fig, ax = plt.subplots(figsize=(8.0, 4.6))
    plot = Plot(fig)
    seeds = 0
    for group, config in zip(groups, section.configs):
        colour = styles.colour(config)
        shown = [v for v in group.grid if not v.diverged]  # a diverged value has no point
        xs = [x_of(v) for v in shown]
        means = [v.mean for v in shown]
        spread = [[v.mean - v.lo for v in shown], [v.hi - v.mean for v in shown]]
        most = max(v.n for v in group.grid)
        ax.errorbar(xs, means, yerr=spread if most > 1 else None, color=colour,
                    linestyle=styles.line(config), marker=styles.marker(config) or "o",
                    markersize=4, linewidth=1.6, elinewidth=1.0, capsize=3)  # fmt: skip
        best = group.best
        if not best.diverged:
            ax.plot([x_of(best)], [best.mean], marker="*", markersize=14, color=colour,
                    markeredgecolor="black", markeredgewidth=0.8, linestyle="none",
                    zorder=5)  # fmt: skip
        plot.drawn.append(Drawn(section.label(config), group.metric, len(xs), most))
        seeds = max(seeds, most)
    if numeric and geometric(ticks):
        ax.set_xscale("log")
    if not numeric or len(ticks) <= _MAX_TICKS:
        ax.set_xticks(ticks, [texts[o] for o in order])
        ax.xaxis.set_minor_locator(NullLocator())  # the log axis' own minor labels would clash
    metric = _metric_of(groups)
    better = _better(groups)
    ax.set_xlabel(key)
    ax.set_ylabel(f"final {metric or 'metric'}" + (f" ({better})" if better else ""))
    title = f"Final {metric or 'metric'} against {key}"
    context = _context(section)
    ax.set_title(f"{title}\n{context}" if context else title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()  # before the legends, which go right of the axes
    blocks = styles.blocks(section.configs)
    handles: list[Any] = [Line2D([], [], color=_NEUTRAL, marker="o", markersize=4)]
    labels = ["mean over seeds" if seeds > 1 else "one seed"]
    if seeds > 1:
        handles.append(Line2D([], [], color=_NEUTRAL, marker="|", markersize=10, linestyle="none"))
        labels.append("min–max over seeds")
    handles.append(Line2D([], [], color=_NEUTRAL, marker="*", markersize=10, linestyle="none",
                          markeredgecolor="black"))  # fmt: skip
    labels.append("best value")
    blocks.append(("", handles, labels))
    _stack_legends(fig, ax, blocks)
    return plot


def report_section(groups: Sequence[TunedGroup], out: Path) -> list[str]:
    """Write ``tuned.json`` and the plot into ``out``; the report's ``Tuned`` section.

    Args:
        groups: From :func:`tune_runs` (at least one).
        out: The report's directory.

    Returns:
        Markdown lines, from the ``## Tuned: <key>`` heading on.
    """
    key = groups[0].key
    (out / TUNED_FILE).write_text(json.dumps(tuned_json(groups), indent=2) + "\n")
    plot = tune_plot(groups)
    path = out / plot_name(key)
    plot.figure.savefig(path, dpi=DPI, bbox_inches="tight")
    _pyplot().close(plot.figure)
    metric, better = _metric_of(groups), _better(groups)
    what = f"final `{metric}`" if metric else "final metric"
    if better:
        what += f" ({better})"
    lines = [
        f"## Tuned: {key}",
        "",
        f"Runs that differ only in `{key}` and the seed form a group. Per group: the value of "
        f"`{key}` with the best mean {what} over its seeds, that mean ± the sample standard "
        "deviation, the seeds behind it, and every value tried with its mean (the best in "
        "bold). Equal means go to the smaller value. *edge: widen the grid*: the best is the "
        f"smallest or largest value tried. The numbers are also in `{TUNED_FILE}`.",
        "",
        *_summary_table(groups, tuned_section(groups)),
        "",
        f"![{plot.title}]({path.name})",
        "",
    ]
    return lines


def _several(groups: Sequence[TunedGroup]) -> str:
    section = tuned_section(groups)
    differ = ", ".join(k for f in section.factors for k in f.keys)
    labels = [section.label(c) for c in section.configs]
    named = "; ".join(labels[:_MAX_LABELS]) + ("; ..." if len(labels) > _MAX_LABELS else "")
    return (
        f"the runs form {len(groups)} groups that differ in {differ} ({named}); "
        "--best needs the runs of one group"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.report.tune",
        description="The best value of an override key over sweep or run directories.",
    )
    parser.add_argument("dirs", nargs="+", help="sweep or run directories (searched recursively)")
    parser.add_argument("--key", required=True, help="the tuned override key, e.g. optim.lr")
    parser.add_argument("--metric", default=None, help="final metric (default eval/loss or acc)")
    parser.add_argument("--best", action="store_true", help="print only the best value's text")
    args = parser.parse_args(argv)
    try:
        # one line per warning on stderr: stdout stays the answer alone
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runs, skipped = load_all(args.dirs)
        for warning in caught:
            print(f"warning: {warning.message}", file=sys.stderr)
        for path, why in skipped:
            print(f"warning: skipping run {path}: {why}", file=sys.stderr)
        if not runs:
            raise ValueError(f"no usable run under {', '.join(args.dirs)}")
        groups = tune_runs(runs, args.key, args.metric)
        if args.best and len(groups) > 1:
            raise ValueError(_several(groups))
        if args.best and groups[0].best.diverged:
            raise ValueError(f"every value of {args.key} tried diverged; no best to give")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.best:
        (group,) = groups
        print(group.best.text)
        if group.edge:
            print(f"warning: {args.key}={group.best.text}: {EDGE}", file=sys.stderr)
        return 0
    print("\n".join(grid_tables(groups)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
