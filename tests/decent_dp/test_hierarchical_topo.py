"""Pure-data tests of the ``hierarchical`` topology: no process group is created here.

The reference is the definition, ``W(t) = W_inter(t) ⊗ J_L / L``, built from
the inter-host topology's own matrices with ``torch.kron``.
"""

from __future__ import annotations

import pytest
import torch

from decent_dp.topo import (
    HierarchicalTopology,
    TopologyReg,
    describe,
    main,
    mixing_matrices,
    spectral_gap,
)
from experiments.schema import ConfigError
from experiments.train.run import validate
from tests.support.launch import compose_config

__all__: list[str] = []

# (inter, inter_kwargs, hosts, L): inter topologies with uniform edges at these host counts
CASES = [
    ("one-peer-exp", {}, 1, 4),
    ("one-peer-exp", {}, 2, 4),
    ("one-peer-exp", {}, 4, 2),
    ("one-peer-exp", {}, 8, 4),
    ("complete", {}, 3, 2),
    ("complete", {}, 4, 8),
    ("ring", {}, 4, 2),
    ("ring", {}, 5, 3),
    ("ring", {}, 2, 4),
    ("alternating-exp-ring", {}, 4, 2),
    ("random-matching", {"period": 3, "seed": 1}, 6, 2),
    ("random-matching", {}, 5, 2),
    ("local-sgd", {"period": 3}, 4, 4),
    ("base-k", {"k": 1}, 8, 2),
    ("base-k", {"k": 2}, 6, 2),
    ("one-peer-exp", {}, 8, 1),
]


def case_id(case: tuple) -> str:
    inter, kw, hosts, local = case
    extra = "".join(f"-{k}{v}" for k, v in kw.items())
    return f"{inter}{extra}-{hosts}x{local}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_mixing_matrices_are_the_kronecker_product(case: tuple) -> None:
    inter, kw, hosts, local = case
    n = hosts * local
    topo = TopologyReg.create("hierarchical", n, local, inter=inter, inter_kwargs=kw or None)
    inner = mixing_matrices(inter, hosts, 1, **kw)
    block = torch.full((local, local), 1.0 / local, dtype=torch.float64)
    mats = topo.mixing_matrices()
    assert len(mats) == len(inner) == topo.period
    for w, wi in zip(mats, inner):
        torch.testing.assert_close(w, torch.kron(wi, block), atol=1e-15, rtol=0)
        # every rank of a host holds the same mix (to the rounding of an edge's 1 - w split)
        for h in range(hosts):
            rows = w[h * local : (h + 1) * local]
            torch.testing.assert_close(rows, rows[:1].expand_as(rows), atol=1e-15, rtol=0)


def test_edges_are_unions_of_whole_hosts_by_hand() -> None:
    topo = HierarchicalTopology(8, 2, inter="one-peer-exp")
    rounds = [[(list(e.ranks), e.weight) for e in edges] for edges in topo.rounds]
    assert rounds == [
        [([0, 1, 2, 3], 0.25), ([4, 5, 6, 7], 0.25)],
        [([0, 1, 4, 5], 0.25), ([2, 3, 6, 7], 0.25)],
    ]
    alone = HierarchicalTopology(8, 4, inter="local-sgd", inter_kwargs={"period": 2})
    assert [[(list(e.ranks), e.weight) for e in edges] for edges in alone.rounds] == [
        [([0, 1, 2, 3], 0.25), ([4, 5, 6, 7], 0.25)],  # each host alone: exact inside it
        [(list(range(8)), 0.125)],
    ]
    assert topo.hosts == 4 and alone.hosts == 2


def test_default_inter_and_local_world_size_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    topo = TopologyReg.create("hierarchical", 16)
    assert topo.local_world_size == 4 and topo.inter.name == "one-peer-exp"
    assert topo.period == 2


@pytest.mark.parametrize(
    ("n", "local", "kwargs", "fragments"),
    [
        (8, 3, {}, ["local_world_size=3", "world_size=8", "allowed: 1, 2, 4, 8"]),
        (8, 0, {}, ["local_world_size=0", "allowed: 1, 2, 4, 8"]),
        (6, -2, {}, ["local_world_size=-2", "allowed: 1, 2, 3, 6"]),
        (4, 8, {}, ["local_world_size=8", "allowed: 1, 2, 4"]),
        (8, 2, {"inter": "star"}, ["inter='star'", "one-peer-exp", "base-k", "ring"]),
        (8, 2, {"inter": "hierarchical"}, ["inter='hierarchical'", "known: complete"]),
        (12, 2, {"inter": "one-peer-exp"}, ["inter='one-peer-exp'", "6 hosts", "power-of-two"]),
        (4, 2, {"inter": "alternating-exp-ring", "inter_kwargs": {"oops": 1}}, ["2 hosts", "oops"]),
        (12, 2, {"inter": "base-k"}, ["inter='base-k'", "6 hosts", "non-uniform"]),
    ],
)
def test_bad_arguments_fail_at_construction_in_one_line(
    n: int, local: int, kwargs: dict, fragments: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        TopologyReg.create("hierarchical", n, local, **kwargs)
    text = str(info.value)
    assert "\n" not in text and text.startswith("hierarchical")
    for fragment in fragments:
        assert fragment in text


def test_describe_gives_the_inter_topology_gap_at_the_hosts() -> None:
    row = describe("hierarchical", 64, 8)
    inner = mixing_matrices("one-peer-exp", 8, 1)
    assert row["period"] == 3
    assert row["worst_gap"] == pytest.approx(min(spectral_gap(w) for w in inner), abs=1e-12)
    assert row["contraction"] == pytest.approx(0.0, abs=1e-12)
    ring = HierarchicalTopology(32, 4, inter="ring")
    gaps = [spectral_gap(w) for w in ring.mixing_matrices()]
    assert gaps == pytest.approx(
        [spectral_gap(w) for w in mixing_matrices("ring", 8, 1)], abs=1e-12
    )


def test_topology_table_lists_it_with_its_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--world-size", "64", "--local-world-size", "8"])
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.startswith("| hierarchical |"))
    assert line.split("|")[2].strip() == "3"
    assert "hierarchical: one-peer-exp over 8 hosts of 8 ranks (--inter NAME)" in out


def test_framework_composes_and_validates_it() -> None:
    cfg = compose_config(
        "topology=hierarchical", "topology.kwargs.inter=ring", "topology.local_world_size=2"
    )
    assert cfg.topology.name == "hierarchical" and cfg.topology.kwargs.inter == "ring"
    validate(cfg, 8)
    cfg = compose_config(
        "topology=hierarchical",
        "topology.kwargs.inter=local-sgd",
        "+topology.kwargs.inter_kwargs.period=4",
        "topology.local_world_size=4",
    )
    validate(cfg, 8)
    bad = compose_config("topology=hierarchical", "topology.local_world_size=3")
    with pytest.raises(ConfigError, match="allowed: 1, 2, 4, 8"):
        validate(bad, 8)


def test_topology_table_takes_the_inter_topology(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--world-size", "32", "--local-world-size", "4", "--inter", "ring"])
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.startswith("| hierarchical |"))
    gap = min(spectral_gap(w) for w in mixing_matrices("ring", 8, 1))
    assert line.split("|")[4].strip() == f"{gap:.4f}"
    assert "hierarchical: ring over 8 hosts of 4 ranks (--inter NAME)" in out
