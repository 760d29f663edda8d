"""Pure-data tests of :mod:`decent_dp.topo`'s built-in topologies: no process group is created here.

Expected schedules are written out by hand for small sizes and, for larger
ones, produced by the reference functions of :mod:`tests.support.topo_reference`
that follow the written rules of each topology. The registry and the validation of
custom rounds are in ``test_topo_registry.py``; spectral gaps, contraction and the
command-line table in ``test_topo_tables.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from decent_dp.topo import (
    AlternatingExpRingTopology,
    CompleteTopology,
    Edge,
    OnePeerExpTopology,
    RandomMatchingTopology,
    RingTopology,
    TopologyReg,
    mixing_matrices,
    period_contraction,
    spectral_gap,
)
from tests.support.topo_reference import (
    AER_VALID,
    ATOL,
    BUILTINS,
    LOCAL_SIZES,
    SIZES,
    VALID,
    aer_is_valid,
    aer_reference,
    as_sets,
    assert_exact_consensus,
    assert_rounds,
    case_id,
    expected_period,
    fixed,
    one_peer_exp_reference,
    period_product,
    reference_matrix,
    ring_even_reference,
    uniform,
    union_graph_connected,
    union_pairs,
)

__all__: list[str] = []


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
