"""The simulator's outer rounds: fragments spread the all-reduces, hand-computed step times."""

from __future__ import annotations

import pytest

from decent_dp.topo import TopologyReg
from experiments.network import simulate as sim
from experiments.network.sim_config import load_config, outer_rounds
from experiments.network.sim_model import (
    MB,
    Cluster,
    Link,
    MonteCarlo,
    OuterRounds,
    Workload,
    simulate_gossip,
)

S = 100e6  # the model, cut in four buckets of 25e6 bytes
SLOW = Link("slow", 10.0, 0.0)  # 1.25e9 B/s, no latency
FAST = Link("fast", 800.0, 0.0)
BUCKET_AR = 1.75 * 25e6 / 1.25e9  # a ring all-reduce of one bucket over 8: 0.035 s
MC = MonteCarlo(steps=8, warmup=8)  # two whole periods after two


def _work() -> Workload:
    # 0.05 s a step: forward 0.025 s, then the four buckets ready every 0.00625 s
    return Workload(S, 0.05, 0.5, 25e6 / MB, None)


def _local_sgd(period: int = 4) -> list:
    return TopologyReg.create("local-sgd", 8, 1, period=period).rounds


def test_one_fragment_is_local_sgds_own_averaging_round() -> None:
    """Under local-sgd with period H, F=1 outer rounds are its averaging rounds."""
    cluster = Cluster(8, 1, SLOW, FAST)
    plain = simulate_gossip(_local_sgd(), _work(), cluster, MC)
    outer = simulate_gossip(_local_sgd(), _work(), cluster, MC, OuterRounds(4))
    assert outer.step_s == plain.step_s
    assert outer.comm_s == pytest.approx(plain.comm_s) and outer.peak_comm_s == plain.peak_comm_s


def test_fragments_hide_the_outer_rounds_behind_the_next_steps() -> None:
    """F=1: the four buckets' all-reduces queue on the NICs at one step and the next waits;
    F=4: one bucket's all-reduce a step, hidden behind the next step's compute."""
    cluster = Cluster(8, 1, SLOW, FAST)
    whole = simulate_gossip(_local_sgd(), _work(), cluster, MC, OuterRounds(4, 1))
    stream = simulate_gossip(_local_sgd(), _work(), cluster, MC, OuterRounds(4, 4))
    # F=1: bucket j ready at 0.025 + 0.00625 (j+1); the NIC ends them at 0.03125 + 0.035 (j+1).
    # The next step needs bucket j at 0.05 + its ready time: 1 waits until 0.10125, then 2
    # and 3 each 0.035 later, so that step ends at 0.17125: 0.12125 s instead of 0.05.
    slow_step = 0.03125 + 4 * BUCKET_AR - 0.05
    assert whole.peak_step_s == pytest.approx(slow_step, rel=1e-9)
    assert whole.t_iter_s == pytest.approx((slow_step + 3 * 0.05) / 4, rel=1e-9)
    assert stream.peak_step_s == pytest.approx(0.05, rel=1e-9)
    assert stream.t_iter_s == pytest.approx(0.05, rel=1e-9)
    # the same bytes over the period; the busiest step moves a quarter of them
    assert whole.comm_s == pytest.approx(stream.comm_s) == pytest.approx(BUCKET_AR)
    assert whole.peak_comm_s == pytest.approx(4 * BUCKET_AR)
    assert stream.peak_comm_s == pytest.approx(BUCKET_AR)


def test_a_fragment_longer_than_a_step_is_not_hidden() -> None:
    """0.1 s of all-reduce per bucket against 0.05 s of compute: the link sets the pace, one
    transfer a step through each NIC (and a little more, as the fragments' buckets become
    ready at different points of the backward pass)."""
    cluster = Cluster(8, 1, Link("slower", 3.5, 0.0), FAST)  # 1.75 * 25e6 / 4.375e8 = 0.1 s
    stream = simulate_gossip(_local_sgd(), _work(), cluster, MC, OuterRounds(4, 4))
    assert 0.1 <= stream.t_iter_s < 0.11


def test_compressed_outer_rounds_scale_their_bytes() -> None:
    cluster = Cluster(8, 1, SLOW, FAST)
    half = simulate_gossip(_local_sgd(), _work(), cluster, MC, OuterRounds(4, 1, 0.5))
    assert half.peak_comm_s == pytest.approx(2 * BUCKET_AR)


def test_config_keys_reach_the_rows_and_are_checked() -> None:
    assert outer_rounds(load_config()) is None
    cfg = load_config(overrides=["outer_every=8", "outer_fragments=4"])
    assert outer_rounds(cfg) == OuterRounds(8, 4, 1.0)
    rows = sim.simulate(
        load_config(
            overrides=[
                "outer_every=4",
                "outer_fragments=2",
                "world_sizes=[8]",
                "topologies=[local-sgd]",
                "mc.steps=8",
                "profiles=[ethernet_25g]",
            ]
        )
    )
    (row,) = [r for r in rows if r["method"] == "local-sgd"]
    assert (row["outer_every"], row["outer_fragments"]) == (4, 2)
    assert row["peak_step_s"] >= row["t_iter_s"] and row["peak_comm_s"] >= row["comm_s"]
    for bad, match in (
        (["outer_every=4", "outer_fragments=3"], "outer_fragments=3 is invalid; it must divide"),
        (["outer_every=0"], "outer_every=0 is invalid"),
        (["outer_every=4", "outer_compression_ratio=2"], "outer_compression_ratio=2"),
    ):
        with pytest.raises(ValueError, match=match) as info:
            outer_rounds(load_config(overrides=bad))
        assert "\n" not in str(info.value)
