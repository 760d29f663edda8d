"""Figures in the docs' prose, each tied to the committed file it comes from.

A :class:`Claim` names a page and a pattern; each of the pattern's groups captures one figure as
written, and the claim's :class:`Value` of the same position says where it comes from (a function
of a :class:`~experiments.report.doc_data.Source`) and how it is rounded (a format string). The
check (``make check-docs``) compares the two, and fails where the pattern is no longer on its
page. Tables generated from data are not claims: they are views (``doc_views``).

To add a figure: write the sentence, then a claim whose pattern matches it with the number as a
group, e.g. ``r"ends at (\\d\\.\\d{3}) nats"`` with ``Value(mean(DIR), "{:.3f}")``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from experiments.report.doc_data import Source

Fn = Callable[[Source], float]


@dataclass(frozen=True)
class Value:
    """Where a figure comes from (``fn``) and how it is written (``fmt``)."""

    fn: Fn
    fmt: str


@dataclass(frozen=True)
class Claim:
    """A pattern on ``page`` whose groups are the figures of ``values``, in order."""

    page: str
    pattern: str
    values: tuple[Value, ...]


def claim(page: str, pattern: str, *values: Value) -> Claim:
    """A :class:`Claim` (the values as arguments)."""
    return Claim(page, pattern, values)


# Sources, as small functions of a Source.
WIRE = "docs/results/network/table.json"
HIER = "docs/results/hierarchical/table.json"
LM = "docs/results/lm/runs"
GAP = "docs/results/lm_gap/runs"
OUTER = "docs/results/outer/lm_small/runs"
STREAM = "docs/results/streaming/runs"
COMP = "docs/results/compression/runs"


def mean(runs: str, key: str = "eval/loss") -> Fn:
    """The mean over the seeds of ``runs``."""
    return lambda s: s.mean(runs, key)


def sd(runs: str, key: str = "eval/loss") -> Fn:
    """The sample standard deviation over the seeds of ``runs``."""
    return lambda s: s.sd(runs, key)


def diff(a: Fn, b: Fn) -> Fn:
    """``a - b``."""
    return lambda s: a(s) - b(s)


def ratio(a: Fn, b: Fn) -> Fn:
    """``a / b``."""
    return lambda s: a(s) / b(s)


def seed(runs: str, i: int, key: str = "eval/loss") -> Fn:
    """Seed ``i``'s value (the ``i``-th seed folder, in name order)."""
    return lambda s: s.seeds(runs, key)[i]


def gap_mean(base: str, other: str) -> Fn:
    """The mean of ``other - base``, paired seed by seed."""
    return lambda s: statistics.mean(s.paired_gap(base, other))


def gap_sd(base: str, other: str) -> Fn:
    """The sample standard deviation of ``other - base``, paired seed by seed."""
    return lambda s: statistics.stdev(s.paired_gap(base, other))


def sps(shape: str, rate: str, arm: str, file: str = WIRE) -> Fn:
    """Samples/s measured on the wire (``table.json`` of the wire study)."""
    return lambda s: s.wire(file, shape, rate, arm)


def wire_field(shape: str, rate: str, arm: str, field: str, file: str = WIRE) -> Fn:
    """Any field of the wire study's row."""
    return lambda s: s.wire(file, shape, rate, arm, field)


def V(fn: Fn, fmt: str) -> Value:  # noqa: N802 - reads as a constructor in the table below
    """A :class:`Value`."""
    return Value(fn, fmt)


F3 = "{:.3f}"
F2 = "{:.2f}"

CLAIMS: list[Claim] = []
