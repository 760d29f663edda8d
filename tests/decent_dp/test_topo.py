"""Pure-data tests of :mod:`decent_dp.topo`: no process group is created here.

Expected schedules are written out by hand for small sizes and, for larger
ones, produced by short reference functions in this file that follow the
written rules of each topology.
"""

from __future__ import annotations

import math
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

from decent_dp.topo import (
    AlternatingExpRingTopology,
    CompleteTopology,
    Edge,
    OnePeerExpTopology,
    RandomMatchingTopology,
    RingTopology,
    Topology,
    TopologyReg,
    describe,
    main,
    mixing_matrices,
    period_contraction,
    spectral_gap,
)

__all__: list[str] = []

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


@pytest.fixture
def fresh_name() -> Iterator[Callable[[str], str]]:
    """Hands out unique registry names and removes them from the registry afterwards."""
    added: list[str] = []

    def make(stem: str) -> str:
        name = f"test-{stem}-{uuid.uuid4().hex[:8]}"
        added.append(name)
        return name

    yield make
    for name in added:
        TopologyReg.registry.pop(name, None)


# ---------------------------------------------------------------------------
# Edge
# ---------------------------------------------------------------------------


def test_edge_weights_follow_rule() -> None:
    edge = Edge([0, 1, 2], 0.2)
    assert edge.self_weight == pytest.approx(0.2)
    assert edge.peer_weight == pytest.approx(0.4)
    pair = Edge([3, 7], 0.5)
    assert (pair.self_weight, pair.peer_weight) == (0.5, 0.5)


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_edge_of_one_keeps_itself(weight: float) -> None:
    edge = Edge([5], weight)
    assert edge.self_weight == 1.0
    assert edge.peer_weight == 0.0


def test_edge_normalises_fields_and_ignores_group_in_equality() -> None:
    edge = Edge(range(3), 1)
    assert edge.ranks == (0, 1, 2)
    assert isinstance(edge.weight, float)
    assert edge.group is None
    assert Edge([0, 1], 0.5, group="a") == Edge((0, 1), 0.5, group="b")


def test_single_member_group_in_matrix() -> None:
    topo = fixed([[Edge([0], 0.3), Edge([1, 2], 0.25)]])(3, 1)
    want = torch.tensor(
        [[1.0, 0.0, 0.0], [0.0, 0.25, 0.75], [0.0, 0.75, 0.25]], dtype=torch.float64
    )
    torch.testing.assert_close(topo.mixing_matrix(0), want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------
# Every built-in topology at every size
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_rounds_partition_ranks(case: tuple[str, int, int]) -> None:
    name, n, local = case
    topo = TopologyReg.create(name, n, local)
    assert (topo.world_size, topo.local_world_size) == (n, local)
    assert topo.period == len(topo.rounds) >= 1
    for edges in topo.rounds:
        ranks = sorted(r for e in edges for r in e.ranks)
        assert ranks == list(range(n))
        assert all(0.0 <= e.weight <= 1.0 and e.group is None for e in edges)


@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_period_length(case: tuple[str, int, int]) -> None:
    name, n, local = case
    assert TopologyReg.create(name, n, local).period == expected_period(name, n, local)


@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_mixing_matrices_doubly_stochastic_symmetric_and_by_edge_rule(
    case: tuple[str, int, int],
) -> None:
    name, n, local = case
    topo = TopologyReg.create(name, n, local)
    mats = mixing_matrices(name, n, local)
    assert len(mats) == topo.period
    ones = torch.ones(n, dtype=torch.float64)
    for r, w in enumerate(mats):
        assert w.dtype == torch.float64 and w.shape == (n, n)
        torch.testing.assert_close(w, w.T, atol=ATOL, rtol=0)
        torch.testing.assert_close(w.sum(0), ones, atol=ATOL, rtol=0)
        torch.testing.assert_close(w.sum(1), ones, atol=ATOL, rtol=0)
        assert bool((w >= 0).all())
        torch.testing.assert_close(w, reference_matrix(topo.rounds[r], n), atol=ATOL, rtol=0)
        torch.testing.assert_close(topo.mixing_matrix(r + topo.period), w, atol=0, rtol=0)


@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_get_edge_cycles_with_period(case: tuple[str, int, int]) -> None:
    name, n, local = case
    topo = TopologyReg.create(name, n, local)
    for step in range(2 * topo.period):
        for rank in range(n):
            edge = topo.get_edge(step, rank)
            assert rank in edge.ranks
            assert edge in topo.rounds[step % topo.period]


@pytest.mark.parametrize("name", BUILTINS)
@pytest.mark.parametrize("local", [1, 2, 8])
def test_world_size_one_is_valid(name: str, local: int) -> None:
    topo = TopologyReg.create(name, 1, local)
    mats = topo.mixing_matrices()
    assert topo.period == 1
    torch.testing.assert_close(mats[0], torch.ones(1, 1, dtype=torch.float64))
    assert spectral_gap(mats[0]) == 1.0
    assert period_contraction(mats) == pytest.approx(0.0, abs=ATOL)


@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_period_contraction_matches_svd_of_product(case: tuple[str, int, int]) -> None:
    name, n, local = case
    mats = mixing_matrices(name, n, local)
    want = torch.linalg.svdvals(period_product(mats) - uniform(n))[0].item()
    assert period_contraction(mats) == pytest.approx(want, abs=1e-10)
    assert period_contraction(mats) <= 1.0 + 1e-10


# ---------------------------------------------------------------------------
# complete
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_complete(n: int) -> None:
    topo = CompleteTopology(n, 1)
    assert topo.period == 1
    assert as_sets(topo.rounds[0]) == {(frozenset(range(n)), round(1 / n, 12))}
    torch.testing.assert_close(topo.mixing_matrix(0), uniform(n), atol=ATOL, rtol=0)
    assert spectral_gap(topo.mixing_matrix(0)) == pytest.approx(1.0, abs=ATOL)
    assert period_contraction(topo.mixing_matrices()) < ATOL


# ---------------------------------------------------------------------------
# ring
# ---------------------------------------------------------------------------


def test_ring_n4_by_hand() -> None:
    assert_rounds(
        RingTopology(4, 1),
        [
            [([0, 1], 0.5), ([2, 3], 0.5)],
            [([0, 3], 0.5), ([1, 2], 0.5)],
        ],
    )


def test_ring_n6_by_hand() -> None:
    assert_rounds(
        RingTopology(6, 1),
        [
            [([0, 1], 0.5), ([2, 3], 0.5), ([4, 5], 0.5)],
            [([0, 5], 0.5), ([1, 2], 0.5), ([3, 4], 0.5)],
        ],
    )


def test_ring_n2_by_hand() -> None:
    assert_rounds(RingTopology(2, 1), [[([0, 1], 0.5)], [([0, 1], 0.5)]])


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_ring_even(n: int) -> None:
    topo = RingTopology(n, 1)
    assert_rounds(topo, ring_even_reference(n))
    cycle = {frozenset((i, (i + 1) % n)) for i in range(n)}
    assert union_pairs(topo.rounds) == cycle


@pytest.mark.parametrize("n", [3, 5, 7, 9, 63])
def test_ring_odd(n: int) -> None:
    topo = RingTopology(n, 1)
    for edges in topo.rounds:
        for edge in edges:
            assert len(edge.ranks) in (2, 3)
            if len(edge.ranks) == 3:
                assert edge.weight == pytest.approx(1 / 3, abs=ATOL)
            else:
                assert edge.weight == 0.5
        assert sum(len(e.ranks) == 3 for e in edges) >= 1
    assert union_graph_connected(topo.rounds, n)
    cycle = {frozenset((i, (i + 1) % n)) for i in range(n)}
    assert cycle <= union_pairs(topo.rounds)


@pytest.mark.parametrize("n", [3, 4, 5, 8, 16, 64])
def test_ring_contracts_over_a_period(n: int) -> None:
    assert period_contraction(mixing_matrices("ring", n)) < 1.0 - 1e-9


# ---------------------------------------------------------------------------
# one-peer-exp
# ---------------------------------------------------------------------------


def test_one_peer_exp_n8_by_hand() -> None:
    assert_rounds(
        OnePeerExpTopology(8, 1),
        [
            [([0, 1], 0.5), ([2, 3], 0.5), ([4, 5], 0.5), ([6, 7], 0.5)],
            [([0, 2], 0.5), ([1, 3], 0.5), ([4, 6], 0.5), ([5, 7], 0.5)],
            [([0, 4], 0.5), ([1, 5], 0.5), ([2, 6], 0.5), ([3, 7], 0.5)],
        ],
    )


def test_one_peer_exp_n4_and_n2_by_hand() -> None:
    assert_rounds(
        OnePeerExpTopology(4, 1), [[([0, 1], 0.5), ([2, 3], 0.5)], [([0, 2], 0.5), ([1, 3], 0.5)]]
    )
    assert_rounds(OnePeerExpTopology(2, 1), [[([0, 1], 0.5)]])


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64, 128])
def test_one_peer_exp_rounds_and_exact_consensus(n: int) -> None:
    topo = OnePeerExpTopology(n, 1)
    assert_rounds(topo, one_peer_exp_reference(n))
    assert_exact_consensus(topo)


@pytest.mark.parametrize("n", [3, 5, 6, 12, 63])
def test_one_peer_exp_rejects_non_power_of_two(n: int) -> None:
    with pytest.raises(ValueError, match=rf"n={n}\b") as info:
        TopologyReg.create("one-peer-exp", n)
    assert "power" in str(info.value)
    assert "'ring'" in str(info.value)


# ---------------------------------------------------------------------------
# alternating-exp-ring
# ---------------------------------------------------------------------------


def test_aer_n8_l2_by_hand() -> None:
    assert_rounds(
        AlternatingExpRingTopology(8, 2),
        [
            # node pairs (0,1) intra-first and (2,3) inter-first
            [([0, 1], 0.5), ([2, 3], 0.5), ([4, 5, 6, 7], 0.25)],
            [([0, 1, 2, 3], 0.25), ([4, 5], 0.5), ([6, 7], 0.5)],
            # node pairs (0,2) intra-first and (1,3) inter-first
            [([0, 1], 0.5), ([4, 5], 0.5), ([2, 3, 6, 7], 0.25)],
            [([0, 1, 4, 5], 0.25), ([2, 3], 0.5), ([6, 7], 0.5)],
        ],
    )


def test_aer_n4_l2_by_hand() -> None:
    assert_rounds(
        AlternatingExpRingTopology(4, 2),
        [[([0, 1], 0.5), ([2, 3], 0.5)], [([0, 1, 2, 3], 0.25)]],
    )


def test_aer_n16_l4_by_hand() -> None:
    a, b, c, d = ([4 * j + i for i in range(4)] for j in range(4))
    assert_rounds(
        AlternatingExpRingTopology(16, 4),
        [
            [(a, 0.25), (b, 0.25), (c + d, 0.125)],
            [(a + b, 0.125), (c, 0.25), (d, 0.25)],
            [(a, 0.25), (c, 0.25), (b + d, 0.125)],
            [(a + c, 0.125), (b, 0.25), (d, 0.25)],
        ],
    )


@pytest.mark.parametrize(("n", "local"), AER_VALID, ids=lambda v: str(v))
def test_aer_rounds_and_exact_consensus(n: int, local: int) -> None:
    topo = AlternatingExpRingTopology(n, local)
    assert_rounds(topo, aer_reference(n, local))
    assert topo.period == 2 * int(math.log2(n // local))
    for edges in topo.rounds:
        for edge in edges:
            k = len(edge.ranks)
            assert k in (local, 2 * local)
            assert edge.weight == pytest.approx(1 / k, abs=ATOL)
            # groups are whole nodes
            assert len({r // local for r in edge.ranks}) == k // local
    assert_exact_consensus(topo)


def aer_invalid_cases() -> list[tuple[int, int]]:
    cases = [(n, local) for n in SIZES for local in LOCAL_SIZES if n > 1]
    cases = [c for c in cases if not aer_is_valid(*c)]
    return cases + [(6, 2), (12, 4), (24, 8), (20, 2)]


@pytest.mark.parametrize(("n", "local"), aer_invalid_cases(), ids=lambda v: str(v))
def test_aer_rejects_bad_sizes(n: int, local: int) -> None:
    with pytest.raises(ValueError, match="alternating-exp-ring") as info:
        AlternatingExpRingTopology(n, local)
    msg = str(info.value)
    if n % local == 0 and n // local == 1:
        assert "--nnodes" in msg
    elif n % local != 0:
        assert f"n={n}" in msg and f"L={local}" in msg
    else:
        assert f"N={n // local}" in msg and "power" in msg


def test_aer_takes_local_world_size_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    topo = TopologyReg.create("alternating-exp-ring", 8)
    assert topo.local_world_size == 2
    assert_rounds(topo, aer_reference(8, 2))
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(ValueError, match="--nnodes"):
        TopologyReg.create("alternating-exp-ring", 8)


# ---------------------------------------------------------------------------
# random-matching
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16, 64])
@pytest.mark.parametrize("seed", [0, 7])
def test_random_matching_rounds(n: int, seed: int) -> None:
    topo = RandomMatchingTopology(n, 1, period=5, seed=seed)
    assert topo.period == 5
    for edges in topo.rounds:
        sizes = sorted(len(e.ranks) for e in edges)
        if n % 2 == 0:
            assert sizes == [2] * (n // 2)
        else:
            assert sizes == [2] * ((n - 3) // 2) + [3]
        for edge in edges:
            assert edge.weight == pytest.approx(1 / len(edge.ranks), abs=ATOL)


def test_random_matching_is_deterministic_per_seed() -> None:
    a = RandomMatchingTopology(16, 1, seed=3)
    b = TopologyReg.create("random-matching", 16, seed=3)
    c = RandomMatchingTopology(16, 1, seed=4)
    assert [as_sets(r) for r in a.rounds] == [as_sets(r) for r in b.rounds]
    assert [as_sets(r) for r in a.rounds] != [as_sets(r) for r in c.rounds]


@pytest.mark.parametrize("period", [0, -2])
def test_random_matching_rejects_bad_period(period: int) -> None:
    with pytest.raises(ValueError, match=rf"period={period}"):
        RandomMatchingTopology(4, 1, period=period)


# ---------------------------------------------------------------------------
# Validation of custom rounds
# ---------------------------------------------------------------------------

GOOD_ROUND = [Edge([0, 1], 0.5), Edge([2, 3], 0.5)]


@pytest.mark.parametrize(
    ("bad_round", "fragments"),
    [
        pytest.param(
            [Edge([0, 1], 0.5), Edge([1, 2], 0.5), Edge([3], 1.0)],
            ["round 1", "rank 1", "exactly one edge"],
            id="rank-in-two-edges",
        ),
        pytest.param(
            [Edge([0, 1, 1], 0.5), Edge([2, 3], 0.5)],
            ["round 1", "rank 1", "exactly one edge"],
            id="rank-twice-in-one-edge",
        ),
        pytest.param(
            [Edge([0, 1], 0.5), Edge([2], 1.0)],
            ["round 1", "rank 3", "every rank must take part"],
            id="rank-missing",
        ),
        pytest.param(
            [Edge([0, 1], 0.5), Edge([2, 3], 0.5), Edge([4], 1.0)],
            ["round 1", "rank 4", "out of range", "0..3"],
            id="rank-too-large",
        ),
        pytest.param(
            [Edge([0, 1], 0.5), Edge([2, 3, -1], 0.5)],
            ["round 1", "rank -1", "out of range", "0..3"],
            id="rank-negative",
        ),
        pytest.param(
            [Edge([0, 1], 0.5), Edge([2, 3], -0.1)],
            ["round 1", "[2, 3]", "-0.1", "[0, 1]"],
            id="weight-negative",
        ),
        pytest.param(
            [Edge([0, 1], 1.5), Edge([2, 3], 0.5)],
            ["round 1", "[0, 1]", "1.5", "must lie in [0, 1]"],
            id="weight-above-one",
        ),
        pytest.param(
            [Edge([0, 1], float("nan")), Edge([2, 3], 0.5)],
            ["round 1", "nan", "[0, 1]"],
            id="weight-nan",
        ),
        pytest.param([], ["round 1", "non-empty"], id="empty-round"),
        pytest.param(
            [Edge([], 0.5), Edge([0, 1], 0.5), Edge([2, 3], 0.5)],
            ["round 1", "no ranks"],
            id="empty-edge",
        ),
        pytest.param(
            [(0, 1), Edge([2, 3], 0.5)], ["round 1", "tuple", "not Edge"], id="not-an-edge"
        ),
    ],
)
def test_validation_errors(bad_round: list, fragments: list[str]) -> None:
    klass = fixed([list(GOOD_ROUND), bad_round])
    with pytest.raises(ValueError) as info:
        klass(4, 1)
    msg = str(info.value)
    assert "topology 'custom'" in msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"


def test_validation_rejects_no_rounds() -> None:
    with pytest.raises(ValueError, match="non-empty list of rounds"):
        fixed([])(4, 1)


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_boundary_weights_are_valid(weight: float) -> None:
    topo = fixed([[Edge([0, 1], weight), Edge([2, 3], weight)]])(4, 1)
    w = topo.mixing_matrix(0)
    assert w[0, 0].item() == weight and w[0, 1].item() == 1.0 - weight


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"world_size": 0, "local_world_size": 1}, "world_size=0"),
        ({"world_size": -3, "local_world_size": 1}, "world_size=-3"),
        ({"world_size": 4, "local_world_size": 0}, "local_world_size=0"),
    ],
)
def test_bad_sizes_rejected(kwargs: dict[str, int], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        CompleteTopology(**kwargs)


def test_missing_world_size_without_process_group() -> None:
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="world_size"):
        CompleteTopology()


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


def test_builtins_registered() -> None:
    names = TopologyReg.names()
    assert set(BUILTINS) <= set(names)
    for name in BUILTINS:
        assert TopologyReg.get(name).name == name


def test_register_and_create_custom(fresh_name: Callable[[str], str]) -> None:
    name = fresh_name("pairs")

    @TopologyReg.register(name)
    class Pairs(Topology):
        def _get_topo_edges(self) -> list[list[Edge]]:
            n = self.world_size
            return [[Edge([i, i + 1], 0.25) for i in range(0, n, 2)]]

    assert Pairs.name == name
    assert name in TopologyReg.names()
    assert TopologyReg.get(name) is Pairs

    by_name = TopologyReg.create(name, 6)
    by_class = TopologyReg.create(Pairs, 6, 1)
    assert isinstance(by_name, Pairs) and isinstance(by_class, Pairs)
    assert TopologyReg.create(by_name) is by_name
    expected = [[([0, 1], 0.25), ([2, 3], 0.25), ([4, 5], 0.25)]]
    assert_rounds(by_name, expected)
    assert_rounds(by_class, expected)

    want = torch.zeros(6, 6, dtype=torch.float64)
    for i in range(0, 6, 2):
        want[i, i] = want[i + 1, i + 1] = 0.25
        want[i, i + 1] = want[i + 1, i] = 0.75
    for mats in (mixing_matrices(name, 6), mixing_matrices(Pairs, 6), mixing_matrices(by_name, 6)):
        assert len(mats) == 1
        torch.testing.assert_close(mats[0], want, atol=ATOL, rtol=0)


def test_registered_custom_topology_validates_with_its_name(
    fresh_name: Callable[[str], str],
) -> None:
    name = fresh_name("broken")

    @TopologyReg.register(name)
    class Broken(Topology):
        def _get_topo_edges(self) -> list[list[Edge]]:
            return [[Edge([0, 1], 0.5)]]

    with pytest.raises(ValueError, match=rf"topology '{name}' round 0: rank 2"):
        TopologyReg.create(name, 3)


@pytest.mark.parametrize("name", BUILTINS)
def test_register_rejects_duplicate_builtin(name: str) -> None:
    before = TopologyReg.get(name)
    with pytest.raises(ValueError, match=rf"'{name}'.*already registered"):

        @TopologyReg.register(name)
        class Again(Topology):
            def _get_topo_edges(self) -> list[list[Edge]]:
                return [[Edge([0], 1.0)]]

    assert TopologyReg.get(name) is before


def test_register_rejects_duplicate_custom(fresh_name: Callable[[str], str]) -> None:
    name = fresh_name("dup")

    @TopologyReg.register(name)
    class First(Topology):
        def _get_topo_edges(self) -> list[list[Edge]]:
            return [[Edge([0], 1.0)]]

    with pytest.raises(ValueError, match="already registered"):
        TopologyReg.register(name)(First)
    assert TopologyReg.get(name) is First


@pytest.mark.parametrize(
    "thing", [object, dict, lambda n: n, 3], ids=["object", "dict", "function", "int"]
)
def test_register_rejects_non_topology(thing: object, fresh_name: Callable[[str], str]) -> None:
    name = fresh_name("bad")
    with pytest.raises(TypeError, match=rf"'{name}'.*Topology subclass"):
        TopologyReg.register(name)(thing)  # type: ignore[arg-type]
    assert name not in TopologyReg.registry


@pytest.mark.parametrize(
    "call",
    [
        lambda: TopologyReg.get("no-such-topology"),
        lambda: TopologyReg.create("no-such-topology", 4),
        lambda: mixing_matrices("no-such-topology", 4),
    ],
    ids=["get", "create", "mixing_matrices"],
)
def test_unknown_name_lists_known(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="no-such-topology") as info:
        call()
    for name in BUILTINS:
        assert name in str(info.value)


@pytest.mark.parametrize("bad", [42, None, CompleteTopology(2, 1).rounds, dict])
def test_create_rejects_other_objects(bad: object) -> None:
    with pytest.raises(ValueError, match="topology="):
        TopologyReg.create(bad, 4)  # type: ignore[arg-type]


def test_create_passes_keyword_arguments() -> None:
    topo = TopologyReg.create("random-matching", 6, 1, period=3, seed=11)
    assert topo.period == 3
    assert len(mixing_matrices("random-matching", 6, period=2)) == 2


# ---------------------------------------------------------------------------
# spectral_gap and period_contraction on hand cases
# ---------------------------------------------------------------------------


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


PAIRS4 = t(
    [
        [0.5, 0.5, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [0.0, 0.0, 0.5, 0.5],
        [0.0, 0.0, 0.5, 0.5],
    ]
)


@pytest.mark.parametrize(
    ("w", "gap"),
    [
        pytest.param(uniform(3), 1.0, id="uniform-3"),
        pytest.param(uniform(8), 1.0, id="uniform-8"),
        pytest.param(torch.ones(1, 1, dtype=torch.float64), 1.0, id="one-worker"),
        # two disjoint pairs: eigenvalues 1, 1, 0, 0
        pytest.param(PAIRS4, 0.0, id="disjoint-pairs"),
        # swap: eigenvalues 1, -1
        pytest.param(t([[0.0, 1.0], [1.0, 0.0]]), 0.0, id="swap"),
        pytest.param(torch.eye(3, dtype=torch.float64), 0.0, id="identity"),
        # eigenvalues 1, 0.5
        pytest.param(t([[0.75, 0.25], [0.25, 0.75]]), 0.5, id="lazy-pair"),
        # eigenvalues 1, -0.8: the most negative one sets the gap
        pytest.param(t([[0.1, 0.9], [0.9, 0.1]]), 0.2, id="negative-eigenvalue"),
        # eigenvalues 1, 0.1 on (1,-1,0) and -0.3 on (1,1,-2): |λn| sets the gap
        pytest.param(
            t([[10, 7, 13], [7, 10, 13], [13, 13, 4]]) / 30, 0.7, id="negative-smallest-3"
        ),
        # circulant (1/2, 1/4, 1/4): eigenvalues 1, 1/4, 1/4
        pytest.param(
            t([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]]), 0.75, id="circulant-3"
        ),
    ],
)
def test_spectral_gap_hand_cases(w: torch.Tensor, gap: float) -> None:
    assert spectral_gap(w) == pytest.approx(gap, abs=1e-12)


def test_spectral_gap_of_ring_rounds_is_zero_but_period_mixes() -> None:
    mats = mixing_matrices("ring", 8)
    assert [spectral_gap(w) for w in mats] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert period_contraction(mats) < 1.0


@pytest.mark.parametrize(
    ("mats", "value"),
    [
        pytest.param([uniform(4)], 0.0, id="uniform"),
        pytest.param([torch.eye(3, dtype=torch.float64)], 1.0, id="identity"),
        pytest.param([t([[0.75, 0.25], [0.25, 0.75]])], 0.5, id="lazy-pair"),
        pytest.param([t([[0.75, 0.25], [0.25, 0.75]])] * 2, 0.25, id="lazy-pair-twice"),
        # averaging pairs (0,1),(2,3) and then (0,3),(1,2) reaches consensus
        pytest.param([PAIRS4, PAIRS4[[0, 2, 3, 1]][:, [0, 2, 3, 1]]], 0.0, id="ring-4"),
        pytest.param([PAIRS4, PAIRS4], 1.0, id="same-pairs-twice"),
    ],
)
def test_period_contraction_hand_cases(mats: list[torch.Tensor], value: float) -> None:
    assert period_contraction(mats) == pytest.approx(value, abs=1e-12)


def test_ring4_hand_matrix_matches_topology() -> None:
    mats = mixing_matrices("ring", 4)
    torch.testing.assert_close(mats[0], PAIRS4, atol=ATOL, rtol=0)
    torch.testing.assert_close(
        mats[1],
        t(
            [
                [0.5, 0.0, 0.0, 0.5],
                [0.0, 0.5, 0.5, 0.0],
                [0.0, 0.5, 0.5, 0.0],
                [0.5, 0.0, 0.0, 0.5],
            ]
        ),
        atol=ATOL,
        rtol=0,
    )


# ---------------------------------------------------------------------------
# describe() and the command-line table
# ---------------------------------------------------------------------------


def test_describe() -> None:
    row = describe("complete", 4)
    assert (row["name"], row["period"], row["peers_per_round"]) == ("complete", 1, 3)
    assert row["worst_gap"] == pytest.approx(1.0, abs=ATOL)
    assert row["contraction"] == pytest.approx(0.0, abs=ATOL)
    assert "error" in describe("one-peer-exp", 6)
    aer = describe("alternating-exp-ring", 16, 4)
    assert (aer["period"], aer["peers_per_round"]) == (4, 7)


def run_table(*args: str) -> dict[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-m", "decent_dp.topo", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("topology", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def test_cli_table_world_size_64() -> None:
    rows = run_table("--world-size", "64")
    module_names = [
        name
        for name, klass in TopologyReg.registry.items()
        if klass.__module__ == "decent_dp._builtin_topologies"
    ]
    assert set(BUILTINS) <= set(module_names) <= set(rows)
    # default local world size is 8, so alternating-exp-ring has 8 nodes
    periods = {
        "complete": 1,
        "ring": 2,
        "one-peer-exp": 6,
        "alternating-exp-ring": 6,
        "random-matching": 8,
    }
    for name in BUILTINS:
        assert not rows[name][0].startswith("n/a"), rows[name]
        assert int(rows[name][0]) == periods[name]
    for name in ("complete", "one-peer-exp", "alternating-exp-ring"):
        assert float(rows[name][3]) < 1e-9
    assert int(rows["complete"][1]) == 63
    assert int(rows["alternating-exp-ring"][1]) == 15


@pytest.mark.slow  # the CLI's start-up is paid once in the fast suite, by the world-size-64 table
def test_cli_table_world_size_6_marks_sizes_that_do_not_fit() -> None:
    rows = run_table("--world-size", "6", "--local-world-size", "2")
    assert set(BUILTINS) <= set(rows)
    assert rows["one-peer-exp"][0].startswith("n/a:")
    assert "n=6" in rows["one-peer-exp"][0]
    assert rows["alternating-exp-ring"][0].startswith("n/a:")
    for name in ("complete", "ring", "random-matching"):
        assert not rows[name][0].startswith("n/a")


def test_cli_rejects_bad_world_size(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--world-size", "0"])
    assert info.value.code == 2
    assert "--world-size=0" in capsys.readouterr().err
