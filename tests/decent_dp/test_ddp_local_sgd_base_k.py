"""Real gloo runs of the wrapper with ``local-sgd`` and ``base-k`` against the float64 replay."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from decent_dp.topo import BaseKTopology, LocalSGDTopology, Topology
from tests.support.ddp_cases import replay, train_worker
from tests.support.dist_harness import ok_values, run_distributed

__all__: list[str] = []

ATOL = 1e-9


def check(topology: Topology, world: int, steps: int) -> list[dict[str, Any]]:
    cfg = {"topology": topology, "steps": steps, "kind": "mlp"}
    values = ok_values(run_distributed(train_worker, world, cfg))
    expected = replay(cfg, world)
    for rank, (got, exp) in enumerate(zip(values, expected)):
        assert got["step"] == steps
        assert_close(got["params"], exp, rtol=0, atol=ATOL, msg=lambda m, r=rank: f"rank {r}: {m}")
    return values


@pytest.mark.parametrize("period", [1, 3])
def test_local_sgd_matches_replay(period: int) -> None:
    # 7 steps with H=3: two averaging rounds and one step after the last
    values = check(LocalSGDTopology(4, 4, period=period), 4, 7)
    assert (values[0]["params"] - values[1]["params"]).abs().max() > 1e-4


def test_local_sgd_h1_is_complete_exactly() -> None:
    cfg: dict[str, Any] = {"steps": 5, "kind": "mlp"}
    h1 = ok_values(run_distributed(train_worker, 4, {**cfg, "topology": LocalSGDTopology(4, 4, 1)}))
    full = ok_values(run_distributed(train_worker, 4, {**cfg, "topology": "complete"}))
    for a, b in zip(h1, full):
        assert torch.equal(a["params"], b["params"])


@pytest.mark.parametrize(("world", "k"), [(3, 1), (5, 2)])
def test_base_k_matches_replay(world: int, k: int) -> None:
    check(BaseKTopology(world, world, k=k), world, 6)
