"""The simulator's ``compression_ratio``: gossip payloads scale by it, the all-reduce does not."""

from __future__ import annotations

import pytest

from decent_dp.topo import TopologyReg
from experiments.network.sim_config import load_config, profiles
from experiments.network.sim_model import (
    Cluster,
    Link,
    MonteCarlo,
    Workload,
    simulate_allreduce,
    simulate_gossip,
)

S = 100e6
ETH = Link("eth", 25.0, 0.02)  # 3.125e9 B/s: S takes 0.032 s; 20 us per hop
FAST = Link("fast", 800.0, 0.001)
MC = MonteCarlo(steps=20, warmup=4)


def _work(ratio: float) -> Workload:
    return Workload(S, 0.005, 0.5, 1e6, None, ratio)


def test_link_bound_gossip_time_scales_with_the_ratio() -> None:
    rounds = TopologyReg.create("ring", 8, 1).rounds
    cluster = Cluster(8, 1, ETH, FAST)
    for ratio in (1.0, 0.5, 0.25):
        t = simulate_gossip(rounds, _work(ratio), cluster, MC).t_iter_s
        # one pair exchange per step, link-bound: S * ratio / B + 2 hops of latency
        assert t == pytest.approx(0.032 * ratio + 2 * 20e-6, rel=1e-9)
    ar = [simulate_allreduce(_work(r), cluster, MC).t_iter_s for r in (1.0, 0.25)]
    assert ar[0] == ar[1]


def test_config_key_reaches_the_workload_and_is_checked() -> None:
    cfg = load_config(overrides=["compression_ratio=0.25"])
    assert all(p.workload.gossip_ratio == 0.25 for p in profiles(cfg))
    assert all(p.workload.gossip_ratio == 1.0 for p in profiles(load_config()))
    with pytest.raises(ValueError, match="compression_ratio"):
        profiles(load_config(overrides=["compression_ratio=1.5"]))
    with pytest.raises(ValueError, match="compression_ratio"):
        Workload(S, 0.1, 0.5, 25.0, None, 0.0)
