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
  lower is better when it contains ``loss`` or ``ppl``. A run without a value of it is an
  error, not a skipped run. A diverged run (``"diverged": true`` in its summary, as a run
  stopped by ``train.nan_policy=error`` leaves it, or a null, NaN or infinite value) ranks
  worst, so that its value stays in the grid.
* The best value has the best mean. Means equal to within a relative 1e-12 are a tie, which
  goes to the value ordered first: the smaller number, else the smaller text. The choice
  depends neither on the order of the runs nor on their directory names.
* A best at the smallest or largest of two or more numeric values is flagged ``edge: widen
  the grid``; a group that tried one value reads ``single value``.

``python -m experiments.report DIR... --tune optim.lr`` adds a section of these to the
report, with ``tuned.json`` and ``tune_optim_lr.png``. For scripts::

    python -m experiments.report.tune DIR... --key optim.lr [--metric NAME] [--best [--edge]]

prints a markdown table of each group's grid; with ``--best``, only the best value's
override text (``4e-3``) on stdout, and with ``--edge`` too, that text and where it sits in
the grid (``4e-3 inside``, ``1e-3 low``, ``8e-3 high``), for a sweep that widens its grid. It
exits 2 with one ``error:`` line on stderr when there is no run, a run lacks the key or the
metric, or (with ``--best``) the runs form more than one group or every value diverged.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

from experiments.report.runs import load_all
from experiments.report.tune_grid import (
    EDGE,
    SINGLE,
    GridValue,
    TunedGroup,
    key_value,
    lower_is_better,
    number,
    tune_runs,
)
from experiments.report.tune_output import (
    TUNED_FILE,
    geometric,
    grid_tables,
    plot_name,
    report_section,
    tune_plot,
    tuned_json,
    tuned_section,
)

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

_MAX_LABELS = 6  # groups named in the error of --best


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
    parser.add_argument(
        "--edge", action="store_true", help="with --best: also low, high or inside (the edge)"
    )
    args = parser.parse_args(argv)
    if args.edge and not args.best:
        parser.error("--edge is only used with --best")
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
        print(f"{group.best.text} {group.side}" if args.edge else group.best.text)
        if group.edge:
            print(f"warning: {args.key}={group.best.text}: {EDGE}", file=sys.stderr)
        return 0
    print("\n".join(grid_tables(groups)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
