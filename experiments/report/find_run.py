"""The finished runs under a folder whose overrides set a key to a value, for the sweep scripts.

Hydra writes a swept value as Python prints it (``optim.lr=2e-3`` becomes ``optim.lr=0.002`` in
``.hydra/overrides.yaml``), so values are compared as numbers when both are numbers::

    python -m experiments.report.find_run DIR KEY=VALUE [--self]

It prints the first run folder directly under ``DIR`` (or ``DIR`` itself with ``--self``) that
has a ``summary.json`` (the run ended) and sets ``KEY`` to ``VALUE``, and exits 1 when none does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.report.runs import OVERRIDES_FILE, SUMMARY_FILE, read_overrides
from experiments.report.tune_grid import _override


def same(a: str, b: str) -> bool:
    """Whether two override values are equal: as ints, else as floats, else as strings."""
    for kind in (int, float):
        try:
            return kind(a) == kind(b)
        except ValueError:
            continue
    return a == b


def sets(run: Path, key: str, value: str) -> bool:
    """Whether ``run`` ended (has a summary) and its overrides set ``key`` to ``value``."""
    if not (run / SUMMARY_FILE).is_file():
        return False
    for override in read_overrides(run / OVERRIDES_FILE) or ():
        parsed = _override(override)
        if parsed is not None and parsed[0] == key:
            return same(parsed[1], value)
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the first matching run folder, exit 1 when there is none."""
    parser = argparse.ArgumentParser(prog="python -m experiments.report.find_run")
    parser.add_argument("dir", type=Path, help="a sweep folder (or a run with --self)")
    parser.add_argument("override", help="KEY=VALUE")
    parser.add_argument("--self", action="store_true", help="check DIR itself, not its runs")
    args = parser.parse_args(argv)
    key, eq, value = args.override.partition("=")
    if not eq or not key:
        parser.error(f"{args.override!r} is not KEY=VALUE")
    runs = [args.dir] if args.self else sorted(p for p in args.dir.glob("*") if p.is_dir())
    for run in runs:
        if sets(run, key, value):
            print(run)
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
