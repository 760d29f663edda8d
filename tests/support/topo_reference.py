"""The topology tests' references, written from each topology's rules, independent of decent_dp.topo.

Expected schedules for larger sizes come from these short functions; small sizes are
written out by hand in the tests (``tests/decent_dp/test_topo*.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from decent_dp.topo import (
    Edge,
    Topology,
    period_contraction,
)

__all__ = [
    "REPO_ROOT",
    "ATOL",
    "SIZES",
    "LOCAL_SIZES",
    "BUILTINS",
    "Round",
    "is_power_of_two",
    "greedy_pairs",
    "one_peer_exp_reference",
    "aer_reference",
    "ring_even_reference",
    "reference_matrix",
    "as_sets",
    "expected_as_sets",
    "assert_rounds",
    "aer_is_valid",
    "expected_period",
    "uniform",
    "period_product",
    "assert_exact_consensus",
    "union_graph_connected",
    "union_pairs",
    "valid_cases",
    "VALID",
    "AER_VALID",
    "case_id",
    "FixedRounds",
    "fixed",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
ATOL = 1e-12
SIZES = [1, 2, 3, 4, 5, 8, 16, 64]
LOCAL_SIZES = [2, 4, 8]
BUILTINS = ["complete", "ring", "one-peer-exp", "alternating-exp-ring", "random-matching"]

Round = list[tuple[list[int], float]]


# ---------------------------------------------------------------------------
# References, written from the rules and independent of decent_dp.topo
# ---------------------------------------------------------------------------


def is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def greedy_pairs(count: int, shift: int) -> list[tuple[int, int]]:
    """Walk j = 0..count-1 and pair each unpaired j with j + shift mod count."""
    taken: set[int] = set()
    pairs = []
    for j in range(count):
        if j in taken:
            continue
        k = (j + shift) % count
        assert k not in taken and k != j
        taken.update((j, k))
        pairs.append((j, k))
    return pairs


def one_peer_exp_reference(n: int) -> list[Round]:
    return [[([a, b], 0.5) for a, b in greedy_pairs(n, 2**r)] for r in range(int(math.log2(n)))]


def aer_reference(n: int, local: int) -> list[Round]:
    """Alternating-exp-ring rounds from the rule: intra-first and inter-first pairs alternate."""
    nodes = n // local

    def node(j: int) -> list[int]:
        return [j * local + i for i in range(local)]

    pairs = [(r, a, b) for r in range(int(math.log2(nodes))) for a, b in greedy_pairs(nodes, 2**r)]
    rounds: list[Round] = [[] for _ in range(2 * int(math.log2(nodes)))]
    # pair p does its intra-node average in round 2r + (p mod 2), its inter-node one in the other
    for p, (r, a, b) in enumerate(pairs):
        rounds[2 * r + p % 2] += [(node(a), 1 / local), (node(b), 1 / local)]
        rounds[2 * r + 1 - p % 2] += [(node(a) + node(b), 1 / (2 * local))]
    return rounds


def ring_even_reference(n: int) -> list[Round]:
    r0 = [([i, i + 1], 0.5) for i in range(0, n, 2)]
    r1 = [([i, (i - 1) % n], 0.5) for i in range(0, n, 2)]
    return [r0, r1]


def reference_matrix(edges: Sequence[Edge], n: int) -> torch.Tensor:
    """W of one round by the Edge rule, built entry by entry."""
    w = [[0.0] * n for _ in range(n)]
    for edge in edges:
        k = len(edge.ranks)
        for i in edge.ranks:
            for j in edge.ranks:
                if i == j:
                    w[i][j] = 1.0 if k == 1 else edge.weight
                else:
                    w[i][j] = (1.0 - edge.weight) / (k - 1)
    return torch.tensor(w, dtype=torch.float64)


def as_sets(edges: Sequence[Edge]) -> set[tuple[frozenset[int], float]]:
    """A round as an unordered set of (ranks, rounded weight)."""
    return {(frozenset(e.ranks), round(e.weight, 12)) for e in edges}


def expected_as_sets(expected: Round) -> set[tuple[frozenset[int], float]]:
    return {(frozenset(ranks), round(weight, 12)) for ranks, weight in expected}


def assert_rounds(topo: Topology, expected: list[Round]) -> None:
    assert topo.period == len(expected)
    for r, (got, want) in enumerate(zip(topo.rounds, expected)):
        assert as_sets(got) == expected_as_sets(want), f"round {r}"


def aer_is_valid(n: int, local: int) -> bool:
    return n % local == 0 and n // local >= 2 and is_power_of_two(n // local)


def expected_period(name: str, n: int, local: int) -> int:
    if n == 1:
        return 1
    return {
        "complete": 1,
        "ring": 2,
        "one-peer-exp": int(math.log2(n)),
        "alternating-exp-ring": 2 * int(math.log2(max(n // local, 1))),
        "random-matching": 8,
    }[name]


def uniform(n: int) -> torch.Tensor:
    return torch.full((n, n), 1.0 / n, dtype=torch.float64)


def period_product(mats: Sequence[torch.Tensor]) -> torch.Tensor:
    """W(P-1) ... W(0), the map of one full period."""
    prod = torch.eye(mats[0].shape[0], dtype=torch.float64)
    for w in mats:
        prod = w @ prod
    return prod


def assert_exact_consensus(topo: Topology) -> None:
    """One period averages exactly: the product of the rounds' matrices is 11^T / n."""
    mats = topo.mixing_matrices()
    assert period_contraction(mats) < ATOL
    torch.testing.assert_close(period_product(mats), uniform(topo.world_size), atol=ATOL, rtol=0)


def union_graph_connected(rounds: Sequence[Sequence[Edge]], n: int) -> bool:
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for edges in rounds:
        for edge in edges:
            for a in edge.ranks:
                adj[a].update(b for b in edge.ranks if b != a)
    seen, todo = {0}, [0]
    while todo:
        for b in adj[todo.pop()]:
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return len(seen) == n


def union_pairs(rounds: Sequence[Sequence[Edge]]) -> set[frozenset[int]]:
    out: set[frozenset[int]] = set()
    for edges in rounds:
        for edge in edges:
            out.update(frozenset((a, b)) for a in edge.ranks for b in edge.ranks if a < b)
    return out


def valid_cases() -> list[tuple[str, int, int]]:
    cases = []
    for n in SIZES:
        cases += [("complete", n, 1), ("ring", n, 1), ("random-matching", n, 1)]
        if is_power_of_two(n):
            cases.append(("one-peer-exp", n, 1))
        for local in [1, *LOCAL_SIZES]:
            if n == 1 or aer_is_valid(n, local):
                cases.append(("alternating-exp-ring", n, local))
    return cases


VALID = valid_cases()
AER_VALID = [(n, local) for name, n, local in VALID if name == "alternating-exp-ring" and n > 1]


def case_id(case: tuple[str, int, int]) -> str:
    return f"{case[0]}-n{case[1]}-L{case[2]}"


class FixedRounds(Topology):
    """A topology whose rounds are set per test, to exercise validation."""

    rounds_to_return: list = []

    def _get_topo_edges(self) -> list[list[Edge]]:
        return type(self).rounds_to_return


def fixed(rounds: list) -> type[Topology]:
    return type("Fixed", (FixedRounds,), {"rounds_to_return": rounds})
