"""Scale simulation: hand-computed iteration times, consensus rates and the command line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments import simulate as sim
from experiments.netem import PROFILES

ROOT = Path(__file__).resolve().parent.parent
S = 100e6  # bytes per exchange
# 25 Gb/s = 3.125e9 B/s, 20 us: a pair moves S in 0.032 s + 2 * 20 us.
PAIR_ETH = 0.032 + 40e-6
# Ring all-reduce over 8: 2*7/8 * 0.032 + 14 * 20 us.
AR8_ETH = 1.75 * 0.032 + 14 * 20e-6
# Intra-node: 800 Gb/s = 1e11 B/s, 1 us.
INTRA = {"name": "fast", "latency_ms": 0.001, "bandwidth_gbps": 800.0}


def _cfg(**over: object) -> dict:
    cfg = {
        "model": "toy",
        "model_bytes": S,
        "compute_s": 0.05,
        "backward_frac": 0.5,
        "batch_size": 32,
        "local_world_size": 1,
        "world_sizes": [8],
        "profiles": ["ethernet_25g"],
        "intra": INTRA,
        "topologies": ["complete", "ring", "one-peer-exp", "alternating-exp-ring"],
        "spectral_max_n": 1024,
    }
    cfg.update(over)
    return cfg


def _row(rows: list[dict], method: str, n: int = 8, profile: str = "ethernet_25g") -> dict:
    (row,) = [r for r in rows if r["method"] == method and r["n"] == n and r["profile"] == profile]
    return row


def test_profiles_match_the_hand_numbers() -> None:
    eth = PROFILES["ethernet_25g"]
    assert (eth.latency_ms, eth.bandwidth_gbps) == (0.02, 25.0)


def test_one_node_per_worker_allreduce_and_one_peer_exp() -> None:
    rows = sim.simulate(_cfg())
    ar = _row(rows, "allreduce")
    # DDP hides T_ar behind the backward half of compute: 0.05 + (T_ar - 0.025).
    assert ar["comm_s"] == pytest.approx(AR8_ETH)
    assert ar["t_iter_s"] == pytest.approx(0.05 + AR8_ETH - 0.025)
    assert ar["samples_per_s"] == pytest.approx(8 * 32 / (0.05 + AR8_ETH - 0.025))
    ope = _row(rows, "one-peer-exp")
    # Every round is 4 pairs across 8 nodes, each NIC used once: 0.03204 s < compute.
    assert ope["comm_s"] == pytest.approx(PAIR_ETH)
    assert ope["t_iter_s"] == pytest.approx(0.05)
    assert ope["speedup_vs_allreduce"] == pytest.approx((0.05 + AR8_ETH - 0.025) / 0.05)
    assert ope["period"] == 3 and ope["rate_per_step"] == 1.0
    # complete is one all-reduce, overlapped with the whole step.
    assert _row(rows, "complete")["t_iter_s"] == pytest.approx(max(0.05, AR8_ETH))
    # L = 1 gives 8 nodes of one worker: alternating-exp-ring needs L >= 1 per node, fits.
    assert _row(rows, "alternating-exp-ring")["fits"]


def test_communication_bound_iteration() -> None:
    rows = sim.simulate(_cfg(compute_s=0.02))
    assert _row(rows, "allreduce")["t_iter_s"] == pytest.approx(0.02 + AR8_ETH - 0.01)
    assert _row(rows, "one-peer-exp")["t_iter_s"] == pytest.approx(PAIR_ETH)


def test_two_nodes_share_their_nic_and_use_fast_intra_links() -> None:
    rows = sim.simulate(_cfg(local_world_size=4))
    intra_pair = S / 1e11 + 2e-6
    intra_four = 1.5 * S / 1e11 + 6e-6
    # one-peer-exp: shifts 1 and 2 stay inside a node; shift 4 sends 4 pairs through each NIC.
    cross = 4 * 0.032 + 40e-6
    ope = _row(rows, "one-peer-exp")
    assert ope["comm_s"] == pytest.approx((2 * intra_pair + cross) / 3)
    assert ope["t_iter_s"] == pytest.approx((0.05 + 0.05 + cross) / 3)
    # alternating-exp-ring: one intra round (groups of 4), one inter round (all 8, one ring).
    aer = _row(rows, "alternating-exp-ring")
    assert aer["comm_s"] == pytest.approx((intra_four + AR8_ETH) / 2)
    assert aer["t_iter_s"] == pytest.approx((0.05 + AR8_ETH) / 2)
    assert aer["period"] == 2 and aer["rate_per_step"] == 1.0
    # The all-reduce spans both nodes: the network ring, one crossing per NIC.
    assert _row(rows, "allreduce")["t_iter_s"] == pytest.approx(0.05 + AR8_ETH - 0.025)
    # A single node: everything is intra-node; alternating-exp-ring does not fit.
    one = sim.simulate(_cfg(local_world_size=8))
    assert _row(one, "allreduce")["comm_s"] == pytest.approx(1.75 * S / 1e11 + 14e-6)
    assert not _row(one, "alternating-exp-ring")["fits"]
    assert "2 nodes" in _row(one, "alternating-exp-ring")["reason"]


def test_ring_rate_matches_an_independent_product() -> None:
    rows = sim.simulate(_cfg())
    n = 8
    w0, w1 = torch.zeros(n, n, dtype=torch.float64), torch.zeros(n, n, dtype=torch.float64)
    for i in range(0, n, 2):
        for w, j in ((w0, i + 1), (w1, (i - 1) % n)):
            w[i, i] = w[j, j] = w[i, j] = w[j, i] = 0.5
    dev = w1 @ w0 - torch.full((n, n), 1.0 / n, dtype=torch.float64)
    contraction = torch.linalg.matrix_norm(dev, ord=2).item()
    ring = _row(rows, "ring")
    assert ring["contraction"] == pytest.approx(contraction)
    assert ring["rate_per_step"] == pytest.approx(1 - contraction**0.5)
    assert sim.consensus_rate(0.0, 5) == 1.0 and sim.consensus_rate(1e-15, 5) == 1.0
    assert sim.consensus_rate(0.25, 2) == pytest.approx(0.5)


def test_spectral_analysis_is_skipped_above_the_limit() -> None:
    rows = sim.simulate(_cfg(world_sizes=[8, 16], spectral_max_n=8))
    assert _row(rows, "ring", n=8)["rate_per_step"] is not None
    big = _row(rows, "ring", n=16)
    assert big["fits"] and big["rate_per_step"] is None and big["t_iter_s"] > 0


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
    ],
)
def test_bad_inputs_raise_one_line_errors(over: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        sim.simulate(_cfg(**over))
    assert "\n" not in str(info.value)


def test_load_config_overrides_and_unknown_keys(tmp_path: Path) -> None:
    cfg = sim.load_config(None, ["compute_s=0.02", "world_sizes=[8,32]", "intra.latency_ms=0.01"])
    assert cfg.compute_s == 0.02 and list(cfg.world_sizes) == [8, 32]
    assert cfg.intra.latency_ms == 0.01 and cfg.model_bytes == 102228128
    with pytest.raises(ValueError, match="computes_s"):
        sim.load_config(None, ["computes_s=0.02"])
    with pytest.raises(ValueError, match="key=value"):
        sim.load_config(None, ["compute_s"])
    with pytest.raises(ValueError, match="does not exist"):
        sim.load_config(tmp_path / "missing.yaml")


def test_main_writes_every_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    status = sim.main(["--out", str(out), "world_sizes=[8,16,32]", "local_world_size=4"])
    assert status == 0
    printed = capsys.readouterr().out
    assert "| n | nodes | allreduce | complete |" in printed and "Assumptions:" in printed
    for name in ("simulate.md", "simulate.csv", "simulate.json", "consensus_rate.png",
                 "throughput_ethernet_25g.png", "throughput_infiniband_100g.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    with (out / "simulate.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    methods = {r["method"] for r in rows}
    assert {"allreduce", "ring", "one-peer-exp", "alternating-exp-ring"} <= methods
    per_profile = len(methods) * 3
    assert len(rows) == 2 * per_profile
    data = json.loads((out / "simulate.json").read_text())
    assert data["inputs"]["local_world_size"] == 4 and len(data["rows"]) == len(rows)
    assert any("backward_frac" in a for a in data["assumptions"])
    assert (out / "throughput_ethernet_25g.png").read_bytes()[:4] == b"\x89PNG"


def test_main_reports_bad_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["compute_s=-1"]) == 2
    assert "compute_s=-1" in capsys.readouterr().err


def test_measure_times_a_real_model(tmp_path: Path) -> None:
    from experiments.models import build_model

    over = ["model=small_cnn", "batch_size=8", "measure.image_size=8", "measure.in_channels=1",
            "measure.num_classes=10", "measure.steps=2", "world_sizes=[8]"]  # fmt: skip
    cfg = sim.load_config(None, over)
    compute, nbytes = sim.measure_compute(cfg)
    model = build_model({"name": "small_cnn"}, num_classes=10, in_channels=1, image_size=8)
    assert nbytes == 4 * sum(p.numel() for p in model.parameters())
    assert 0 < compute < 5
    assert sim.main(["--measure", "--out", str(tmp_path), *over]) == 0
    assert "measured on this CPU" in (tmp_path / "simulate.md").read_text()


def test_cli_as_a_module(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.simulate", "--out", str(tmp_path), "world_sizes=[16]",
         "profiles=[{name: custom, latency_ms: 0.05, bandwidth_gbps: 10}]"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "## custom (10 Gb/s per node, 0.05 ms)" in proc.stdout
    assert (tmp_path / "throughput_custom.png").stat().st_size > 0
