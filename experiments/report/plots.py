"""Plots of a section: each configuration as its mean line with a min-max band over seeds.

The first factor of the section is the colour, the second the line style and any further
ones the marker; the legend names each factor's values once, in one block per factor,
outside the axes on the right.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.report.configs import Band, Config, Section, band
from experiments.report.runs import count

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["Drawn", "Plot", "Styles", "lm_figures", "save", "titles", "vision_figures"]

DPI = 150
BAND_ALPHA = 0.18
THIN: dict[str, Any] = {"linewidth": 0.8, "alpha": 0.55}
LINE_STYLES: list[Any] = ["-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]
HATCHES = ["", "//", "..", "xx", "\\\\", "--"]
_NEUTRAL = "0.35"
# what each plot of a section's kind shows (the first line of its title), by its key in
# vision_figures and lm_figures
TITLES = {
    "vision": {"consensus": "Consensus distance between workers",
               "loss": "Training loss against wall-clock time",
               "acc": "Evaluation accuracy against epochs", "throughput": "Mean training throughput"},
    "lm": {"tokens": "Loss against tokens", "time": "Loss against wall-clock time"},
}  # fmt: skip
_THROUGHPUT = "perf/samples_per_s"


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass
class Drawn:
    """One line of a plot: whose, which key, how many points, over how many seeds."""

    label: str
    key: str
    points: int
    seeds: int


@dataclass
class Plot:
    """A drawn figure, not yet saved, and what it shows."""

    figure: Figure
    drawn: list[Drawn] = field(default_factory=list)

    @property
    def title(self) -> str:
        """The first line of the axes title (what is plotted)."""
        return self.figure.axes[0].get_title().split("\n")[0]


class Styles:
    """Colour, line style and marker of every configuration of a section, stable across plots.

    Args:
        section: The section.
    """

    def __init__(self, section: Section) -> None:
        plt = _pyplot()
        self.section = section
        factors = section.factors
        palette = list(plt.get_cmap("tab10").colors)
        self.colours: dict[str, Any] = {}
        for config in section.configs:
            value = factors[0].value(config)
            if value not in self.colours:
                black = "topology" in factors[0].keys and config.is_allreduce
                others = sum(1 for c in self.colours.values() if c != "black")
                self.colours[value] = "black" if black else palette[others % len(palette)]
        self.lines = self._cycle(self._second, LINE_STYLES)
        self.markers = self._cycle(self._rest, MARKERS) if len(factors) > 2 else {}

    def _second(self, config: Config) -> str:
        factors = self.section.factors
        return factors[1].value(config) if len(factors) > 1 else ""

    def _rest(self, config: Config) -> str:
        return ", ".join(f.value(config) for f in self.section.factors[2:])

    def _cycle(self, key: Callable[[Config], str], looks: Sequence[Any]) -> dict[str, Any]:
        values = list(dict.fromkeys(key(c) for c in self.section.configs))
        return {v: looks[i % len(looks)] for i, v in enumerate(values)}

    def colour(self, config: Config) -> Any:
        """The colour of ``config``'s first-factor value."""
        return self.colours[self.section.factors[0].value(config)]

    def line(self, config: Config) -> Any:
        """The line style of ``config``'s second-factor value (solid without one)."""
        return self.lines[self._second(config)]

    def marker(self, config: Config) -> str | None:
        """The marker of ``config``'s further factor values, ``None`` without them."""
        return self.markers[self._rest(config)] if self.markers else None

    def hatch(self, config: Config) -> str:
        """A bar hatch for ``config``'s second-factor value."""
        return HATCHES[list(self.lines).index(self._second(config)) % len(HATCHES)]

    def blocks(self, configs: Sequence[Config]) -> list[tuple[str, list[Any], list[str]]]:
        """Legend blocks ``(title, handles, labels)`` for the factor values of ``configs``."""
        from matplotlib.lines import Line2D

        factors = self.section.factors
        first = list(dict.fromkeys(factors[0].value(c) for c in configs))
        out = [
            (
                factors[0].title,
                [Line2D([], [], color=self.colours[v], linewidth=2.5) for v in first],
                first,
            )
        ]
        if len(factors) > 1:
            second = list(dict.fromkeys(self._second(c) for c in configs))
            handles = [Line2D([], [], color=_NEUTRAL, linestyle=self.lines[v]) for v in second]
            out.append((factors[1].title, handles, second))
        if self.markers:
            rest = list(dict.fromkeys(self._rest(c) for c in configs))
            handles = [
                Line2D([], [], color=_NEUTRAL, marker=self.markers[v], linestyle="none")
                for v in rest
            ]
            out.append((", ".join(f.title for f in factors[2:]), handles, rest))
        return out


def _stack_legends(
    fig: Figure, ax: Axes, blocks: Sequence[tuple[str, list[Any], list[str]]]
) -> None:
    """Legend blocks one under the other, right of the axes."""
    from matplotlib.legend import Legend

    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    top = 1.0
    for title, handles, labels in blocks:
        legend = Legend(
            ax, handles, labels, title=title or None, loc="upper left",
            bbox_to_anchor=(1.02, top), fontsize=8, title_fontsize=8, alignment="left",
            frameon=False, handlelength=2.6,
        )  # fmt: skip
        legend.set_clip_on(False)  # outside the axes, and counted in the tight bounding box
        ax.add_artist(legend)
        box = legend.get_window_extent(renderer).transformed(ax.transAxes.inverted())
        top = box.y0 - 0.02


def _context(section: Section) -> str:
    """What every run of the section shares, for titles: dataset, model, workers."""
    dataset, model = section.constant("dataset"), section.constant("model")
    workers = section.constant("world_size")
    parts = [
        f"dataset {dataset}" if dataset else "",
        f"model {model}" if model else "",
        f"{workers} workers" if workers else "",
    ]
    return ", ".join(p for p in parts if p)


def _band(config: Config, x: str, y: str, logy: bool) -> Band | None:
    series = [r.series(x, y) for r in config.runs]
    if logy:
        series = [[p for p in s if p[1] > 0] for s in series]
    return band(series)


def line_plot(
    section: Section,
    styles: Styles,
    x: str,
    y: str,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    logy: bool = False,
    scale: float = 1.0,
    thin: str | None = None,
    thin_label: str = "",
    main_label: str = "",
    x_format: Callable[[float, Any], str] | None = None,
) -> Plot:
    """Mean of ``y`` against ``x`` per configuration with its min-max band over seeds.

    Args:
        section: What to draw.
        styles: Colours and line styles of its configurations.
        x: Metrics key on the x axis.
        y: Metrics key of the main lines.
        xlabel: X axis label (with its unit).
        ylabel: Y axis label (with its unit).
        title: Axes title; the section's dataset, model and workers are appended.
        logy: Log y axis (non-positive values are dropped).
        scale: Factor applied to ``y`` and ``thin`` (1 = as logged).
        thin: Another key, drawn as the mean only, as a thin line of the same style.
        thin_label: What the thin lines are, for the legend.
        main_label: What the main lines are, for the legend (``""``: ``y`` itself).
        x_format: Tick formatter of the x axis.

    Returns:
        The figure (not saved) and what it drew.
    """
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(8.0, 4.6))
    plot = Plot(fig)
    shown: list[Config] = []
    seeds = 0
    for config in section.configs:
        colour, line, label = styles.colour(config), styles.line(config), section.label(config)
        main = _band(config, x, y, logy)
        if main is not None:
            sparse = len(main.x) < 30 and not main.interpolated  # markers on logged points
            marker = styles.marker(config) or ("." if sparse else None)
            ax.plot(main.x, main.mean * scale, color=colour, linestyle=line, linewidth=1.6,
                    marker=marker, markersize=4, markevery=max(1, len(main.x) // 15))  # fmt: skip
            if main.seeds > 1:
                ax.fill_between(main.x, main.lo * scale, main.hi * scale, color=colour,
                                alpha=BAND_ALPHA, linewidth=0)  # fmt: skip
            plot.drawn.append(Drawn(label, y, len(main.x), main.seeds))
            seeds = max(seeds, main.seeds)
        extra = _band(config, x, thin, logy) if thin is not None else None
        if extra is not None:
            ax.plot(extra.x, extra.mean * scale, color=colour, linestyle=line, **THIN)
            plot.drawn.append(Drawn(label, str(thin), len(extra.x), extra.seeds))
        if main is not None or extra is not None:
            shown.append(config)
    if x_format is not None:
        from matplotlib.ticker import FuncFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(x_format))
    if x in {"epoch", "step"}:  # counted in whole units: no 1.25 epochs on the axis
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    context = _context(section)
    ax.set_title(f"{title}\n{context}" if context else title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if not shown:
        ax.text(0.5, 0.5, f"no run logged {y}", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        return plot
    if logy:
        ax.set_yscale("log")
        low, high = ax.get_ylim()
        if high < 30 * low:  # under about a decade and a half: plain numbers read better
            from matplotlib.ticker import FuncFormatter

            plain = FuncFormatter(lambda v, _pos: f"{v:g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        ax.grid(True, which="minor", alpha=0.1)
    fig.tight_layout()  # before the legends, which go right of the axes
    blocks = styles.blocks(shown)
    thin_drawn = any(d.key == thin for d in plot.drawn)
    notes = _notes(seeds, main_label, thin_label if thin_drawn else "")
    if notes:
        blocks.append(("", *notes))
    _stack_legends(fig, ax, blocks)
    return plot


def _notes(seeds: int, main_label: str, thin_label: str) -> tuple[list[Any], list[str]] | None:
    """The reading guide: what a line, a band and a thin line are."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = []
    labels: list[str] = []
    if seeds > 1 or main_label:
        handles.append(Line2D([], [], color=_NEUTRAL, linewidth=1.6))
        mean = "mean over seeds" if seeds > 1 else ""
        labels.append(f"{main_label} ({mean})" if main_label and mean else main_label or mean)
    if seeds > 1:
        handles.append(Patch(color=_NEUTRAL, alpha=0.3))
        labels.append("min–max over seeds")
    if thin_label:
        handles.append(Line2D([], [], color=_NEUTRAL, **THIN))
        labels.append(thin_label + (" (mean over seeds)" if seeds > 1 else ""))
    return (handles, labels) if handles else None


def _bar_title(section: Section, key: str, title: str) -> str:
    """``title``, saying what the error bars are when a bar has more than one seed."""
    if any(len(c.means(key)) > 1 for c in section.configs):
        return title + " (error bars: min–max over seeds)"
    return title


def titles(section: Section) -> dict[str, str]:
    """What each plot of ``section`` shows (the first line of its title), without drawing it.

    The keys and their order are those of :func:`vision_figures` or :func:`lm_figures`.
    """
    shown = dict(TITLES[section.kind])
    if "throughput" in shown:
        shown["throughput"] = _bar_title(section, _THROUGHPUT, shown["throughput"])
    return shown


def bar_plot(section: Section, styles: Styles, key: str, ylabel: str, title: str) -> Plot:
    """Mean of every run's mean ``key`` per configuration, with min-max error bars."""
    plt = _pyplot()

    title = _bar_title(section, key, title)
    bars = [(c, c.means(key)) for c in section.configs]
    bars = [(c, v) for c, v in bars if v]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(bars) + 2.5), 4.6))
    plot = Plot(fig)
    if bars:
        for i, (config, values) in enumerate(bars):
            mean = sum(values) / len(values)
            err = [[mean - min(values)], [max(values) - mean]] if len(values) > 1 else None
            ax.bar(i, mean, color=styles.colour(config), hatch=styles.hatch(config),
                   edgecolor="white", yerr=err, capsize=3, ecolor="0.2")  # fmt: skip
            plot.drawn.append(Drawn(section.label(config), key, 1, len(values)))
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([section.label(c) for c, _ in bars], rotation=30, ha="right", fontsize=8)
    else:
        ax.text(0.5, 0.5, f"no run logged {key}", ha="center", transform=ax.transAxes)
    ax.set_ylabel(ylabel)
    context = _context(section)
    ax.set_title(f"{title}\n{context}" if context else title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return plot


def vision_figures(section: Section) -> dict[str, Plot]:
    """The vision plots: consensus, loss against time, accuracy against epochs, throughput."""
    styles = Styles(section)
    return {
        "consensus": line_plot(
            section, styles, "step", "consensus/distance", xlabel="optimizer step",
            ylabel="consensus distance (1/n) Σ‖x_i − x̄‖²", logy=True,
            title=TITLES["vision"]["consensus"],
            thin="consensus/distance_sketch", thin_label="count-sketch estimate",
            main_label="exact",
        ),
        "loss": line_plot(
            section, styles, "time_s", "train/loss", xlabel="wall-clock time (s)",
            ylabel="training loss (nats)", title=TITLES["vision"]["loss"],
        ),
        "acc": line_plot(
            section, styles, "epoch", "eval/acc", xlabel="epoch", scale=100.0,
            ylabel="eval accuracy of the averaged model (%)",
            title=TITLES["vision"]["acc"],
        ),
        "throughput": bar_plot(
            section, styles, _THROUGHPUT, "throughput (samples/s, all workers)",
            TITLES["vision"]["throughput"],
        ),
    }  # fmt: skip


def lm_figures(section: Section) -> dict[str, Plot]:
    """The language-model plots: eval loss against tokens and against wall-clock time."""
    styles = Styles(section)
    common: dict[str, Any] = {
        "ylabel": "loss (nats/token)",
        "logy": True,
        "thin": "train/loss",
        "thin_label": "training loss",
        "main_label": "eval loss, averaged model",
    }
    return {
        "tokens": line_plot(
            section, styles, "tokens", "eval/loss", xlabel="tokens (all workers)",
            title=TITLES["lm"]["tokens"], x_format=count, **common,
        ),
        "time": line_plot(
            section, styles, "time_s", "eval/loss", xlabel="wall-clock time (s)",
            title=TITLES["lm"]["time"], **common,
        ),
    }  # fmt: skip


def save(plots: dict[str, Plot], paths: dict[str, Path]) -> None:
    """Write every plot to its path as PNG and close it."""
    plt = _pyplot()

    for key, plot in plots.items():
        plot.figure.savefig(paths[key], dpi=DPI, bbox_inches="tight")
        plt.close(plot.figure)
