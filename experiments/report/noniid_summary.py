"""The non-IID sweep's ``summary.md``: final accuracy per alpha, topology and optimizer.

``experiments/sweeps/noniid.sh`` keeps each run's small files under
``docs/results/noniid/runs/<sweep>/<topology>_<optim>_alpha<alpha>_seed<k>/`` (the sweep's own
``hydra.sweep.subdir``) and writes the summary from them::

    python -m experiments.report.noniid_summary docs/results/noniid/runs \\
        --out docs/results/noniid/summary.md

One row per (alpha, topology, optim), ``allreduce`` first within each alpha: the seeds, the final
``eval/acc`` (percent, mean and sample standard deviation over the seeds) and the gap of the mean
to the ``allreduce`` + ``sgd`` mean at the same alpha, in points.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.report.doc_data import write_page

__all__ = ["cells", "main", "markdown"]

Cell = tuple[str, str, str]  # (alpha, topology, optim)


def cells(runs: Path) -> dict[Cell, list[float]]:
    """The final ``eval/acc`` of every run under ``runs`` (``<sweep>/<subdir>/``), per cell.

    Raises:
        ValueError: A run folder's name is not ``<topology>_<optim>_alpha<alpha>_seed<k>``.
    """
    out: dict[Cell, list[float]] = {}
    for summary in sorted(runs.glob("*/*/summary.json")):
        name = summary.parent.name
        topology, _, rest = name.partition("_")
        optim, _, rest = rest.rpartition("_alpha")
        alpha = rest.split("_seed")[0]
        if not (topology and optim and alpha):
            raise ValueError(f"{summary.parent}: not <topology>_<optim>_alpha<alpha>_seed<k>")
        out.setdefault((alpha, topology, optim), []).append(
            json.loads(summary.read_text())["eval/acc"]
        )
    return out


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def markdown(runs: Path) -> str:
    """``summary.md`` from the runs under ``runs``.

    Raises:
        ValueError: As :func:`cells`.
        KeyError: An alpha without an ``allreduce`` + ``sgd`` run.
    """
    found = cells(runs)
    lines = [
        "| alpha | topology | optim | seeds | eval/acc (mean ± std) | gap to allreduce (pts) |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for alpha in sorted({k[0] for k in found}, key=float):
        base = _mean_std(found[(alpha, "allreduce", "sgd")])[0]
        mine = sorted((k for k in found if k[0] == alpha), key=lambda k: (k[1] != "allreduce", k))
        for cell in mine:
            _, topology, optim = cell
            mean, sd = _mean_std(found[cell])
            lines.append(
                f"| {alpha} | {topology} | {optim} | {len(found[cell])} | "
                f"{100 * mean:.2f} ± {100 * sd:.2f} | {100 * (mean - base):+.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``summary.md`` from the committed runs and print it."""
    parser = argparse.ArgumentParser(prog="python -m experiments.report.noniid_summary")
    parser.add_argument(
        "runs", type=Path, help="the runs: <sweep>/<topology>_<optim>_alpha<a>_seed<k>/"
    )
    parser.add_argument("--out", type=Path, required=True, help="the summary.md to write")
    args = parser.parse_args(argv)
    return write_page(args.out, markdown(args.runs))


if __name__ == "__main__":
    sys.exit(main())
