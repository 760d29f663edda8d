"""Scale simulation: hand-computed transfer times, limits of the Monte Carlo, calibration, CLI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from decent_dp.topo import TopologyReg
from experiments.network import simulate as sim
from experiments.network.sim_config import load_config, profiles
from experiments.network.sim_model import (
    MB,
    Cluster,
    Jitter,
    Link,
    MonteCarlo,
    Workload,
    bucket_sizes,
    collective_s,
    fit_efficiency,
    simulate_allreduce,
    simulate_gossip,
)
from experiments.network.sim_report import format_calibration

ROOT = Path(__file__).resolve().parents[3]
S = 100e6  # bytes per exchange
ETH = Link("eth", 25.0, 0.02)  # 3.125e9 B/s: S takes 0.032 s; 20 us per hop
FAST = Link("fast", 800.0, 0.001)  # 1e11 B/s, 1 us per hop
PAIR_ETH = 0.032 + 2 * 20e-6
AR8_ETH = 1.75 * 0.032 + 14 * 20e-6


def _cluster(n: int, local: int = 1, net: Link = ETH, start: str = "all") -> Cluster:
    return Cluster(n, local, net, FAST, start)


def _work(compute: float = 0.05, frac: float = 0.5, bucket_mb: float = 1e6) -> Workload:
    return Workload(S, compute, frac, bucket_mb, None)


def _rounds(name: str, n: int, local: int = 1) -> list:
    return TopologyReg.create(name, n, local).rounds


# --- transfer times ------------------------------------------------------------------------


def test_ring_times_match_the_hand_numbers() -> None:
    assert collective_s(S, 2, 2, ETH, FAST) == pytest.approx(PAIR_ETH)
    assert collective_s(S, 8, 8, ETH, FAST) == pytest.approx(AR8_ETH)
    # efficiency 0.5 doubles the wire time only; a per-call cost adds once
    slow = Link("eth", 25.0, 0.02, efficiency=0.5, collective_ms=0.3)
    assert collective_s(S, 2, 2, slow, FAST) == pytest.approx(0.064 + 40e-6 + 0.3e-3)
    # two nodes of four: 2 of the ring's 8 links leave a node, so of a chunk's 14 hops
    # 3.5 cross the network (20 us) and 10.5 stay inside (1 us)
    assert collective_s(S, 8, 2, ETH, FAST) == pytest.approx(1.75 * 0.032 + 70e-6 + 10.5e-6)
    # inside one node only the intra link counts; a group of one costs nothing
    assert collective_s(S, 4, 1, ETH, FAST) == pytest.approx(1.5 * S / 1e11 + 6e-6)
    assert collective_s(S, 1, 1, ETH, FAST) == 0.0
    # four groups sharing a NIC get a quarter of it each
    assert collective_s(S, 2, 2, ETH, FAST, share=4) == pytest.approx(4 * 0.032 + 40e-6)


def test_bucket_sizes_with_and_without_a_small_first_bucket() -> None:
    assert bucket_sizes(60 * MB, 25) == [25 * MB, 25 * MB, 10 * MB]
    assert bucket_sizes(60 * MB, 25, first_mb=1) == [MB, 25 * MB, 25 * MB, 9 * MB]
    assert bucket_sizes(0.5 * MB, 25, first_mb=1) == [0.5 * MB]


# --- limits of the Monte Carlo -------------------------------------------------------------


@pytest.mark.parametrize("buckets", [1, 4])
def test_allreduce_without_jitter_is_the_bucket_pipeline_closed_form(buckets: int) -> None:
    c, frac = 0.05, 0.5
    work = Workload(S, c, frac, S / buckets / MB, None)
    t = simulate_allreduce(work, _cluster(8), MonteCarlo(steps=5, warmup=2)).t_iter_s
    per = 1.75 * 0.032 / buckets + 14 * 20e-6  # its share of the wire, every hop's latency
    # bucket k is ready at k/K of the backward; the link is a FIFO
    finish = max(frac * c * k / buckets + (buckets - k + 1) * per for k in range(1, buckets + 1))
    assert t == pytest.approx((1 - frac) * c + max(frac * c, finish))


def test_many_buckets_reach_the_ideal_overlap_model() -> None:
    """With no jitter, line rate, no per-call cost and fine buckets: c + max(0, T - backward)."""
    c, frac = 0.05, 0.5
    net = Link("eth", 25.0, 0.0)
    work = Workload(S, c, frac, S / 400 / MB, None)
    t = simulate_allreduce(work, _cluster(8, net=net), MonteCarlo(steps=3, warmup=1)).t_iter_s
    ideal = c + max(0.0, 1.75 * 0.032 - frac * c)
    assert t == pytest.approx(ideal, rel=2e-3)


def test_gossip_without_jitter_is_compute_bound_or_link_bound() -> None:
    rounds = _rounds("ring", 8)
    light = simulate_gossip(rounds, _work(0.05), _cluster(8), MonteCarlo(steps=20, warmup=4))
    assert light.t_iter_s == pytest.approx(0.05)
    # pairs cost 0.032 s; at 0.02 s of compute the NIC never rests: one pair per step
    heavy = simulate_gossip(rounds, _work(0.02), _cluster(8), MonteCarlo(steps=20, warmup=4))
    assert heavy.t_iter_s == pytest.approx(PAIR_ETH, rel=1e-9)
    assert heavy.comm_s == pytest.approx(PAIR_ETH)


def test_own_start_rule_equals_all_without_jitter() -> None:
    for name in ("ring", "one-peer-exp"):
        a = simulate_gossip(
            _rounds(name, 8), _work(0.02), _cluster(8), MonteCarlo(steps=12, warmup=6)
        )
        o = simulate_gossip(
            _rounds(name, 8), _work(0.02), _cluster(8, start="own"), MonteCarlo(steps=12, warmup=6)
        )
        assert o.t_iter_s == pytest.approx(a.t_iter_s)
    a = simulate_allreduce(_work(0.02), _cluster(8), MonteCarlo(steps=4))
    o = simulate_allreduce(_work(0.02), _cluster(8, start="own"), MonteCarlo(steps=4))
    assert o.t_iter_s == pytest.approx(a.t_iter_s)


def test_jitter_costs_allreduce_more_than_gossip() -> None:
    """The all-reduce pays the slowest of 32 workers every step; pairs pay much less."""
    work, cluster = _work(0.05, bucket_mb=25), _cluster(32)
    jit = Jitter("lognormal", 0.2)
    ar0 = simulate_allreduce(work, cluster, MonteCarlo(steps=200)).t_iter_s
    ar1 = simulate_allreduce(work, cluster, MonteCarlo(jit, steps=200)).t_iter_s
    rounds = _rounds("one-peer-exp", 32)
    g0 = simulate_gossip(rounds, work, cluster, MonteCarlo(steps=200)).t_iter_s
    g1 = simulate_gossip(rounds, work, cluster, MonteCarlo(jit, steps=200)).t_iter_s
    assert ar1 - ar0 > 1.5 * (g1 - g0) > 0
    # the same seed gives the same numbers
    assert simulate_allreduce(work, cluster, MonteCarlo(jit, steps=200)).t_iter_s == ar1


def test_nic_sharing_slows_node_spanning_rounds() -> None:
    """one-peer-exp, 2 nodes of 4: shifts 1 and 2 stay inside a node; shift 4 sends 4 pairs
    through each NIC at once, so that round's pairs get a quarter of the bandwidth each."""
    rounds = _rounds("one-peer-exp", 8, 4)
    shared = simulate_gossip(
        rounds, _work(0.01), _cluster(8, local=4), MonteCarlo(steps=30, warmup=6)
    )
    cross = 4 * 0.032 + 2 * 20e-6
    assert shared.t_iter_s == pytest.approx((cross + 0.01 + 0.01) / 3)
    # one worker per node: every round is one pair per NIC
    alone = simulate_gossip(
        rounds, _work(0.01), _cluster(8, local=1), MonteCarlo(steps=30, warmup=6)
    )
    assert alone.t_iter_s == pytest.approx(PAIR_ETH)


def test_fit_inverts_the_allreduce_time() -> None:
    work, cluster = _work(0.05, bucket_mb=25), _cluster(8)
    target = simulate_allreduce(work, Cluster(8, 1, ETH.with_efficiency(0.6), FAST)).t_iter_s
    eff, t = fit_efficiency(target, work, cluster)
    assert eff == pytest.approx(0.6, rel=1e-6) and t == pytest.approx(target, rel=1e-9)
    with pytest.raises(ValueError, match="even at line rate"):
        fit_efficiency(0.01, work, cluster)


# --- the paper preset ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def paper() -> tuple:
    cfg = load_config(None, ["preset=paper_transformer_fig6"])
    profs = profiles(cfg)
    return cfg, profs, sim.calibrate(cfg, profs)


def test_preset_reproduces_its_fitted_point_and_predicts_infiniband(paper: tuple) -> None:
    _, profs, rows = paper
    fitted = [r for r in rows if r["role"] == "fitted"]
    assert [(r["profile"], r["method"]) for r in fitted] == [("a40_ethernet_25g", "allreduce")]
    assert fitted[0]["predicted_ms"] == pytest.approx(188.5, rel=1e-6)
    eff = profs[0].network.efficiency
    assert 0 < eff <= 1 and profs[1].network.efficiency == 0.9  # InfiniBand is not fitted
    for r in rows:
        if r["profile"].startswith("a100"):
            assert abs(r["error"]) <= 0.2, r


def test_ethernet_default_efficiency_is_the_fitted_one(paper: tuple) -> None:
    _, profs, _ = paper
    base = load_config()
    assert base.links.ethernet_25g.efficiency == pytest.approx(
        profs[0].network.efficiency, abs=5e-4
    )


def test_ethernet_gossip_respects_the_line_rate_bound(paper: tuple) -> None:
    """Each node spends every other step in an 8-rank ring over 2 nodes: at least half of
    1.75 * S / B per step, the physical floor that the measured 67.9 ms lies under."""
    cfg, _, rows = paper
    (aer,) = [r for r in rows if r["profile"].startswith("a40") and r["method"] != "allreduce"]
    floor_ms = 0.5 * 1.75 * float(cfg.model_bytes) / (25e9 / 8) * 1e3
    assert aer["predicted_ms"] > floor_ms > aer["measured_ms"]


def test_calibration_table_lists_every_point_and_the_ratios(paper: tuple) -> None:
    cfg, _, rows = paper
    text = format_calibration(rows, cfg)
    assert text.startswith("# Calibration: Wang et al.")
    assert "| a40_ethernet_25g | 32 | allreduce | 188.5 | 188.5 | +0.0% | fitted" in text
    assert text.count("| predicted |") == 3 and text.count("| ratio |") == 2
    assert "2.78x" in text and "1.18x" in text


@pytest.mark.slow
def test_preset_cli_starts_with_the_calibration_table(tmp_path: Path) -> None:
    over = ["preset=paper_transformer_fig6", "world_sizes=[32]", "topologies=[ring]"]
    assert sim.main(["--out", str(tmp_path), *over]) == 0
    text = (tmp_path / "simulate.md").read_text()
    assert text.startswith("# Calibration: Wang et al.")
    data = json.loads((tmp_path / "simulate.json").read_text())
    assert len(data["calibration"]) == 4


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known presets: .*paper_transformer_fig6"):
        load_config(None, ["preset=nope"])


# --- the config and the command line -------------------------------------------------------


def _cfg(**over: object) -> dict:
    cfg = {
        "model": "toy",
        "model_bytes": S,
        "compute_s": 0.05,
        "backward_frac": 0.5,
        "batch_size": 32,
        "bucket_mb": 1000,  # one bucket: the hand numbers below
        "local_world_size": 1,
        "world_sizes": [8],
        "profiles": ["ethernet_25g"],
        "links": {"ethernet_25g": {"efficiency": 1.0, "collective_ms": 0.0}},
        "intra": {"name": "fast", "latency_ms": 0.001, "bandwidth_gbps": 800.0},
        "jitter": {"kind": "none", "cv": 0.0},
        "topologies": ["complete", "ring", "one-peer-exp", "alternating-exp-ring"],
        "spectral_max_n": 1024,
        "mc": {"steps": 12, "warmup": 4, "seed": 0},
    }
    cfg.update(over)
    return cfg


def _row(rows: list[dict], method: str, n: int = 8) -> dict:
    (row,) = [r for r in rows if r["method"] == method and r["n"] == n]
    return row


def test_table_rows_speedups_and_consensus() -> None:
    rows = sim.simulate(_cfg(compute_s=0.02))
    ar, ope = _row(rows, "allreduce"), _row(rows, "one-peer-exp")
    assert ope["t_iter_s"] == pytest.approx(PAIR_ETH)
    assert ope["speedup_vs_allreduce"] == pytest.approx(ar["t_iter_s"] / ope["t_iter_s"])
    assert ar["samples_per_s"] == pytest.approx(8 * 32 / ar["t_iter_s"])
    assert ope["period"] == 3 and ope["rate_per_step"] == 1.0
    ring = _row(rows, "ring")
    assert 0 < ring["rate_per_step"] < 1 and ring["contraction"] > 0
    assert sim.consensus_rate(1e-15, 5) == 1.0 and sim.consensus_rate(0.25, 2) == pytest.approx(0.5)
    one = sim.simulate(_cfg(local_world_size=8))
    assert not _row(one, "alternating-exp-ring")["fits"]
    assert "2 nodes" in _row(one, "alternating-exp-ring")["reason"]


def test_every_registered_topology_is_simulated() -> None:
    rows = sim.simulate(_cfg(topologies=None, world_sizes=[16], local_world_size=4))
    assert {r["method"] for r in rows} == {"allreduce", *TopologyReg.names()}


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"compute_s": 0}, "compute_s=0"),
        ({"backward_frac": 1.5}, "backward_frac=1.5"),
        ({"model_bytes": -3}, "model_bytes=-3"),
        ({"world_sizes": []}, "world_sizes"),
        ({"world_sizes": [8, 0]}, "world_sizes=0"),
        ({"profiles": ["none"]}, "profile 'none'"),
        ({"profiles": ["wifi"]}, "unknown network profile 'wifi'"),
        ({"topologies": ["star"]}, "unknown topology 'star'; known topologies: complete"),
        ({"intra": {"name": "x", "latency_ms": 0.1, "bandwidth_gbps": 0}}, "bandwidth_gbps=0"),
        ({"batch_size": 2.5}, "batch_size=2.5"),
        ({"jitter": {"kind": "gauss", "cv": 0.1}}, "jitter.kind='gauss'"),
        ({"jitter": {"kind": "normal", "cv": -1}}, "jitter.cv=-1"),
        ({"links": {"ethernet_25g": {"efficiency": 1.5}}}, "efficiency=1.5"),
        ({"profiles": [{"name": "ethernet_25g", "bandwidth_gbps": 10}]}, "name=custom"),
        ({"profiles": [{"name": "ethernet_25g", "efficiency": "fit"}]}, "0 all-reduce calibration"),
        ({"mc": {"steps": 0}}, "mc.steps=0"),
    ],
)
def test_bad_inputs_raise_one_line_errors(over: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        sim.simulate(_cfg(**over))
    assert "\n" not in str(info.value)


def test_load_config_overrides_and_unknown_keys(tmp_path: Path) -> None:
    cfg = load_config(None, ["compute_s=0.02", "world_sizes=[8,32]", "intra.latency_ms=0.01"])
    assert cfg.compute_s == 0.02 and list(cfg.world_sizes) == [8, 32]
    assert cfg.intra.latency_ms == 0.01 and cfg.model_bytes == 102228128
    with pytest.raises(ValueError, match="computes_s"):
        load_config(None, ["computes_s=0.02"])
    with pytest.raises(ValueError, match="key=value"):
        load_config(None, ["compute_s"])
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_main_writes_every_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    over = ["world_sizes=[8,16]", "local_world_size=4", "spectral_max_n=16", "mc.steps=8"]
    assert sim.main(["--out", str(out), *over, "topologies=[ring,alternating-exp-ring]"]) == 0
    printed = capsys.readouterr().out
    assert "| n | nodes | allreduce | ring | alternating-exp-ring |" in printed
    assert "Assumptions:" in printed and "# Calibration" not in printed
    for name in ("simulate.md", "simulate.csv", "simulate.json", "consensus_rate.png",
                 "throughput_ethernet_25g.png", "throughput_infiniband_100g.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    with (out / "simulate.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 2 * 3
    data = json.loads((out / "simulate.json").read_text())
    assert data["inputs"]["local_world_size"] == 4 and len(data["rows"]) == len(rows)
    assert any("backward" in a for a in data["assumptions"])


def test_main_reports_bad_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["compute_s=-1"]) == 2
    assert "compute_s=-1" in capsys.readouterr().err


def test_measure_times_a_real_model(tmp_path: Path) -> None:
    from experiments.models import build_model

    over = ["model=small_cnn", "batch_size=8", "measure.image_size=8", "measure.in_channels=1",
            "measure.num_classes=10", "measure.steps=2", "world_sizes=[8]", "mc.steps=4",
            "topologies=[ring]"]  # fmt: skip
    cfg = load_config(None, over)
    compute, nbytes = sim.measure_compute(cfg)
    model = build_model({"name": "small_cnn"}, num_classes=10, in_channels=1, image_size=8)
    assert nbytes == 4 * sum(p.numel() for p in model.parameters())
    assert 0 < compute < 5
    assert sim.main(["--measure", "--out", str(tmp_path), *over]) == 0
    assert "compute measured on this CPU" in (tmp_path / "simulate.md").read_text()


@pytest.mark.slow
def test_runs_as_a_module_on_a_custom_profile(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.network.simulate", "--out", str(tmp_path), "world_sizes=[16]",
         "topologies=[ring]", "mc.steps=8",
         "profiles=[{name: custom, latency_ms: 0.05, bandwidth_gbps: 10}]"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "## custom (10 Gb/s per node, 0.05 ms)" in proc.stdout
    assert (tmp_path / "throughput_custom.png").stat().st_size > 0
