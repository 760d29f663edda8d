"""Rerun committed runs with their own overrides and check that each lands where it did.

A committed run folder holds ``summary.json`` and ``.hydra/overrides.yaml`` (as the sweeps keep
them). The rerun launches ``torchrun --standalone --nproc_per_node=<the run's world size>
train.py <its overrides>`` from the repository root and compares the final metric::

    python -m experiments.report.rerun RUN [RUN ...] [--tol 0.01] [--metric eval/loss]
        [--work DIR] [--out DIR] [--dry-run]

Each rerun goes to ``WORK/<run's path>`` (default ``multirun/rerun``); one that has finished
there already (it has a ``summary.json`` with the same overrides) is read back, not run again.
It writes ``OUT/rerun.md`` and ``OUT/rerun.json`` (default: ``WORK``), and exits 1 when any run
lands more than ``--tol`` from its committed value. CPU runs are deterministic per seed, so a
rerun normally lands on the committed value to every digit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments.report.doc_data import md_table
from experiments.report.runs import OVERRIDES_FILE, read_overrides

ROOT = Path(__file__).resolve().parents[2]
# overrides a rerun sets itself: where it writes, and no progress bar in a log
_OWN = re.compile(r"^(hydra\.|log\.progress=)")


@dataclass
class Rerun:
    """One committed run and its rerun."""

    run: str
    committed: float
    rerun: float | None = None
    seconds: float | None = None
    error: str | None = None

    def diff(self) -> float | None:
        """``|rerun - committed|``, or ``None`` when the rerun gave no value."""
        return None if self.rerun is None else abs(self.rerun - self.committed)


def _overrides(run: Path) -> list[str]:
    path = run / OVERRIDES_FILE
    with warnings.catch_warnings():  # the error below says it, in one line
        warnings.simplefilter("ignore")
        given = read_overrides(path)
    if given is None:
        raise ValueError(f"{path}: an override is not a list item ('- key=value'), or not YAML")
    return [o for o in given if not _OWN.match(o)]


def _read(run: Path, metric: str) -> tuple[float, int, list[str]]:
    """The committed value of ``metric``, the world size and the overrides of ``run``."""
    for name in ("summary.json", ".hydra/overrides.yaml"):
        if not (run / name).is_file():
            raise ValueError(f"{run}: no {name}; a committed run folder holds summary.json "
                             "and .hydra/overrides.yaml")  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    value = summary.get(metric)
    if not isinstance(value, (int, float)):
        keys = sorted(k for k, v in summary.items() if isinstance(v, (int, float)))
        raise ValueError(f"{run}: metric {metric!r} is not in summary.json; it has {keys}")
    world = summary.get("world_size")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"{run}: summary.json has no world_size (got {world!r})")
    return float(value), world, _overrides(run)


def _work_dir(run: Path, work: Path) -> Path:
    try:
        rel = run.resolve().relative_to(ROOT)
    except ValueError:
        rel = Path(*run.resolve().parts[1:])
    return work / rel


def command(world: int, overrides: Sequence[str], dest: Path) -> list[str]:
    """The rerun's command line, from the repository root."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={world}", "train.py", *overrides, "log.progress=false",
            f"hydra.run.dir={dest}"]  # fmt: skip


def _finished(dest: Path, overrides: Sequence[str]) -> bool:
    if not (dest / "summary.json").is_file() or not (dest / OVERRIDES_FILE).is_file():
        return False
    return _overrides(dest) == list(overrides)


def rerun_one(run: Path, metric: str, work: Path, dry_run: bool = False) -> Rerun:
    """Rerun ``run`` (or read back a finished rerun) and return both values."""
    committed, world, overrides = _read(run, metric)
    result = Rerun(str(run), committed)
    dest = _work_dir(run, work)
    cmd = command(world, overrides, dest)
    if dry_run:
        print(" ".join(cmd))
        return result
    if not _finished(dest, overrides):
        start = time.monotonic()
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        dest.mkdir(parents=True, exist_ok=True)
        with open(dest / "rerun.log", "w") as log:
            done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        result.seconds = round(time.monotonic() - start, 1)
        if done.returncode != 0:
            result.error = f"exit {done.returncode}; see {dest / 'rerun.log'}"
            return result
    value = json.loads((dest / "summary.json").read_text()).get(metric)
    if isinstance(value, (int, float)):
        result.rerun = float(value)
    else:
        result.error = f"the rerun's summary.json has no {metric}"
    return result


def report(results: Sequence[Rerun], metric: str, tol: float) -> str:
    """Markdown: each run's committed and rerun values, the difference and the verdict."""
    rows = []
    for r in results:
        d = r.diff()
        rerun = f"{r.rerun:.6f}" if r.rerun is not None else f"– ({r.error})"
        diff = f"{d:.2g}" if d is not None else "–"
        ok = "yes" if d is not None and d <= tol else "**no**"
        rows.append([r.run, f"{r.committed:.6f}", rerun, diff, ok])
    head = ["run", "committed", "rerun", "difference", "holds"]
    return (
        f"Reran with each run's own overrides; a run holds when |rerun − committed| ≤ {tol} "
        f"(`{metric}`).\n\n{md_table(head, 'lrrrl', rows)}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: rerun each run, write the report, exit 1 if any run does not hold."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.report.rerun",
        description="Rerun committed runs with their own overrides and compare the final metric.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="committed run folders")
    parser.add_argument("--tol", type=float, default=0.01, help="largest |rerun - committed|")
    parser.add_argument("--metric", default="eval/loss", help="summary.json key to compare")
    parser.add_argument("--work", type=Path, default=ROOT / "multirun" / "rerun",
                        help="where the reruns write (default multirun/rerun)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="where rerun.md and rerun.json go (default WORK)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    if not args.tol >= 0:
        parser.error(f"--tol {args.tol} is invalid; it must be a number >= 0")
    try:  # every run is read before any runs, so a bad folder fails at once
        for run in args.runs:
            _read(run, args.metric)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = []
    for i, run in enumerate(args.runs, 1):
        if not args.dry_run:
            print(f"[{i}/{len(args.runs)}] {run}", file=sys.stderr, flush=True)
        results.append(rerun_one(run, args.metric, args.work.resolve(), args.dry_run))
    if args.dry_run:
        return 0
    out = args.out or args.work
    out.mkdir(parents=True, exist_ok=True)
    text = report(results, args.metric, args.tol)
    (out / "rerun.md").write_text(text)
    (out / "rerun.json").write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    print(text, end="")
    diffs = [r.diff() for r in results]
    return 0 if all(d is not None and d <= args.tol for d in diffs) else 1


if __name__ == "__main__":
    sys.exit(main())
