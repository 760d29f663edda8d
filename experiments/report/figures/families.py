"""Families of figures: the entries a page's row or sentence repeats, built by one call.

A study's arm is usually a folder of seed runs, shown as its seeds, their mean and their sd; an
lr grid is one run per value; a gap is paired seed by seed. Each function here returns those
entries under one prefix that names the arm (``gap.complete`` gives ``gap.complete.seed0`` ...
``gap.complete.mean``, ``gap.complete.sd``); :func:`slot_cells` and :func:`slots` write a table's
cells of them, and :func:`table` the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from experiments.report.doc_data import Source, md_table
from experiments.report.figures.sources import (
    Figure,
    Fn,
    at,
    gap_mean,
    gap_sd,
    mean,
    paired,
    sd,
    seed,
)

L3 = "{:.3f}"


ALL = "seed0 seed1 seed2 mean sd"


def stats(
    prefix: str, runs: str, fmt: str = L3, key: str = "eval/loss", names: str = ALL
) -> dict[str, Figure]:
    """``prefix.seed0`` ... ``prefix.seed2``, ``prefix.mean`` and ``prefix.sd`` of ``key`` over the
    seed runs of ``runs`` (only the space-separated ``names`` the pages show)."""
    fns = {f"seed{i}": seed(runs, i, key) for i in range(3)}
    fns.update(mean=mean(runs, key), sd=sd(runs, key))
    return {f"{prefix}.{n}": Figure(fns[n], fmt) for n in names.split()}


def gaps(
    prefix: str, base: str, other: str, minus: bool = False, names: str = ALL
) -> dict[str, Figure]:
    """``other - base`` paired seed by seed: ``prefix.seed0`` ... ``.seed2``, ``.mean``, ``.sd``
    (signed, 3 decimals; ``minus``: a negative one written with U+2212; only ``names``)."""
    out = {f"seed{i}": Figure(paired(base, other, i), "{:+.3f}", minus) for i in range(3)}
    out.update(
        mean=Figure(gap_mean(base, other), "{:+.3f}", minus), sd=Figure(gap_sd(base, other), L3)
    )
    return {f"{prefix}.{n}": out[n] for n in names.split()}


def grid(
    prefix: str, rel_dir: str, labels: str, key: str = "optim.lr", fmt: str = L3
) -> dict[str, Figure]:
    """One run per value of ``key`` in ``rel_dir``'s folders (an lr grid): ``prefix`` + each of the
    space-separated ``labels`` (``gap.w8.allreduce.lr`` and ``"5e-4 1e-3"`` give
    ``gap.w8.allreduce.lr5e-4`` ...), each label read as the override's value."""
    return {
        f"{prefix}{label}": Figure(at(rel_dir, float(label), key), fmt) for label in labels.split()
    }


def each(prefix: str, fmt: str, **fns: Fn) -> dict[str, Figure]:
    """``prefix.NAME`` for each keyword (``-`` for ``_`` in the name), all in one format."""
    return {f"{prefix}.{name.replace('_', '-')}": Figure(fn, fmt) for name, fn in fns.items()}


def extremes(
    prefix: str, fmt: str, values: Callable[[Source], Iterable[float]]
) -> dict[str, Figure]:
    """``prefix.min`` and ``prefix.max`` of the ``values`` a function of the data gives."""
    return each(prefix, fmt, min=lambda s: min(values(s)), max=lambda s: max(values(s)))


def picked(prefix: str, fmt: str, make: Callable[[Callable], Fn]) -> dict[str, Figure]:
    """``prefix.min`` and ``prefix.max``: ``make(min)`` and ``make(max)``, a figure that picks
    one of several values with the function it is given."""
    return each(prefix, fmt, min=make(min), max=make(max))


def slot_cells(prefix: str, names: str = "seed0 seed1 seed2") -> list[str]:
    """Table cells of ``prefix``'s figures: ``{{prefix.NAME}}`` for each space-separated name."""
    return ["{{" + f"{prefix}.{name}" + "}}" for name in names.split()]


def slots(prefix: str, names: str = "seed0 seed1 seed2", sep: str = ", ") -> str:
    """``prefix``'s figures ``names`` in one cell, joined by ``sep``."""
    return sep.join(slot_cells(prefix, names))


def mean_sd(prefix: str, bold: bool = False) -> str:
    """The cell ``{{prefix.mean}} ± {{prefix.sd}}`` (``bold``: between ``**``)."""
    cell = "{{" + prefix + ".mean}} ± {{" + prefix + ".sd}}"
    return f"**{cell}**" if bold else cell


def table(header: str, align: str, rows: list[list[str]]) -> str:
    """A table of figures: ``header`` and ``align`` its cells separated by ``|``, each row a list
    of cells (``{{ID}}`` slots among them), through :func:`~experiments.report.doc_data.md_table`."""
    return md_table(header.split(" | "), align.split("|"), rows)
