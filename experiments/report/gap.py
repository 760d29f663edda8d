"""How far one arm ends behind a baseline, paired seed by seed, for several settings side by side.

Each ``--pair LABEL BASE OTHER`` names a setting (e.g. ``W=8``) and two folders of runs (each
holding one configuration, one run per seed, as ``tune.sh`` leaves ``final/``). The gap is
``OTHER - BASE`` of the final metric on each seed both have (same seed: same data order and
initial model), then its mean and sample standard deviation over those seeds::

    python -m experiments.report.gap --pair LABEL BASE OTHER [--pair ...] --out DIR
        [--metric eval/loss] [--title TEXT]

It writes ``DIR/gap.md`` (one row per setting) and ``DIR/gap.png`` (the gap of each setting
with its seeds as dots).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.report.doc_data import md_table
from experiments.report.plots import _pyplot


@dataclass
class Gap:
    """One setting: the baseline's and the other arm's final metric per seed."""

    label: str
    base: dict[int, float]
    other: dict[int, float]

    def seeds(self) -> list[int]:
        """The seeds both arms ran."""
        return sorted(set(self.base) & set(self.other))

    def diffs(self) -> list[float]:
        """``other - base`` on each common seed."""
        return [self.other[s] - self.base[s] for s in self.seeds()]


def finals(folder: Path, metric: str) -> dict[int, float]:
    """``{seed: final metric}`` of the runs under ``folder`` (one configuration).

    Raises:
        ValueError: no run under ``folder``, a run without the metric, or two runs of one seed.
    """
    out: dict[int, float] = {}
    summaries = sorted(folder.rglob("summary.json"))
    if not summaries:
        raise ValueError(f"{folder}: no run (no summary.json under it)")
    for path in summaries:
        summary = json.loads(path.read_text())
        value, seed = summary.get(metric), int(summary.get("seed", 0))
        if not isinstance(value, (int, float)):
            raise ValueError(f"{path}: no {metric!r}")
        if seed in out:
            raise ValueError(f"{folder}: two runs of seed {seed}; give one configuration's runs")
        out[seed] = float(value)
    return out


def _mean_sd(values: Sequence[float]) -> str:
    if not values:
        return "–"
    sd = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.3f}{sd}"


def table(gaps: Sequence[Gap], metric: str) -> str:
    """Markdown: each setting's two arms over their seeds and the gap paired by seed."""
    rows = [
        [g.label, _mean_sd(list(g.base.values())), _mean_sd(list(g.other.values())),
         _mean_sd(g.diffs()), ", ".join(f"{d:+.3f}" for d in g.diffs()) or "–", str(len(g.seeds()))]
        for g in gaps
    ]  # fmt: skip
    head = ["setting", "base", "other", "gap", "gap per seed", "seeds"]
    return (
        f"`{metric}` at the end, mean ± sd over seeds; the gap is other − base on each seed "
        f"both ran.\n\n{md_table(head, 'lrrrlr', rows)}\n"
    )


def plot(gaps: Sequence[Gap], path: Path, metric: str, title: str) -> None:
    """Each setting's mean gap as a bar, its seeds as dots, zero marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.3 * len(gaps) + 2.5, 3.4))
    for i, g in enumerate(gaps):
        d = g.diffs()
        if d:
            ax.bar(i, statistics.fmean(d), color="0.75", width=0.6)
            ax.scatter([i] * len(d), d, color="C0", zorder=3, s=18)
    ax.axhline(0, color="0.3", linewidth=0.8)
    ax.set_xticks(range(len(gaps)), [g.label for g in gaps])
    ax.set_ylabel(f"{metric}: other − base")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: read each pair, write gap.md and gap.png."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.report.gap",
        description="The gap of one arm behind a baseline, paired by seed, per setting.",
    )
    parser.add_argument("--pair", nargs=3, action="append", required=True,
                        metavar=("LABEL", "BASE", "OTHER"), help="a setting and its two arms")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="where gap.md and gap.png go")
    parser.add_argument("--metric", default="eval/loss", help="summary.json key")
    parser.add_argument("--title", default="", help="the plot's title")
    args = parser.parse_args(argv)
    try:
        gaps = [Gap(label, finals(Path(b), args.metric), finals(Path(o), args.metric))
                for label, b, o in args.pair]  # fmt: skip
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(gaps, args.metric)
    (args.out / "gap.md").write_text(text)
    plot(gaps, args.out / "gap.png", args.metric, args.title)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
