"""Base-(k+1) schedules: rounds whose product is exactly ``11^T / n`` for any ``n``.

The construction behind :class:`decent_dp.topo.BaseKTopology` (Takezawa et
al., NeurIPS 2023), as pure functions of ``n`` and ``k`` on hashable tuples,
so that schedules are cached.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

__all__ = ["base_k_period_bound"]


# a group as (ranks, weight) and a round as a tuple of groups: hashable, so schedules are cached
_Group = tuple[tuple[int, ...], float]
_Sched = tuple[tuple[_Group, ...], ...]


def _leading_digit(n: int, base: int) -> tuple[int, int]:
    """``(a, p)`` with ``a * base**p <= n < (a + 1) * base**p`` and ``1 <= a < base``."""
    p = 0
    while base ** (p + 1) <= n:
        p += 1
    return n // base**p, p


@functools.cache
def _smooth_factors(n: int, base: int) -> tuple[int, ...] | None:
    """Fewest factors, each in ``2..base``, whose product is ``n``; ``None`` if there are none."""
    if n == 1:
        return ()
    options = [
        (d, *rest)
        for d in range(min(base, n), 1, -1)
        if n % d == 0 and (rest := _smooth_factors(n // d, base)) is not None
    ]
    return min(options, key=len) if options else None


def _hyper_hypercube(nodes: Sequence[int], factors: Sequence[int]) -> _Sched:
    """Exact averaging of ``nodes`` in ``len(factors)`` rounds.

    Node ``i`` is written in the mixed radix ``factors``; round ``j`` averages
    uniformly each group of nodes that differ only in digit ``j``.
    """
    rounds = []
    stride = 1
    for f in factors:
        groups = tuple(
            (tuple(nodes[i + d * stride] for d in range(f)), 1.0 / f)
            for i in range(len(nodes))
            if (i // stride) % f == 0
        )
        rounds.append(groups)
        stride *= f
    return tuple(rounds)


def _side_by_side(*schedules: _Sched) -> _Sched:
    """Run schedules on disjoint nodes in parallel; a finished one leaves its nodes alone."""
    length = max((len(s) for s in schedules), default=0)
    return tuple(tuple(g for s in schedules if r < len(s) for g in s[r]) for r in range(length))


def _relabel(schedule: _Sched, offset: int) -> _Sched:
    return tuple(
        tuple((tuple(r + offset for r in ranks), w) for ranks, w in groups) for groups in schedule
    )


def _deferred(nodes: tuple[int, ...], base: int) -> tuple[_Sched, _Sched]:
    """Split exact averaging of ``nodes`` into phases ``(A, B)``.

    After phase A every node holds a value whose *block* (a group that phase B
    averages exactly) has the mean of all ``nodes``; nodes outside every block
    already hold that mean. Phase B averages each block. Hence any step that
    replaces every value ``y`` by ``(1 - c) y + c z``, with one ``z`` for all
    of ``nodes``, may sit between the phases: the result is still the mean,
    shifted the same way. This lets the exchange of an enclosing level
    overlap phase B of the levels below it.
    """
    m = len(nodes)
    a, p = _leading_digit(m, base)
    factors = _smooth_factors(m, base)
    # one pass when it is no longer than the leading block's (64 = 2^6 for k=2 is not)
    if factors is not None and len(factors) <= p + (a > 1):
        return (), _hyper_hypercube(nodes, factors)
    v = a * base**p
    block, tail = nodes[:v], nodes[v:]
    block_pass = _hyper_hypercube(block, _smooth_factors(v, base) or ())
    tail_a, tail_b = _deferred(tail, base)
    before = _side_by_side(block_pass, tail_a)
    # each tail node meets its own block node (len(tail) < base**p <= v); both keep s/m, with
    # s = len(tail): the tail moves to (s y + v A) / m, and the block's mean becomes
    # (v A + s B) / m, with A the block's and B the tail's mean
    s = len(tail)
    exchange = tuple(((t, b), s / m) for t, b in zip(tail, block))
    return before + (exchange,), _side_by_side(block_pass, tail_b)


@functools.cache
def _base_k_schedule(n: int, base: int) -> _Sched:
    """The shortest of: hyper-hypercube (smooth ``n``), the digit chain, and products."""
    phase_a, phase_b = _deferred(tuple(range(n)), base)
    best = phase_a + phase_b
    factors = _smooth_factors(n, base)
    if factors is not None and len(factors) < len(best):
        best = _hyper_hypercube(range(n), factors)
    # n = c * m with c smooth: average m-rank rows side by side, then each c-rank column
    for c in range(2, n // 2 + 1):
        col = _smooth_factors(c, base) if n % c == 0 else None
        if col is None:
            continue
        m = n // c
        row = _base_k_schedule(m, base)
        if len(row) + len(col) >= len(best):
            continue
        rows = _side_by_side(*[_relabel(row, q * m) for q in range(c)])
        cols = _side_by_side(
            *[_hyper_hypercube([q * m + j for q in range(c)], col) for j in range(m)]
        )
        best = rows + cols
    return best


def base_k_period_bound(n: int, k: int) -> int:
    """The period :class:`BaseKTopology` never exceeds: ``2p + 2 + [a > 1]``.

    With ``n = a (k+1)^p + r``, ``1 <= a <= k`` and ``0 <= r < (k+1)^p`` (``a``
    is the leading base-``(k+1)`` digit), and ``0`` for ``n = 1``. A world
    size that factors into numbers ``<= k+1`` needs only its hyper-hypercube
    (at most ``p + 1`` rounds). For ``k <= 3`` the bound is at most
    ``2 log_{k+1}(n) + 2``, the bound of Takezawa et al. (NeurIPS 2023).
    """
    if n == 1:
        return 0
    a, p = _leading_digit(n, k + 1)
    return 2 * p + 2 + (1 if a > 1 else 0)
