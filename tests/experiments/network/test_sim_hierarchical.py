"""The simulator's ``hierarchical`` topology: three phases, one model per NIC per step."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from decent_dp.topo import TopologyReg
from experiments.network import simulate as sim
from experiments.network.sim_config import profiles
from experiments.network.sim_model import (
    Cluster,
    Link,
    MonteCarlo,
    Workload,
    simulate_gossip,
)
from tests.experiments.network.test_simulate import _cfg as simulate_cfg
from tests.experiments.network.test_simulate import _row

S = 100e6  # bytes per exchange, one bucket
ETH_B = 25e9 / 8  # the ethernet_25g profile at efficiency 1: 3.125e9 B/s, 20 us per hop
ETH_HOP = 20e-6
FAST_B = 800e9 / 8  # the intra-node link: 1e11 B/s, 1 us per hop
FAST_HOP = 1e-6


def _cfg(**over: object) -> dict:
    """:mod:`test_simulate`'s toy config on nodes of 2, with compute far below the transfers."""
    cfg = simulate_cfg(
        compute_s=0.005,  # the step is the exchange
        local_world_size=2,
        world_sizes=[4],
        topologies=["one-peer-exp", "hierarchical"],
        hierarchical_inter="one-peer-exp",
    )
    cfg.update(over)
    return cfg


def test_two_nodes_of_two_match_the_hand_computation() -> None:
    rows = sim.simulate(_cfg())
    row = _row(rows, "hierarchical", 4)
    # reduce-scatter inside the node: 1 hop, half of S over the intra link; all-gather alike
    side = FAST_HOP + 0.5 * S / FAST_B
    # each local rank all-reduces S/2 with its partner node: 2 hops; two chunks share the NIC
    across = 2 * ETH_HOP + 2 * (1 / 2) * (S / 2) * 2 / ETH_B
    assert across == pytest.approx(S / ETH_B + 2 * ETH_HOP)  # one model's worth per NIC
    assert row["fits"] and row["period"] == 1
    assert row["t_iter_s"] == pytest.approx(side + across + side, rel=1e-12)
    assert row["comm_s"] == pytest.approx(side + across + side, rel=1e-12)
    # before the three phases the edge was timed as one ring of 4 over the NIC
    assert row["t_iter_s"] != pytest.approx(2 * 3 / 4 * S / ETH_B + 6 * ETH_HOP * 2 / 4, rel=1e-3)


def test_beats_flat_one_peer_exp_when_the_network_is_the_bottleneck() -> None:
    rows = sim.simulate(_cfg(local_world_size=8, world_sizes=[16, 32, 64]))
    for n in (16, 32, 64):
        hier, flat = _row(rows, "hierarchical", n), _row(rows, "one-peer-exp", n)
        # flat: 8 pairs of ranks cross each NIC in a round across nodes (8 models)
        assert hier["t_iter_s"] < 0.5 * flat["t_iter_s"], n
        assert hier["peak_comm_s"] < flat["peak_comm_s"] / 4, n
        # one model per NIC between nodes, plus the two phases inside the node
        side = 7 * FAST_HOP + 7 / 8 * S / FAST_B
        assert hier["t_iter_s"] == pytest.approx(2 * side + S / ETH_B + 2 * ETH_HOP, rel=1e-9)


def test_nic_is_held_only_between_the_phases_inside_the_nodes() -> None:
    # a slow intra-node link: phases 1 and 3 of one bucket overlap phase 2 of another
    slow_intra = Link("slow", 200.0, 0.001)
    net = Link("eth", 25.0, 0.02)
    cluster = Cluster(4, 2, net, slow_intra)
    work = Workload(S, 1e-4, 1.0, 10.0, None)  # ten buckets ready at once
    rounds = TopologyReg.create("hierarchical", 4, 2).rounds
    mc = MonteCarlo(steps=8, warmup=4)
    three = simulate_gossip(rounds, work, cluster, mc, three_phase=True)
    # NIC-bound: the ten buckets' phases 2 back to back, 1 and 3 hidden beside them
    assert three.t_iter_s == pytest.approx(S / ETH_B + 10 * 2 * ETH_HOP, rel=1e-9)
    assert three.t_iter_s < 0.95 * three.comm_s  # less than the buckets' phases in a row
    flat = simulate_gossip(rounds, work, cluster, mc)
    assert flat.comm_s != pytest.approx(three.comm_s)


def test_inter_topology_and_refusals() -> None:
    ring = sim.simulate(_cfg(world_sizes=[16], hierarchical_inter="ring"))
    assert _row(ring, "hierarchical", 16)["period"] == 2  # a ring of 8 nodes
    ope = sim.simulate(_cfg(world_sizes=[16]))
    assert _row(ope, "hierarchical", 16)["period"] == 3  # one-peer-exp over 8 nodes
    with pytest.raises(ValueError, match="hierarchical_inter='nope'"):
        sim.simulate(_cfg(hierarchical_inter="nope"))
    # compressed: only phase 2 shrinks; edges of more than two nodes are refused, as the
    # wrapper refuses them
    rows = sim.simulate(_cfg(compression_ratio=0.5))
    side = FAST_HOP + 0.5 * S / FAST_B
    across = 2 * ETH_HOP + 0.5 * S / ETH_B
    assert _row(rows, "hierarchical", 4)["t_iter_s"] == pytest.approx(2 * side + across, rel=1e-12)
    wide = _cfg(world_sizes=[8], compression_ratio=0.5, hierarchical_inter="complete")
    row = _row(sim.simulate(wide), "hierarchical", 8)
    assert not row["fits"] and "edges of 4 nodes" in row["reason"]
    point = {"profile": "ethernet_25g", "n": 8, "method": "hierarchical", "measured_ms": 40.0}
    with pytest.raises(ValueError, match="compression_ratio=0.5"):
        cfg = OmegaConf.create({**wide, "calibration": [point]})
        sim.calibrate(cfg, profiles(cfg))


def test_appears_in_the_default_topology_list() -> None:
    rows = sim.simulate(_cfg(topologies=None, world_sizes=[16], local_world_size=8))
    assert _row(rows, "hierarchical", 16)["fits"]
