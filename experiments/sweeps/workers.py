"""The optimizer-gap study at 4 to 64 packed workers (``docs/results/workers/``), resumable.

Every arm is tuned over the learning rate x beta1 on seed 0 (at the small budget the grid, at
the large one the cross through the arm's small-budget best), a value past any edge the best
lands on is added, and seeds 1 and 2 then run at the best; at 32 and 64 workers
``one-peer-exp`` also runs its seeds at the best learning rate of beta1 = 0.9, so that the
tuned beta1's share of the gap can be told apart. Each run is one ``train.py
experiment=workers_gap`` process; a run whose ``summary.json`` exists, or that the committed
``docs/results/workers/runs.json`` holds (``--committed``), is never run again, so the study
resumes where a stop left it, on this machine or a fresh clone::

    python -m experiments.sweeps.workers [--out multirun/workers] [--lanes 2] [--threads 1]
        [--budgets small,large] [--only ARM,...] [--dry-run]

The plan is a function of what is on disk: after every finished run the next runs are chosen
again (the grid, then an edge, then the seeds), small budget first. ``--lanes`` runs that many
processes side by side, each with ``--threads`` threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from experiments.report.workers import (
    best,
    beta1_next,
    run_key,
    run_loss,
    same_setting,
    settings,
    start_points,
)

__all__ = ["ARMS", "BUDGETS", "Arm", "Budget", "Run", "plan", "runs_of"]

LRS = (4e-3, 8e-3, 1.6e-2)
BETA1S = (0.9, 0.95, 0.974)
SEEDS = (1, 2)
BETA2 = 0.99
AVERAGE_EVERY = 8
PARAMS = 168_256  # the 2-block GPT of width 64 on a 1,024-token vocabulary
TOKENS_PER_STEP = 64 * 64  # train.global_batch_size windows of dataset.block_size tokens
CORPUS = "data/py-bpe-40m"


@dataclass(frozen=True)
class Budget:
    """A training budget: its steps and warm-up (a tenth of them)."""

    name: str
    steps: int
    warmup: int


# 168,256 parameters, 4,096 tokens a step: 5.0 and 20.0 tokens per parameter
BUDGETS = {"small": Budget("small", 206, 20), "large": Budget("large", 822, 82)}
# the large budget's search starts at the cross through the arm's small-budget best, not the
# grid: the walk past edges still moves it as far as it must, at about half the runs
START_FROM = {"large": "small"}


@dataclass(frozen=True)
class Arm:
    """One arm: a topology at a worker count, with its extra overrides."""

    name: str
    topology: str
    workers: int
    extra: tuple[str, ...] = ()
    beta1_09_seeds: bool = False  # also seeds at the best lr of beta1 = 0.9

    def overrides(self) -> list[str]:
        return [f"topology={self.topology}", f"engine.workers={self.workers}", *self.extra]


def _arms() -> list[Arm]:
    arms = [Arm("allreduce", "allreduce", 4)]
    for n in (4, 8, 16, 32, 64):
        arms.append(Arm(f"one-peer-exp-{n}", "one-peer-exp", n, beta1_09_seeds=n >= 32))
        arms.append(Arm(f"complete-{n}", "complete", n))
    for n in (32, 64):
        arms.append(
            Arm(
                f"average{AVERAGE_EVERY}-{n}",
                "one-peer-exp",
                n,
                ("outer=average", f"outer.every={AVERAGE_EVERY}"),
            )
        )
    return arms


ARMS = _arms()


@dataclass(frozen=True)
class Run:
    """One training run of an arm."""

    budget: Budget
    arm: Arm
    lr: float
    beta1: float
    seed: int

    @property
    def tag(self) -> str:
        return f"lr{self.lr:g}_b{self.beta1:g}_s{self.seed}"

    def folder(self, out: Path) -> Path:
        return out / self.budget.name / self.arm.name / self.tag

    def overrides(self, out: Path) -> list[str]:
        b = self.budget
        return [
            "experiment=workers_gap",
            *self.arm.overrides(),
            f"optim.lr={self.lr:g}",
            f"optim.betas=[{self.beta1:g},{BETA2:g}]",
            f"train.seed={self.seed}",
            f"train.max_steps={b.steps}",
            f"scheduler.warmup_steps={b.warmup}",
            f"hydra.run.dir={self.folder(out)}",
        ]


def final_loss(folder: Path) -> float | None:
    """The run's final ``eval/loss`` (``inf`` if it diverged), or ``None`` if it has not ended."""
    path = folder / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    return run_loss({"eval_loss": summary.get("eval/loss"), "diverged": summary.get("diverged")})


Known = dict[tuple[str, str, float, float, int], float]


def committed(path: Path) -> Known:
    """The final losses of the runs a committed ``runs.json`` holds, keyed by run.

    A file of another setting (another batch, budgets or arms) holds none of this study's runs.
    """
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if not same_setting(data["study"], settings()):
        print(f"{path} ran another setting: none of its runs counts as run", flush=True)
        return {}
    return {run_key(r): run_loss(r) for r in data["runs"]}


def runs_of(
    out: Path, budget: Budget, arm: Arm, known: Known | None = None
) -> dict[tuple[float, float, int], float]:
    """``{(lr, beta1, seed): final eval/loss}`` of an arm's finished runs (folders or ``known``)."""
    found: dict[tuple[float, float, int], float] = {
        (lr, b1, seed): loss
        for (b, a, lr, b1, seed), loss in (known or {}).items()
        if (b, a) == (budget.name, arm.name)
    }
    root = out / budget.name / arm.name
    for summary in sorted(root.glob("*/summary.json")):
        tag = summary.parent.name
        lr_s, b_s, s_s = tag.split("_")
        loss = final_loss(summary.parent)
        if loss is not None:
            found[(float(lr_s[2:]), float(b_s[1:]), int(s_s[1:]))] = loss
    return found


def _past_edges(
    value: float, values: Sequence[float], below: float | None, above: float | None
) -> list[float]:
    """The values past the edges ``value`` sits on (both when it is the only one tried); an
    edge with no value past it (``None``) adds none."""
    out = []
    if value == min(values) and below is not None:
        out.append(below)
    if value == max(values) and above is not None:
        out.append(above)
    return out


def _tuned(
    grid: dict[tuple[float, float], float], beta1: float | None = None
) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """The best ``(lr, beta1)`` of seed 0 (at ``beta1`` if given) and the points past its edges.

    The grid is complete first; an edge is one of the values tried along an axis at the
    other axis's best (the grid is no longer square once values are added), and adds the
    next value out along that axis. beta1 goes down to 0 at the most.
    """
    points = {k: v for k, v in grid.items() if beta1 is None or k[1] == beta1}
    lr, b1 = best(points)
    lrs = sorted({k[0] for k in points if k[1] == b1})
    b1s = sorted({k[1] for k in points if k[0] == lr})
    missing: list[tuple[float, float]] = []
    if math.isfinite(points[(lr, b1)]):
        missing += [(out, b1) for out in _past_edges(lr, lrs, lr / 2, lr * 2)]
    if beta1 is None:
        # beta1 = 0 has no value below it
        below, above = beta1_next(b1, False, BETA1S), beta1_next(b1, True, BETA1S)
        missing += [(lr, out) for out in _past_edges(b1, b1s, below, above)]
    return (lr, b1), [m for m in missing if m not in grid]


@dataclass
class ArmState:
    """Where one arm of one budget stands: its runs to go, in order, or its tuned values."""

    todo: list[tuple[float, float, int]] = field(default_factory=list)
    best: tuple[float, float] | None = None
    done: bool = False


def arm_state(out: Path, budget: Budget, arm: Arm, known: Known | None = None) -> ArmState:
    """The arm's next runs: its start on seed 0, then edges, then the seeds at the best.

    The start is the grid, or the cross through the arm's best at the budget ``START_FROM``
    names for this one (none to run until that budget's arm is done).
    """
    around = None
    before = START_FROM.get(budget.name)
    if before is not None:
        earlier = arm_state(out, BUDGETS[before], arm, known)
        if not earlier.done:
            return ArmState()
        around = earlier.best
    runs = runs_of(out, budget, arm, known)
    seed0 = {(lr, b1): v for (lr, b1, s), v in runs.items() if s == 0}
    missing = [p for p in start_points(LRS, BETA1S, around) if p not in seed0]
    if missing:
        return ArmState(todo=[(lr, b1, 0) for lr, b1 in missing])
    top, edges = _tuned(seed0)
    targets = [top]
    if arm.beta1_09_seeds and top[1] != 0.9:
        top09, edges09 = _tuned(seed0, beta1=0.9)
        edges += [e for e in edges09 if e not in edges]
        targets.append(top09)
    if edges:
        return ArmState(todo=[(lr, b1, 0) for lr, b1 in edges])
    todo = [(lr, b1, s) for lr, b1 in targets for s in SEEDS if (lr, b1, s) not in runs]
    return ArmState(todo=todo, best=top, done=not todo)


def plan(
    out: Path,
    budgets: Sequence[Budget],
    arms: Sequence[Arm],
    busy: set[Path],
    known: Known | None = None,
) -> Iterator[Run]:
    """The runs that can start now, in order: each budget's arms, grid before seeds."""
    for budget in budgets:
        for arm in arms:
            for lr, b1, seed in arm_state(out, budget, arm, known).todo:
                run = Run(budget, arm, lr, b1, seed)
                if run.folder(out) not in busy:
                    yield run


def _launch(run: Run, out: Path, threads: int) -> subprocess.Popen[bytes]:
    folder = run.folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "train.py", *run.overrides(out)]
    (folder / "command.txt").write_text(" ".join(cmd[1:]) + "\n")
    log = (folder / "train.out").open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("multirun/workers"))
    p.add_argument("--lanes", type=int, default=2, help="runs side by side")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    p.add_argument("--budgets", default="small,large", help=f"of {','.join(BUDGETS)}")
    p.add_argument("--only", default="", help="these arms only (comma-separated names)")
    p.add_argument("--dry-run", action="store_true", help="print the runs that can start now")
    p.add_argument(
        "--committed",
        type=Path,
        default=Path("docs/results/workers/runs.json"),
        help="runs this file holds count as run (a study resumed on another machine)",
    )
    args = p.parse_args(argv)
    try:
        budgets = [BUDGETS[b] for b in args.budgets.split(",")]
    except KeyError as exc:
        p.error(f"--budgets: {exc.args[0]!r} is no budget; use {', '.join(BUDGETS)}")
    names = {a.name for a in ARMS}
    wanted = [n for n in args.only.split(",") if n]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        p.error(f"--only: {', '.join(unknown)} is no arm; the arms are {', '.join(sorted(names))}")
    if args.lanes < 1 or args.threads < 1:
        p.error(f"--lanes {args.lanes} and --threads {args.threads} must be at least 1")
    arms = [a for a in ARMS if not wanted or a.name in wanted]
    known = committed(args.committed)
    if args.dry_run:
        for run in plan(args.out, budgets, arms, set(), known):
            print(run.budget.name, run.arm.name, run.tag)
        return 0
    running: dict[Path, tuple[Run, subprocess.Popen[bytes], float]] = {}
    finished = 0
    while True:
        for run in plan(args.out, budgets, arms, set(running), known):
            if len(running) >= args.lanes:
                break
            running[run.folder(args.out)] = (run, _launch(run, args.out, args.threads), time.time())
        if not running:
            break
        time.sleep(1.0)
        for folder, (run, proc, start) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[folder]
            loss = final_loss(folder)
            if proc.returncode != 0 or loss is None:
                for other in running.values():
                    other[1].wait()
                print(f"{folder}: failed (exit {proc.returncode}); see {folder}/train.out")
                return 1
            finished += 1
            print(
                f"[{time.strftime('%H:%M:%S')}] {finished:4d} {run.budget.name} {run.arm.name} "
                f"{run.tag}: eval/loss {loss:.4f} ({time.time() - start:.0f} s)",
                flush=True,
            )
    print(f"the study is complete under {args.out} ({finished} runs this time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
