"""Time to a loss on an emulated slow link: each arm's loss curve on its measured step time.

An emulated network (``network=custom``) only holds collectives back; the numbers computed are
the same. So a short run of an arm on the slow link measures its step time there, and the arm's
full runs without emulation give its loss at every step: their product is the loss curve the arm
would have on that link, without running every seed at the link's pace.

Layout of ``RUNS`` (what ``experiments/sweeps/streaming.sh`` writes)::

    RUNS/NAME/final/seed*/     the arm's full runs (summary.json, metrics.jsonl)
    RUNS/link/NAME/            the arm's short run on the emulated link

The step time is the median ``perf/step_s`` of the link run's training lines after the first
(which holds the start-up). The evaluations are not counted: they cost the same for every arm.
Time to a target is the first evaluation whose mean ``eval/loss`` over the seeds is at or below
the target, times the step time. The default target is the highest final mean loss of the arms,
so every arm reaches it.

Usage::

    python -m experiments.report.link_time RUNS --out DIR [--target LOSS] [--gbps G --latency-ms L]

It writes ``DIR/link_time.md`` (the table), ``link_time.json`` and ``link_time.png`` (the mean
loss against the emulated time, one line per arm).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from experiments.report.doc_data import md_table
from experiments.report.plots import _pyplot
from experiments.report.runs import UNKNOWN_HOST, Run, load_all, load_run, num
from experiments.report.tables import HOSTS_DIFFER
from experiments.report.trend import evals

__all__ = ["Arm", "default_target", "link_name", "load_arms", "main", "page", "table", "time_to"]

REFERENCE = "allreduce"


@dataclass
class Arm:
    """One arm: its loss curve (mean over seeds) and what its link run measured.

    Args:
        name: The arm's directory name.
        seeds: How many full runs the curve averages.
        curve: ``(step, mean eval/loss)`` at every evaluation all seeds logged.
        finals: Each seed's final ``eval/loss``.
        step_s: Median seconds per training step on the emulated link.
        tokens_per_s: Median training tokens per second on the emulated link.
        bytes_mean: Bytes each rank sends per step, on average (``comm/bytes_per_step``).
        bytes_peak: The most bytes a rank sends in one step (``comm/peak_bytes_per_step``).
        host: The kind of machine the link run ran on (:attr:`Run.host`).
    """

    name: str
    seeds: int
    curve: list[tuple[int, float]]
    finals: list[float]
    step_s: float
    tokens_per_s: float | None
    bytes_mean: float | None
    bytes_peak: float | None
    host: str = UNKNOWN_HOST

    @property
    def final(self) -> float:
        """Mean final ``eval/loss`` over the seeds."""
        return statistics.fmean(self.finals)

    @property
    def final_std(self) -> float | None:
        """Sample standard deviation of the final loss, ``None`` for one seed."""
        return statistics.stdev(self.finals) if len(self.finals) > 1 else None


def _median(run: Run, key: str) -> float | None:
    values = [float(row[key]) for row in run.metrics if num(row.get(key))]
    if len(values) > 1:
        values = values[1:]  # the first window holds the start-up
    return statistics.median(values) if values else None


def _mean_curve(curves: Sequence[dict[int, float]]) -> list[tuple[int, float]]:
    """The mean over the runs' ``{step: eval/loss}`` at the steps they all evaluated."""
    common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    return [(s, statistics.fmean(c[s] for c in curves)) for s in common]


def _bytes(summary: dict[str, Any], key: str) -> float | None:
    value = summary.get(key)
    return float(value) if value is not None and num(value) else None


def load_arms(root: str | Path) -> list[Arm]:
    """Every arm under ``root`` with both a link run and full runs, in name order.

    Raises:
        ValueError: One line, when ``root`` has no ``link/`` directory, a link run's step time
            is missing, or no arm has both kinds of runs.
    """
    root = Path(root)
    link_root = root / "link"
    if not link_root.is_dir():
        raise ValueError(f"{str(link_root)!r} is not a directory; run PART=link of the sweep first")
    arms = []
    for link_dir in sorted(p for p in link_root.iterdir() if p.is_dir()):
        name = link_dir.name
        final = root / name / "final"
        link = load_run(link_dir)
        runs, _ = load_all([final]) if final.is_dir() else ([], [])
        curves = [c for c in (dict(evals(r)) for r in runs) if c]
        if link is None or not curves:
            continue
        step_s = _median(link, "perf/step_s")
        if step_s is None:
            raise ValueError(f"{str(link_dir)!r} logged no perf/step_s; it cannot time the link")
        arms.append(
            Arm(
                name=name,
                seeds=len(curves),
                curve=_mean_curve(curves),
                finals=[c[max(c)] for c in curves],
                step_s=step_s,
                tokens_per_s=_median(link, "perf/tokens_per_s"),
                bytes_mean=_bytes(link.summary, "comm/bytes_per_step"),
                bytes_peak=_bytes(link.summary, "comm/peak_bytes_per_step")
                or _bytes(link.summary, "comm/bytes_per_step"),
                host=link.host,
            )
        )
    if not arms:
        raise ValueError(f"no arm under {str(root)!r} has both link/NAME and NAME/final runs")
    return arms


def default_target(arms: Sequence[Arm]) -> float:
    """The highest final mean loss of the arms: every arm reaches it."""
    return max(a.final for a in arms)


def time_to(arm: Arm, target: float) -> tuple[int, float] | None:
    """``(step, seconds on the link)`` of the first evaluation at or below ``target``, or ``None``."""
    for step, loss in arm.curve:
        if loss <= target:
            return step, step * arm.step_s
    return None


def _mb(value: float | None) -> str:
    return "–" if value is None else f"{value / 1e6:.3g}"


def table(arms: Sequence[Arm], target: float) -> list[str]:
    """Markdown lines: each arm's loss, bytes, link throughput and time to ``target``.

    The ratios are to the arm named ``allreduce...`` when there is one (its first in name
    order), else to the first arm. The speed-up of an arm whose link run ran on another kind of
    machine than the reference's reads ``n/a (hosts differ)``, with a line under the table.
    """
    ref = next((a for a in arms if a.name.startswith(REFERENCE)), arms[0])
    ref_time = time_to(ref, target)
    head = ["arm", "seeds", "final eval/loss", "mean MB/step", "peak MB/step", f"peak vs {ref.name}",
            "link tokens/s", "link s/step", f"step at loss ≤ {target:.3f}", "time on link (s)",
            f"speed-up vs {ref.name}"]  # fmt: skip
    rows = []
    for arm in arms:
        std = f" ± {arm.final_std:.3f}" if arm.final_std is not None else ""
        reached = time_to(arm, target)
        peak_ratio = (
            f"{arm.bytes_peak / ref.bytes_peak:.3f}" if arm.bytes_peak and ref.bytes_peak else "–"
        )
        tps = "–" if arm.tokens_per_s is None else f"{arm.tokens_per_s:,.0f}"
        if reached is None:
            step, secs, speed = "not reached", "–", "–"
        else:
            step, secs = str(reached[0]), f"{reached[1]:,.0f}"
            speed = f"{ref_time[1] / reached[1]:.2f}×" if ref_time else "–"
            speed = speed if arm.host == ref.host else HOSTS_DIFFER
        rows.append([arm.name, str(arm.seeds), f"{arm.final:.3f}{std}", _mb(arm.bytes_mean),
                     _mb(arm.bytes_peak), peak_ratio, tps, f"{arm.step_s:.3f}", step, secs,
                     speed])  # fmt: skip
    lines = md_table(head, "l" + "r" * 10, rows).split("\n")
    hosts = sorted({a.host for a in arms})
    if len(hosts) > 1:
        lines += [
            "",
            f"The link runs come from {len(hosts)} hosts ({'; '.join(hosts)}): a speed-up "
            f"between arms of different hosts reads {HOSTS_DIFFER}.",
        ]
    return lines


def link_name(gbps: float | None, latency_ms: float | None) -> str:
    """The link for titles: ``50 Mb/s, 10 ms``, or ``the emulated link`` without both."""
    if gbps is None or latency_ms is None:
        return "the emulated link"
    return f"{gbps * 1000:g} Mb/s, {latency_ms:g} ms"


def page(arms: Sequence[Arm], target: float, link: str) -> str:
    """The text of ``link_time.md``: a title naming the target and the link, then the table."""
    return "\n".join([f"# Time to eval/loss {target:.3f} on {link}", "", *table(arms, target), ""])


def _plot(arms: Sequence[Arm], target: float, title: str, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for arm in arms:
        xs = [s * arm.step_s for s, _ in arm.curve]
        ax.plot(
            xs, [v for _, v in arm.curve], marker=".", label=f"{arm.name} ({arm.step_s:.2f} s/step)"
        )
    ax.axhline(target, color="0.5", linewidth=0.8, linestyle=":", label=f"target {target:.3f}")
    ax.set_xlabel("time on the emulated link (s, training steps only)")
    ax.set_ylabel("eval/loss (mean over seeds)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the link-time table, its JSON and its plot; exit 2 with one line on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.report.link_time", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("runs", help="the directory with NAME/final/ and link/NAME/ runs")
    parser.add_argument("--out", required=True, help="where to write link_time.{md,json,png}")
    parser.add_argument("--target", type=float, default=None, help="the loss to reach")
    parser.add_argument(
        "--gbps", type=float, default=None, help="the emulated bandwidth, for the title"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=None, help="the emulated latency, for the title"
    )
    args = parser.parse_args(argv)
    try:
        arms = load_arms(args.runs)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    target = args.target if args.target is not None else default_target(arms)
    if not math.isfinite(target):
        print(f"error: --target {target} is not a finite loss", file=sys.stderr)
        return 2
    link = link_name(args.gbps, args.latency_ms)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = page(arms, target, link)
    (out / "link_time.md").write_text(text)
    record = {
        "target": target,
        "link": link,
        "arms": [{**asdict(a), "time_to_target": time_to(a, target)} for a in arms],
    }
    (out / "link_time.json").write_text(json.dumps(record, indent=1) + "\n")
    _plot(arms, target, f"lm_small on {link}", out / "link_time.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
