"""Pure-data tests of the ``local-sgd`` and ``base-k`` topologies and of 0.2.x-style subclasses.

Every check works on the mixing matrices alone: no process group is created.
"""

from __future__ import annotations

import math

import pytest
import torch

from decent_dp.topo import (
    BaseKTopology,
    Edge,
    LocalSGDTopology,
    Topology,
    TopologyReg,
    base_k_period_bound,
    describe,
    mixing_matrices,
)

__all__: list[str] = []

ATOL = 1e-12


def product(mats: list[torch.Tensor]) -> torch.Tensor:
    """W(P-1) ... W(0), the map of one full period."""
    out = torch.eye(mats[0].shape[0], dtype=torch.float64)
    for w in mats:
        out = w @ out
    return out


def as_pairs(edges: list[Edge]) -> set[tuple[tuple[int, ...], float]]:
    return {(tuple(sorted(e.ranks)), round(e.self_weight, 12)) for e in edges}


# ---------------------------------------------------------------------------
# base-k
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
def test_base_k_exact_average_for_every_n(k: int) -> None:
    for n in range(2, 65):
        topo = BaseKTopology(n, 1, k=k)
        mats = topo.mixing_matrices()
        for w in mats:
            assert torch.allclose(w.sum(0), torch.ones(n, dtype=torch.float64), atol=ATOL)
            assert torch.allclose(w.sum(1), torch.ones(n, dtype=torch.float64), atol=ATOL)
            assert (w >= 0).all()
        gap = (product(mats) - torch.full((n, n), 1.0 / n, dtype=torch.float64)).abs().max()
        assert gap <= ATOL, f"n={n} k={k}: max |prod - 11^T/n| = {gap}"
        peers = max(len(e.ranks) - 1 for edges in topo.rounds for e in edges)
        assert peers <= k, f"n={n} k={k}: a rank has {peers} peers"
        # the bound stated in the docstring, and the paper's 2 log_{k+1}(n) + 2
        assert topo.period <= base_k_period_bound(n, k), (n, k, topo.period)
        assert topo.period <= 2 * math.log(n, k + 1) + 2 + 1e-9, (n, k, topo.period)


def test_period_bound_formula() -> None:
    # n = a (k+1)^p + r: 2p + 2 + [a > 1]
    assert base_k_period_bound(1, 1) == 0
    assert base_k_period_bound(31, 1) == 2 * 4 + 2  # 31 = 1 * 16 + 15
    assert base_k_period_bound(20, 2) == 2 * 2 + 2 + 1  # 20 = 2 * 9 + 2
    assert base_k_period_bound(63, 3) == 2 * 2 + 2 + 1  # 63 = 3 * 16 + 15


@pytest.mark.slow
@pytest.mark.parametrize("k", range(1, 8))
def test_base_k_period_bound_up_to_300(k: int) -> None:
    for n in range(2, 301):
        period = TopologyReg.create("base-k", n, 1, k=k).period
        assert period <= base_k_period_bound(n, k), (n, k, period)


def test_base_k_n3_k1_by_hand() -> None:
    # average {0,1}; node 2 keeps 1/3 and takes 2/3 of node 0, which now holds the pair mean,
    # so node 2 holds the mean of all three; average {0,1} again to spread node 0's share
    topo = BaseKTopology(3, 1, k=1)
    assert [as_pairs(r) for r in topo.rounds] == [
        {((0, 1), 0.5), ((2,), 1.0)},
        {((0, 2), round(1 / 3, 12)), ((1,), 1.0)},
        {((0, 1), 0.5), ((2,), 1.0)},
    ]
    x = torch.tensor([3.0, 6.0, 12.0], dtype=torch.float64)
    for w in topo.mixing_matrices():
        x = w @ x
    assert torch.allclose(x, torch.full((3,), 7.0, dtype=torch.float64), atol=ATOL)


def test_base_k_n5_k2_by_hand() -> None:
    # 5 = 3 + 2: {0,1,2} average; 3 and 4 each keep 2/5 and take 3/5 of a block rank;
    # then the block averages again while {3,4} averages for the first time
    topo = BaseKTopology(5, 1, k=2)
    assert [as_pairs(r) for r in topo.rounds] == [
        {((0, 1, 2), round(1 / 3, 12)), ((3,), 1.0), ((4,), 1.0)},
        {((0, 3), 0.4), ((1, 4), 0.4), ((2,), 1.0)},
        {((0, 1, 2), round(1 / 3, 12)), ((3, 4), 0.5)},
    ]


@pytest.mark.parametrize(
    ("n", "k", "period"),
    [(8, 1, 3), (64, 1, 6), (9, 2, 2), (12, 3, 2), (16, 3, 2), (6, 1, 4), (6, 2, 2)],
)
def test_base_k_smooth_and_product_sizes(n: int, k: int, period: int) -> None:
    # sizes that factor into numbers <= k+1 are one hyper-hypercube pass; 6 = 2 x 3 with k=1
    # runs the 3-rank schedule on two rows, then averages the pairs
    assert BaseKTopology(n, 1, k=k).period == period


def test_base_k_power_of_two_is_as_short_as_one_peer_exp() -> None:
    for p in range(1, 8):
        n = 2**p
        one_peer = TopologyReg.create("one-peer-exp", n)
        assert BaseKTopology(n, 1, k=1).period == one_peer.period == p


def test_base_k_default_and_world_size_one() -> None:
    assert TopologyReg.create("base-k", 7).k == 1
    assert BaseKTopology(1, 1, k=3).rounds == [[Edge([0], 1.0)]]


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "2"])
def test_base_k_rejects_bad_k(k: object) -> None:
    with pytest.raises(ValueError, match=r"k=.*integer >= 1"):
        BaseKTopology(4, 1, k=k)  # type: ignore[arg-type]


def test_base_k_edges_are_uniform() -> None:
    # every group keeps the Edge form: W[i][i] = weight, W[i][j] = (1 - weight) / (k - 1)
    for n in (7, 23, 45):
        for k in (1, 2, 3):
            topo = BaseKTopology(n, 1, k=k)
            for r, edges in enumerate(topo.rounds):
                w = topo.mixing_matrix(r)
                for e in edges:
                    for i in e.ranks:
                        for j in e.ranks:
                            want = e.self_weight if i == j else e.peer_weight
                            assert w[i, j].item() == pytest.approx(want, abs=ATOL)


# ---------------------------------------------------------------------------
# local-sgd
# ---------------------------------------------------------------------------


def test_local_sgd_rounds() -> None:
    topo = TopologyReg.create("local-sgd", 4, period=3)
    singles = {((r,), 1.0) for r in range(4)}
    assert [as_pairs(r) for r in topo.rounds] == [singles, singles, {((0, 1, 2, 3), 0.25)}]
    mats = topo.mixing_matrices()
    assert torch.equal(mats[0], torch.eye(4, dtype=torch.float64))
    assert torch.equal(mats[1], torch.eye(4, dtype=torch.float64))
    assert torch.allclose(product(mats), torch.full((4, 4), 0.25, dtype=torch.float64))


def test_local_sgd_default_period_and_h1_is_complete() -> None:
    assert LocalSGDTopology(8, 1).period == 8
    for n in (1, 2, 5, 8):
        h1 = mixing_matrices(LocalSGDTopology(n, 1, period=1), n)
        assert len(h1) == 1
        assert torch.equal(h1[0], mixing_matrices("complete", n)[0])


@pytest.mark.parametrize("period", [0, -3, 2.0, True, None])
def test_local_sgd_rejects_bad_period(period: object) -> None:
    with pytest.raises(ValueError, match=r"period=.*integer >= 1"):
        LocalSGDTopology(4, 1, period=period)  # type: ignore[arg-type]


def test_table_rows_for_local_sgd_and_base_k() -> None:
    for name in ("local-sgd", "base-k"):
        row = describe(name, 24, 4)
        assert "error" not in row, row
        assert row["contraction"] < 1e-9 and row["rate_per_step"] == 1.0
    assert describe("base-k", 24, 4)["peers_per_round"] == 1
    assert describe("local-sgd", 24, 4)["period"] == 8


def test_one_peer_exp_error_points_to_base_k() -> None:
    with pytest.raises(ValueError, match="'base-k'"):
        TopologyReg.create("one-peer-exp", 6)


# ---------------------------------------------------------------------------
# 0.2.x-style custom topologies
# ---------------------------------------------------------------------------


class NodePairs(Topology):
    """Written as for decent-dp 0.2.x: reads _world_size, _local_world_size and _n_nodes."""

    def _get_topo_edges(self) -> list[list[Edge]]:
        local, nodes = self._local_world_size, self._n_nodes
        intra = [Edge(list(range(i * local, (i + 1) * local)), 1.0 / local) for i in range(nodes)]
        inter = [Edge([j * local + i for j in range(nodes)], 1.0 / nodes) for i in range(local)]
        assert nodes * local == self._world_size
        return [intra, inter]


@pytest.mark.parametrize(("n", "local"), [(8, 2), (12, 3), (6, 6)])
def test_v02_style_subclass_sees_sizes(n: int, local: int) -> None:
    topo = NodePairs(n, local)
    assert topo._n_nodes == n // local
    assert torch.allclose(
        product(topo.mixing_matrices()), torch.full((n, n), 1.0 / n, dtype=torch.float64)
    )


def test_v02_style_subclass_reads_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    topo = NodePairs(8)
    assert (topo._world_size, topo._local_world_size, topo._n_nodes) == (8, 4, 2)
