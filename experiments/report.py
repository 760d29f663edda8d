"""Report over finished runs: a markdown table and plots.

``python -m experiments.report SWEEP_OR_RUN_DIR... [--target-acc 0.9] [--out DIR]``
(or ``make report``) finds every run directory under the given directories (a
directory holding ``metrics.jsonl`` and/or ``summary.json``, searched
recursively) and writes ``report.md`` and four PNG plots into ``--out``, or
into the first given directory:

* ``consensus_vs_step.png``: consensus distance against optimizer steps (log y): the
  exact values (logged with every evaluation) as points, and the count-sketch estimate
  of every metrics line (``consensus/distance_sketch``) as a thin line of the same
  colour and style;
* ``loss_vs_time.png``: training loss against wall-clock seconds;
* ``acc_vs_epoch.png``: accuracy of the globally averaged model against epochs;
* ``throughput.png``: mean samples/s of every run.

The table has one row per run: final ``eval/acc`` and ``eval/acc_local``,
the time ``time_s`` of the first evaluation reaching ``--target-acc``, mean
samples/s, the speedup over the ``allreduce`` run of the same world size,
dataset, model and network (samples/s ratio), and the mean and final
consensus distance. Rows of emulated networks read ``(emulated <network>)``
and rows on synthetic data ``(synthetic)``.

A run without a readable ``summary.json`` or without any valid metrics line is
skipped with a warning; single malformed lines are skipped too.

One module of about 500 lines on purpose: loading runs, the table and the four plots
serve this one report, and a new column or plot changes all three together.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Run", "find_run_dirs", "load_run", "build_report", "main"]

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOTS = {
    "consensus": "consensus_vs_step.png",
    "loss": "loss_vs_time.png",
    "acc": "acc_vs_epoch.png",
    "throughput": "throughput.png",
}
ALLREDUCE = "allreduce"
_SKIP_DIRS = {"wandb", "checkpoints", "__pycache__"}


@dataclass
class Run:
    """One run directory, loaded.

    Args:
        path: The run directory.
        summary: ``summary.json``.
        metrics: The valid lines of ``metrics.jsonl``, in file order.

    Example::

        run = load_run(Path("multirun/2024-01-01/12-00-00/0"))
        if run is not None:
            print(run.name, run.final("eval/acc"))
    """

    path: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""

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
    def name(self) -> str:
        """The table's row name: topology, plus the emulation and synthetic-data tags."""
        name = self.topology
        if self.emulated:
            name += f" (emulated {self.network})"
        if self.summary.get("synthetic"):
            name += " (synthetic)"
        return name

    def series(self, x: str, y: str) -> list[tuple[float, float]]:
        """``(x, y)`` pairs of the lines that hold both as numbers."""
        return [(row[x], row[y]) for row in self.metrics if _num(row.get(x)) and _num(row.get(y))]

    def final(self, key: str) -> float | None:
        """The summary's value of ``key``, else the last logged one."""
        if _num(self.summary.get(key)):
            return float(self.summary[key])
        return self.last(key)

    def last(self, key: str) -> float | None:
        """The last logged value of ``key``."""
        for row in reversed(self.metrics):
            if _num(row.get(key)):
                return float(row[key])
        return None

    def mean(self, key: str) -> float | None:
        """The summary's value of ``key`` (a mean there), else the mean of the logged values."""
        if _num(self.summary.get(key)):
            return float(self.summary[key])
        values = [float(row[key]) for row in self.metrics if _num(row.get(key))]
        return sum(values) / len(values) if values else None

    def time_to(self, target: float) -> float | None:
        """``time_s`` of the first line with ``eval/acc >= target``."""
        for t, acc in self.series("time_s", "eval/acc"):
            if acc >= target:
                return float(t)
        return None


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
        ``metrics.jsonl`` is missing or has no valid line.
    """
    loaded = _load(Path(path))
    if isinstance(loaded, str):
        warnings.warn(f"skipping run {path}: {loaded}", stacklevel=2)
        return None
    return loaded


def _load(path: Path) -> Run | str:
    """The run, or why it cannot be used."""
    summary_path, metrics_path = path / SUMMARY_FILE, path / METRICS_FILE
    if not summary_path.is_file():
        return f"no {SUMMARY_FILE} (the run did not finish)"
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{SUMMARY_FILE} is not valid JSON ({exc})"
    if not isinstance(summary, dict) or not summary.get("topology"):
        return f"{SUMMARY_FILE} has no topology"
    if not metrics_path.is_file():
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
        if isinstance(row, dict) and _num(row.get("step")):
            metrics.append(row)
        else:
            bad.append(number)
    if bad:
        warnings.warn(
            f"{metrics_path}: skipped {len(bad)} malformed line(s), first at line {bad[0]}",
            stacklevel=3,
        )
    if not metrics:
        return f"{METRICS_FILE} has no valid line"
    return Run(path, summary, metrics)


# --- table ---------------------------------------------------------------------------------


def _group_key(run: Run) -> tuple[Any, ...]:
    s = run.summary
    return (s.get("world_size"), s.get("dataset"), s.get("model"), run.network)


def _baselines(runs: Sequence[Run]) -> dict[tuple[Any, ...], float]:
    """Mean samples/s of the allreduce runs of each (world size, dataset, model, network)."""
    speeds: dict[tuple[Any, ...], list[float]] = {}
    for run in runs:
        speed = run.mean("perf/samples_per_s")
        if run.topology == ALLREDUCE and speed:
            speeds.setdefault(_group_key(run), []).append(speed)
    return {k: sum(v) / len(v) for k, v in speeds.items()}


def _f(value: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def _table(runs: Sequence[Run], target: float, out: Path) -> list[str]:
    base = _baselines(runs)
    head = (
        "| run | world size | dataset | final eval/acc | eval/acc_local | "
        f"time to acc {target:g} | samples/s | speedup vs allreduce | "
        "consensus distance (mean) | consensus distance (final) | dir |"
    )
    lines = [head, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        speed = run.mean("perf/samples_per_s")
        ref = base.get(_group_key(run))
        speedup = speed / ref if speed is not None and ref else None
        reached = run.time_to(target)
        try:
            where = os.path.relpath(run.path, out)
        except ValueError:  # another drive on Windows
            where = str(run.path)
        cells = [
            run.name,
            str(run.summary.get("world_size", "n/a")),
            str(run.summary.get("dataset", "n/a")),
            _f(run.final("eval/acc"), ".4f"),
            _f(run.final("eval/acc_local"), ".4f"),
            "not reached" if reached is None else f"{reached:.1f} s",
            _f(speed, ".1f"),
            _f(speedup, ".2f", "x"),
            _f(run.mean("consensus/distance"), ".3e"),
            _f(run.last("consensus/distance"), ".3e"),
            f"`{where}`",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# --- plots ---------------------------------------------------------------------------------


def _plot_labels(runs: Sequence[Run]) -> None:
    """Name each run by topology (+ network when emulated); add n, seed, dir until unique."""
    for run in runs:
        run.label = run.topology + (f" [{run.network}]" if run.emulated else "")
    extras = (
        lambda r: f" n={r.summary.get('world_size')}",
        lambda r: f" {r.summary.get('dataset')}",
        lambda r: f" seed={r.summary.get('seed')}",
        lambda r: f" ({r.path.name})",
    )
    for extra in extras:
        groups: dict[str, list[Run]] = {}
        for run in runs:
            groups.setdefault(run.label, []).append(run)
        for group in groups.values():
            tags = [extra(r) for r in group]
            if len(group) > 1 and len(set(tags)) > 1:  # only tags that tell them apart
                for run, tag in zip(group, tags):
                    run.label += tag
    groups = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    for group in groups.values():
        if len(group) > 1:
            for i, run in enumerate(group):
                run.label += f" #{i + 1}"


def _line_plot(
    runs: Sequence[Run],
    x: str,
    y: str,
    xlabel: str,
    ylabel: str,
    title: str,
    path: Path,
    logy: bool,
    thin: str | None = None,
    thin_label: str | None = None,
) -> list[tuple[str, str, int]]:
    """Plot ``y`` of every run against ``x``; with ``thin``, ``y`` as points and ``thin`` as lines.

    Returns:
        ``(run label, key, number of points)`` of every line drawn.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10.0, 4.5))
    drawn: list[tuple[str, str, int]] = []
    colors, styles = _styles(runs)
    for run in runs:
        pts = run.series(x, y)
        thin_pts = run.series(x, thin) if thin is not None else []
        if logy:
            pts = [p for p in pts if p[1] > 0]
            thin_pts = [p for p in thin_pts if p[1] > 0]
        style = {"color": colors[run.topology], "linestyle": styles[run.network]}
        if pts and thin is not None:
            # sparse exact values: points only, a line between them would hide what the
            # thin line shows
            ax.plot(*zip(*pts), label=run.label, marker="o", markersize=4, linestyle="none",
                    color=style["color"])  # fmt: skip
            drawn.append((run.label, y, len(pts)))
        elif pts:
            ax.plot(*zip(*pts), label=run.label, marker="." if len(pts) < 30 else None, **style)
            drawn.append((run.label, y, len(pts)))
        if thin_pts:
            # labelled only when the run has no main line, so that it still appears in the legend
            label = None if pts else run.label
            ax.plot(*zip(*thin_pts), label=label, linewidth=0.7, alpha=0.6, **style)
            drawn.append((run.label, str(thin), len(thin_pts)))
    if thin is not None and any(key == thin for _, key, _ in drawn):
        ax.plot([], [], color="gray", linewidth=0.7, alpha=0.6, label=thin_label or thin)
    if logy and drawn:
        ax.set_yscale("log")
    if drawn:
        # outside the axes: a sweep easily has a dozen runs
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, f"no run logged {y}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def _styles(runs: Sequence[Run]) -> tuple[dict[str, Any], dict[str, str]]:
    """One colour per topology, one line style per network, stable across plots."""
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab10").colors
    topologies = sorted({r.topology for r in runs})
    networks = sorted({r.network for r in runs}, key=lambda n: (n != "none", n))
    colors = {
        t: ("black" if t == ALLREDUCE else palette[i % len(palette)])
        for i, t in enumerate(topologies)
    }
    line_styles = ["-", "--", ":", "-."]
    return colors, {n: line_styles[i % len(line_styles)] for i, n in enumerate(networks)}


def _bar_plot(runs: Sequence[Run], path: Path) -> None:
    import matplotlib.pyplot as plt

    pairs = [(r.label, r.mean("perf/samples_per_s")) for r in runs]
    pairs = [(label, v) for label, v in pairs if v is not None]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(pairs) + 2), 4.5))
    if pairs:
        labels, values = zip(*pairs)
        colors = ["black" if label.startswith(ALLREDUCE) else "tab:blue" for label in labels]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no run logged perf/samples_per_s", ha="center", transform=ax.transAxes)
    ax.set_ylabel("throughput (samples/s, all workers)")
    ax.set_title("Mean training throughput")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plots(runs: Sequence[Run], out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    paths = {key: out / name for key, name in PLOTS.items()}
    _plot_labels(runs)
    _line_plot(runs, "step", "consensus/distance", "optimizer step",
               "consensus distance (1/n) Σ‖x_i − x̄‖² (log)",
               "Consensus distance (points: exact; thin lines: count-sketch estimate)",
               paths["consensus"], logy=True, thin="consensus/distance_sketch",
               thin_label="thin lines: count-sketch estimate")  # fmt: skip
    _line_plot(runs, "time_s", "train/loss", "wall-clock time (s)", "training loss",
               "Training loss vs time", paths["loss"], logy=False)  # fmt: skip
    _line_plot(runs, "epoch", "eval/acc", "epoch", "eval accuracy (averaged model, fraction)",
               "Evaluation accuracy", paths["acc"], logy=False)  # fmt: skip
    _bar_plot(runs, paths["throughput"])
    return paths


# --- entry points --------------------------------------------------------------------------


def _sort_key(run: Run) -> tuple[Any, ...]:
    s = run.summary
    return (
        str(s.get("dataset")),
        str(s.get("model")),
        run.network != "none",
        run.network,
        s.get("world_size") if isinstance(s.get("world_size"), int) else -1,
        run.topology != ALLREDUCE,
        run.topology,
        str(s.get("seed")),
        str(run.path),
    )


def build_report(
    dirs: Sequence[str | Path] | str | Path, target_acc: float = 0.9, out: str | Path | None = None
) -> Path:
    """Write ``report.md`` and the plots for every usable run under ``dirs``.

    Args:
        dirs: Sweep or run directories (searched recursively).
        target_acc: Accuracy (a fraction in ``(0, 1]``) for the time-to-accuracy column.
        out: Output directory; the first of ``dirs`` when ``None``.

    Returns:
        The path of ``report.md``.

    Raises:
        ValueError: No directory given, a path is not a directory, ``target_acc``
            is out of range, or no usable run was found.
    """
    if isinstance(dirs, (str, Path)):
        dirs = [dirs]
    if not dirs:
        raise ValueError("no directory given; pass sweep or run directories")
    if not (_num(target_acc) and 0 < target_acc <= 1):
        raise ValueError(f"target_acc={target_acc!r} is invalid; it must be in (0, 1]")
    candidates = find_run_dirs(dirs)
    runs: list[Run] = []
    skipped: list[tuple[Path, str]] = []
    for path in candidates:
        loaded = _load(path)
        if isinstance(loaded, str):
            warnings.warn(f"skipping run {path}: {loaded}", stacklevel=2)
            skipped.append((path, loaded))
        else:
            runs.append(loaded)
    if not runs:
        raise ValueError(
            f"no usable run (a directory with {SUMMARY_FILE} and {METRICS_FILE}) under "
            f"{', '.join(str(d) for d in dirs)}"
        )
    runs.sort(key=_sort_key)
    out_dir = Path(out) if out is not None else Path(dirs[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = _plots(runs, out_dir)
    lines = [
        "# Run report",
        "",
        f"{len(runs)} run(s) from {', '.join(f'`{d}`' for d in dirs)}; "
        f"{len(skipped)} skipped. Speedup: samples/s over the mean of the `allreduce` runs "
        "with the same world size, dataset, model and network. Consensus distance: "
        "(1/n) Σ_i ‖x_i − x̄‖².",
        "",
        *_table(runs, target_acc, out_dir),
    ]
    if skipped:
        lines += ["", "Skipped (missing or malformed files):", ""]
        lines += [f"- `{p}`: {why}" for p, why in skipped]
    lines += ["", "## Plots", ""]
    titles = {
        "consensus": "Consensus distance vs step",
        "loss": "Training loss vs wall-clock time",
        "acc": "Evaluation accuracy vs epoch",
        "throughput": "Throughput",
    }
    for key, path in plots.items():
        lines += [f"![{titles[key]}]({path.name})", ""]
    report = out_dir / REPORT_FILE
    report.write_text("\n".join(lines).rstrip() + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.report",
        description="Markdown table and plots over sweep or run directories.",
    )
    parser.add_argument("dirs", nargs="+", help="sweep or run directories (searched recursively)")
    parser.add_argument("--target-acc", type=float, default=0.9, help="for time-to-accuracy")
    parser.add_argument("--out", default=None, help="output directory (default: the first dir)")
    args = parser.parse_args(argv)
    try:
        path = build_report(args.dirs, args.target_acc, args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
