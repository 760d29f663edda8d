"""What a claim is, and the few helpers its values share (see :mod:`experiments.report.claims`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from experiments.report.doc_data import Source

Fn = Callable[[Source], float]
F0 = "{:,.0f}"


@dataclass(frozen=True)
class Value:
    """Where a figure comes from (``fn``) and how it is written (``fmt``)."""

    fn: Callable[[Source], object]
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


def V(fn: Fn, fmt: str) -> Value:  # noqa: N802 - reads as a constructor in the claims' lists
    """A :class:`Value`."""
    return Value(fn, fmt)


def diff(a: Fn, b: Fn) -> Fn:
    """``a - b``."""
    return lambda s: a(s) - b(s)


def ratio(a: Fn, b: Fn) -> Fn:
    """``a / b``."""
    return lambda s: a(s) / b(s)
