"""The optimizer gap at 4 to 64 packed workers: the study's runs, what they say, and its figure.

``python -m experiments.sweeps.workers`` leaves one folder per run under ``multirun/workers``;
this module gathers them into one committed file and reads it back::

    python -m experiments.report.workers [--runs multirun/workers] [--out docs/results/workers]

It writes ``OUT/runs.json`` (every finished run's final numbers and evaluation curve, and the
study's settings) and ``OUT/gap.png`` (the gap against the number of workers). The page's
tables and sentences come from ``runs.json`` through :class:`Study` (the views of
:mod:`experiments.report.doc_views_workers`), so ``make check-docs`` ties them to it.

The mathematics of the reading:
- an arm's tuned point is the ``(lr, beta1)`` of the lowest final ``eval/loss`` on seed 0
  (ties: the smaller lr, then the smaller beta1), :func:`best`;
- its gap is ``loss(arm, seed) - loss(allreduce, seed)`` on each seed both ran, each arm at
  its own tuned point;
- the fit of the gap against the workers is least squares of ``gap = a + b log2(N)`` over
  every seed's gap, ``b`` being the growth per doubling, with the residuals' sample standard
  deviation as its scatter.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BASE",
    "Fit",
    "Study",
    "best",
    "beta1_next",
    "collect",
    "fit",
    "main",
    "run_key",
    "same_setting",
    "settings",
    "start_points",
]

BASE = "allreduce"
Point = tuple[float, float]  # (lr, beta1)


def best(grid: dict[Point, float]) -> Point:
    """The ``(lr, beta1)`` of the lowest loss (ties: the smaller lr, then the smaller beta1)."""
    return min(grid, key=lambda k: (grid[k], k[0], k[1]))


def beta1_next(beta1: float, up: bool, beta1s: Sequence[float]) -> float | None:
    """The next beta1 out from ``beta1`` on the ladder through ``beta1s``; ``None`` below 0.

    Past the grid's values the ladder doubles ``1 - beta1`` going down (to 0 at the most) and
    halves it going up, on 3 digits: 0, 0.2, 0.6, 0.8, then the grid, then 0.987, 0.994, ...
    """
    ladder = set(beta1s)
    low = min(beta1s)
    while low > 0.0:
        low = max(round(1 - (1 - low) * 2, 3), 0.0)
        ladder.add(low)
    high = max(beta1s)
    while high <= beta1:
        high = round(1 - (1 - high) / 2, 3)
        ladder.add(high)
    side = [v for v in ladder if (v > beta1 if up else v < beta1)]
    if not side:
        return None
    return min(side) if up else max(side)


def start_points(
    lrs: Sequence[float], beta1s: Sequence[float], around: Point | None
) -> list[Point]:
    """The seed-0 points an arm's search starts from.

    The whole ``lrs`` x ``beta1s`` grid, or, ``around`` a point (the arm's best at the budget
    before), the cross through it: lr halved and doubled at its beta1, and beta1's next values
    down and up at its lr.
    """
    if around is None:
        return [(lr, b1) for lr in lrs for b1 in beta1s]
    lr, b1 = around
    cross = [(lr / 2, b1), (lr, b1), (lr * 2, b1)]
    for up in (False, True):
        other = beta1_next(b1, up, beta1s)
        if other is not None:
            cross.append((lr, other))
    return cross


@dataclass(frozen=True)
class Fit:
    """``gap = a + b log2(N)`` by least squares: ``b`` per doubling, ``sd`` of the residuals."""

    a: float
    b: float
    sd: float
    n: int

    def at(self, workers: float) -> float:
        """The fitted gap at ``workers`` workers."""
        return self.a + self.b * math.log2(workers)


def fit(points: Sequence[tuple[int, float]]) -> Fit:
    """Least squares of ``gap = a + b log2(N)`` over ``(N, gap)`` points (two N at least).

    Raises:
        ValueError: fewer than two distinct worker counts.
    """
    if len({n for n, _ in points}) < 2:
        raise ValueError("a fit needs gaps at two worker counts at least")
    xs = [math.log2(n) for n, _ in points]
    ys = [g for _, g in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    residuals = [y - (a + b * x) for x, y in zip(xs, ys)]
    sd = math.sqrt(sum(r * r for r in residuals) / (len(points) - 2)) if len(points) > 2 else 0.0
    return Fit(a, b, sd, len(points))


class Study:
    """The committed runs of the study (``runs.json``), and what they say."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.settings: dict[str, Any] = data["study"]
        self.runs: list[dict[str, Any]] = data["runs"]

    def budgets(self) -> list[str]:
        """The budgets in the study's order."""
        return list(self.settings["budgets"])

    def arms(self) -> list[dict[str, Any]]:
        """The arms (``name``, ``topology``, ``workers``, ``extra``) in the study's order."""
        return list(self.settings["arms"])

    def arm(self, name: str) -> dict[str, Any]:
        """One arm by name."""
        for arm in self.arms():
            if arm["name"] == name:
                return arm
        raise KeyError(name)

    def tokens_per_param(self, budget: str) -> float:
        """A budget's training tokens per model parameter."""
        s = self.settings
        return s["budgets"][budget]["steps"] * s["tokens_per_step"] / s["params"]

    def _runs(self, budget: str, arm: str) -> list[dict[str, Any]]:
        return [r for r in self.runs if r["budget"] == budget and r["arm"] == arm]

    def seed0(self, budget: str, arm: str) -> dict[Point, float]:
        """``{(lr, beta1): final eval/loss}`` of seed 0 (diverged: ``inf``)."""
        return {
            (r["lr"], r["beta1"]): run_loss(r) for r in self._runs(budget, arm) if r["seed"] == 0
        }

    def tuned(self, budget: str, arm: str, beta1: float | None = None) -> Point | None:
        """The arm's best point on seed 0 (at ``beta1`` when given), ``None`` before its start.

        The start is the grid, or the cross through the arm's best at the budget the study
        names in ``start_from`` (:func:`start_points`).
        """
        around = None
        before = self.settings.get("start_from", {}).get(budget)
        if before is not None:
            around = self.tuned(before, arm)
            if around is None:
                return None
        need = start_points(self.settings["lrs"], self.settings["beta1s"], around)
        grid = self.seed0(budget, arm)
        if beta1 is not None:
            grid = {k: v for k, v in grid.items() if k[1] == beta1}
            need = [p for p in need if p[1] == beta1]
        if not grid or any(p not in grid for p in need):
            return None
        return best(grid)

    def on_edge(self, budget: str, arm: str) -> list[str]:
        """The axes on whose edge the best point lies (after any value added past an edge)."""
        grid = self.seed0(budget, arm)
        top = self.tuned(budget, arm)
        if top is None:
            return []
        out = []
        lrs = sorted({k[0] for k in grid if k[1] == top[1]})
        if top[0] in (lrs[0], lrs[-1]):
            out.append("lr")
        b1s = sorted({k[1] for k in grid if k[0] == top[0]})
        if top[1] in (b1s[0], b1s[-1]):
            out.append("beta1")
        return out

    def finals(self, budget: str, arm: str, point: Point | None) -> dict[int, float]:
        """``{seed: final eval/loss}`` at ``point``."""
        if point is None:
            return {}
        return {
            r["seed"]: run_loss(r)
            for r in self._runs(budget, arm)
            if (r["lr"], r["beta1"]) == point
        }

    def done(self, budget: str, arm: str, seeds: int = 3) -> bool:
        """Whether the arm has ``seeds`` seeds at its tuned point."""
        return len(self.finals(budget, arm, self.tuned(budget, arm))) >= seeds

    def gaps(self, budget: str, arm: str, beta1: float | None = None) -> dict[int, float]:
        """``{seed: loss(arm) - loss(allreduce)}``, each at its tuned point, on common seeds."""
        base = self.finals(budget, BASE, self.tuned(budget, BASE))
        other = self.finals(budget, arm, self.tuned(budget, arm, beta1))
        return {s: other[s] - base[s] for s in sorted(set(base) & set(other))}

    def fit(self, budget: str, topology: str, seeds: int = 3) -> Fit | None:
        """The fit of ``topology``'s gap against its workers, over the arms with every seed."""
        points = []
        for arm in self.arms():
            if arm["topology"] == topology and not arm.get("extra"):
                gaps = self.gaps(budget, arm["name"])
                if len(gaps) >= seeds:
                    points += [(arm["workers"], g) for g in gaps.values()]
        try:
            return fit(points)
        except ValueError:
            return None

    def curve(self, budget: str, arm: str, seed: int) -> list[list[float]]:
        """The evaluation curve ``[[step, eval/loss], ...]`` of the arm's tuned run of a seed."""
        point = self.tuned(budget, arm)
        for r in self._runs(budget, arm):
            if (r["lr"], r["beta1"]) == point and r["seed"] == seed:
                return list(r["curve"])
        return []


def run_loss(run: dict[str, Any]) -> float:
    """A run's final ``eval/loss`` from its ``runs.json`` entry (``inf`` if it diverged)."""
    value = run.get("eval_loss")
    if run.get("diverged") or not isinstance(value, (int, float)) or not math.isfinite(value):
        return math.inf
    return float(value)


def _run_entry(folder: Path, budget: str, arm: str) -> dict[str, Any] | None:
    """One finished run's numbers, from its folder (``None`` if it has not ended)."""
    path = folder / "summary.json"
    if not path.exists():
        return None
    s = json.loads(path.read_text())
    lr_s, b_s, seed_s = folder.name.split("_")
    curve = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "eval/loss" in row:
            curve.append([row["step"], round(float(row["eval/loss"]), 6)])
    return {
        "budget": budget,
        "arm": arm,
        "lr": float(lr_s[2:]),
        "beta1": float(b_s[1:]),
        "seed": int(seed_s[1:]),
        "eval_loss": s.get("eval/loss"),
        "eval_loss_local": s.get("eval/loss_local"),
        "train_loss": s.get("train/loss"),
        "consensus_distance": s.get("consensus/distance"),
        "tokens": s.get("tokens"),
        "tokens_per_s": s.get("perf/tokens_per_s"),
        "wall_s": s.get("wall_time_s"),
        "diverged": bool(s.get("diverged")),
        "curve": curve,
    }


def settings() -> dict[str, Any]:
    """The study's settings as the driver has them (``runs.json``'s ``study``)."""
    from experiments.sweeps import workers as sweep

    meta_path = Path(sweep.CORPUS) / "meta.json"
    corpus = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return {
        "params": sweep.PARAMS,
        "tokens_per_step": sweep.TOKENS_PER_STEP,
        "budgets": {b.name: {"steps": b.steps, "warmup": b.warmup} for b in sweep.BUDGETS.values()},
        "lrs": list(sweep.LRS),
        "beta1s": list(sweep.BETA1S),
        "beta2": sweep.BETA2,
        "start_from": dict(sweep.START_FROM),
        "seeds": [0, *sweep.SEEDS],
        "arms": [
            {"name": a.name, "topology": a.topology, "workers": a.workers, "extra": list(a.extra)}
            for a in sweep.ARMS
        ],
        "corpus": {
            k: corpus.get(k) for k in ("source", "train_tokens", "val_tokens", "vocab_size")
        },
    }


_SAME = ("params", "tokens_per_step", "budgets", "beta2", "arms")


def same_setting(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two ``study`` blocks ran the same training (the grids may differ)."""
    return all(a.get(k) == b.get(k) for k in _SAME)


def run_key(run: dict[str, Any]) -> tuple[str, str, float, float, int]:
    """A run's identity: budget, arm, lr, beta1, seed."""
    return (run["budget"], run["arm"], run["lr"], run["beta1"], run["seed"])


def collect(runs_dir: Path, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every finished run under ``runs_dir`` and the study's settings, as ``runs.json`` holds.

    Args:
        runs_dir: The driver's output folder.
        previous: A committed ``runs.json``: its runs are kept (a run folder of the same
            identity replaces one) when it ran the same setting, so that a study resumed on
            another machine loses nothing.

    Raises:
        ValueError: ``previous`` ran another setting.
    """
    from experiments.sweeps import workers as sweep

    study = settings()
    runs: dict[tuple[str, str, float, float, int], dict[str, Any]] = {}
    if previous is not None:
        if not same_setting(previous["study"], study):
            raise ValueError(
                "the committed runs.json ran another setting (params, tokens per step, "
                "budgets, beta2 or arms differ); pass --fresh to start it over"
            )
        runs = {run_key(r): r for r in previous["runs"]}
    for budget in sweep.BUDGETS:
        for arm in sweep.ARMS:
            for folder in sorted((runs_dir / budget / arm.name).glob("lr*_b*_s*")):
                entry = _run_entry(folder, budget, arm.name)
                if entry is not None:
                    runs[run_key(entry)] = entry
    budgets, arms = list(sweep.BUDGETS), [a.name for a in sweep.ARMS]
    ordered = sorted(
        runs.values(),
        key=lambda r: (
            budgets.index(r["budget"]),
            arms.index(r["arm"]),
            r["lr"],
            r["beta1"],
            r["seed"],
        ),
    )
    return {"study": study, "runs": ordered}


def plot(study: Study, path: Path) -> None:
    """The gap against the workers: a panel per budget, each seed a dot, the fit a line."""
    from experiments.report.plots import _pyplot

    plt = _pyplot()
    budgets = study.budgets()
    fig, axes = plt.subplots(1, len(budgets), figsize=(5.2 * len(budgets), 3.8), sharey=True)
    colours = {"one-peer-exp": "C0", "complete": "C1", "average": "C2"}
    for ax, budget in zip(axes, budgets):
        for arm in study.arms():
            if arm["name"] == BASE:
                continue
            kind = "average" if arm.get("extra") else arm["topology"]
            gaps = study.gaps(budget, arm["name"])
            n = arm["workers"] * (1.06 if kind == "complete" else 0.94 if kind == "average" else 1)
            # an arm still being tuned (its point may move, seeds missing): hollow
            done = study.done(budget, arm["name"])
            ax.scatter(
                [n] * len(gaps),
                list(gaps.values()),
                s=12,
                facecolors=colours[kind] if done else "none",
                edgecolors=colours[kind],
                alpha=0.7,
            )
        for topology in ("one-peer-exp", "complete"):
            f = study.fit(budget, topology)
            if f is not None:
                xs = [4, 64]
                label = f"{topology}: {f.b:+.3f} per doubling (sd {f.sd:.3f})"
                ax.plot(xs, [f.at(x) for x in xs], color=colours[topology], label=label)
        ax.scatter([], [], color=colours["average"], s=12, label="one-peer-exp + average every 8")
        ax.axhline(0, color="0.5", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlim(3.2, 80)
        ax.set_xticks([4, 8, 16, 32, 64], ["4", "8", "16", "32", "64"])
        ax.set_xlabel("workers")
        ax.set_title(f"{budget}: {study.tokens_per_param(budget):.0f} tokens per parameter")
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("eval/loss gap to allreduce (nats)")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, default=Path("multirun/workers"))
    p.add_argument("--out", type=Path, default=Path("docs/results/workers"))
    p.add_argument("--fresh", action="store_true", help="keep none of OUT/runs.json's runs")
    args = p.parse_args(argv)
    if not args.runs.is_dir():
        print(f"--runs {args.runs}: no such folder; run python -m experiments.sweeps.workers")
        return 2
    committed = args.out / "runs.json"
    previous = None if args.fresh or not committed.exists() else json.loads(committed.read_text())
    try:
        data = collect(args.runs, previous)
    except ValueError as exc:
        print(f"{committed}: {exc}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs.json").write_text(json.dumps(data, indent=1) + "\n")
    study = Study(data)
    plot(study, args.out / "gap.png")
    done = sum(study.done(b, a["name"]) for b in study.budgets() for a in study.arms())
    total = len(study.budgets()) * len(study.arms())
    print(
        f"{len(data['runs'])} runs, {done} of {total} arms complete: {args.out}/runs.json, gap.png"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
