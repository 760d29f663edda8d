"""What tuning shows: the report's ``Tuned`` section, the grid tables, ``tuned.json``, the plot.

Everything here reads the groups :func:`experiments.report.tune_grid.tune_runs` ranked;
nothing here ranks.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.report.configs import Factor, Section, find_factors
from experiments.report.doc_data import md_table
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
from experiments.report.runs import num
from experiments.report.tune_grid import GridValue, TunedGroup

__all__ = [
    "TUNED_FILE",
    "geometric",
    "grid_tables",
    "plot_name",
    "report_section",
    "tune_plot",
    "tuned_json",
    "tuned_section",
]

TUNED_FILE = "tuned.json"
_RATIO_SPREAD = 1.05  # consecutive ratios within 5 % of each other: a geometric grid
_WIDE = 8.0  # a grid spanning this factor or more reads better on a log axis too
_MAX_TICKS = 12  # up to this many values, each gets its own tick, labelled by its text


def _plot_title(groups: Sequence[TunedGroup]) -> str:
    """What :func:`tune_plot` shows, the first line of its title."""
    return f"Final {_metric_of(groups) or 'metric'} against {groups[0].key}"


def plot_name(key: str) -> str:
    """The plot's file name for ``key``: ``optim.lr`` gives ``tune_optim_lr.png``."""
    return "tune_" + re.sub(r"[^A-Za-z0-9_-]", "_", key) + ".png"


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


def _summary_table(groups: Sequence[TunedGroup], section: Section) -> list[str]:
    """One row per group: its factors, the best value, its metric, seeds, the grid, the flag."""
    key = groups[0].key
    metric = _metric_of(groups)
    head = [f.title for f in section.factors] + [key]
    head += [f"final {metric}" if metric else "metric", "seeds", "tried (mean)", "note"]
    numbers = {"final", "seeds"}
    align = ["r" if h.split()[0] in numbers else "l" for h in head]
    rows = []
    for group, config in zip(groups, section.configs):
        best = group.best
        tried = ", ".join(
            f"**{v.text}: {_fmt(v.mean)}**" if v is best else f"{v.text}: {_fmt(v.mean)}"
            for v in group.grid
        )
        stat = _stat(best) if metric else f"{group.metric} {_stat(best)}"
        cells = [f.value(config) for f in section.factors]
        rows.append([*cells, best.text, stat, str(best.n), tried, group.flag])
    return md_table(head, align, rows, padded=True).split("\n")


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
        ]
        rows = [
            [v.text, _fmt(v.mean), _fmt(v.std, v.mean), str(v.n), "best" if v is group.best else ""]
            for v in group.grid
        ]
        head = [group.key, "mean", "std", "seeds", "best"]
        lines += [*md_table(head, "rrrrl", rows, padded=True).split("\n"), ""]
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
    title = _plot_title(groups)
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


def report_section(groups: Sequence[TunedGroup], out: Path | None = None) -> list[str]:
    """The report's ``Tuned`` section; with ``out``, write ``tuned.json`` and the plot there.

    Args:
        groups: From :func:`tune_runs` (at least one).
        out: The report's directory; ``None`` for the markdown alone.

    Returns:
        Markdown lines, from the ``## Tuned: <key>`` heading on.
    """
    key = groups[0].key
    if out is not None:
        (out / TUNED_FILE).write_text(json.dumps(tuned_json(groups), indent=2) + "\n")
        plot = tune_plot(groups)
        plot.figure.savefig(out / plot_name(key), dpi=DPI, bbox_inches="tight")
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
        f"![{_plot_title(groups)}]({plot_name(key)})",
        "",
    ]
    return lines
