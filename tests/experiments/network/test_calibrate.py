"""The calibration: line fits, terms from synthetic measurements, the CLI, and a loopback run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from experiments.network import calibrate, netem

SIZES = (16_384, 53_248, 212_992, 851_968)
# per rate: (bits/s, efficiency, collective seconds, CPU ms per MB for each size)
TRUTH = {
    "10mbit": (1e7, 0.9, 3e-3, (90.0, 80.0, 10.0, 12.0)),
    "100mbit": (1e8, 0.8, 1.5e-3, (95.0, 85.0, 14.0, 16.0)),
}
# small payloads are mostly per-call cost: their CPU must not count
LOOPBACK_CPU = (50.0, 60.0, 4.0, 6.0)


def synthetic_rows(truth: dict[str, Any] = TRUTH) -> list[dict[str, Any]]:
    """Rows as ``measure_wire`` and ``measure_loopback`` give them, from a known model."""
    rows: list[dict[str, Any]] = []
    # the faster rate first: summarize must order the rates itself
    for rate, (bps, eff, a, cpu) in sorted(truth.items(), key=lambda kv: -kv[1][0]):
        for size, c in zip(SIZES, cpu):
            t = a + size * 8 / (eff * bps)
            rows.append({"mode": "allreduce-ring", "bytes": size, "world": 4, "median_s": t,
                         "cpu_s": c * size * 1e-9, "cpu_ms_per_mb": c, "where": "wire",
                         "rate": rate, "rate_bps": bps})  # fmt: skip
    for size, c in zip(SIZES, LOOPBACK_CPU):
        rows.append({"mode": "allreduce-ring", "bytes": size, "world": 4, "median_s": 1e-3,
                     "cpu_ms_per_mb": c, "where": "loopback"})  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def calib() -> dict[str, Any]:
    return calibrate.summarize(synthetic_rows())


def test_fit_line_recovers_an_exact_line() -> None:
    a, b = calibrate.fit_line([(1.0, 3.0), (2.0, 5.0), (4.0, 9.0), (4.0, 9.0)])
    assert (a, b) == pytest.approx((1.0, 2.0), abs=1e-12)


@pytest.mark.parametrize("points", [[(1.0, 2.0), (1.0, 3.0)], [(5.0, 1.0)], []])
def test_fit_line_needs_two_distinct_x(points: list[tuple[float, float]]) -> None:
    with pytest.raises(ValueError, match="two distinct sizes"):
        calibrate.fit_line(points)


def test_summarize_recovers_the_model_per_rate(calib: dict[str, Any]) -> None:
    assert list(calib["rates"]) == ["10mbit", "100mbit"]  # by rate, not as measured
    for rate, (bps, eff, a, _) in TRUTH.items():
        got = calib["rates"][rate]
        assert got["rate_bps"] == bps
        assert got["efficiency"] == pytest.approx(eff, rel=1e-9)
        assert got["collective_ms"] == pytest.approx(a * 1e3, rel=1e-9)
        assert got["worst_fit_error"] == pytest.approx(0.0, abs=1e-9)
    assert calib["rows"] == synthetic_rows()
    assert calib["cores"] == os.cpu_count()


def test_summarize_takes_the_cpu_from_bulk_payloads_per_rate(calib: dict[str, Any]) -> None:
    # bulk (>= 212992 B) at 10 Mb/s: 10, 12 -> 11, beyond loopback's 4, 6 -> 6;
    # at 100 Mb/s: 14, 16 -> 15, beyond loopback -> 10
    r10, r100 = calib["rates"]["10mbit"], calib["rates"]["100mbit"]
    assert (r10["comm_cpu_ms_per_mb"], r10["stack_cpu_ms_per_mb"]) == pytest.approx((11.0, 6.0))
    assert (r100["comm_cpu_ms_per_mb"], r100["stack_cpu_ms_per_mb"]) == pytest.approx((15.0, 10.0))
    assert calib["loopback_cpu_ms_per_mb"] == pytest.approx(5.0)


def test_summarize_keeps_the_terms_physical() -> None:
    # faster than the line and a negative intercept: measurement noise, not a faster link
    fast = {"1gbit": (1e9, 1.25, -1e-3, (1.0, 1.0, 1.0, 1.0))}
    got = calibrate.summarize(synthetic_rows(fast))
    assert got["rates"]["1gbit"]["efficiency"] == 1.0
    assert got["rates"]["1gbit"]["collective_ms"] == 0.0
    # loopback dearer than the wire: nothing to burn
    assert got["rates"]["1gbit"]["stack_cpu_ms_per_mb"] == 0.0


def test_nearest_is_on_a_log_scale(calib: dict[str, Any]) -> None:
    assert calibrate.nearest(calib, 5e6)["rate_bps"] == 1e7
    assert calibrate.nearest(calib, 3e7)["rate_bps"] == 1e7
    # 40 Mb/s is nearer 10 Mb/s in a straight line, but 2.5x from 100 against 4x from 10
    assert calibrate.nearest(calib, 4e7)["rate_bps"] == 1e8
    assert calibrate.nearest(calib, 1e9)["rate_bps"] == 1e8


def test_emulator_overrides_and_simulator_terms(calib: dict[str, Any]) -> None:
    assert calibrate.emulator_overrides(calib, 5e6) == [
        "network.latency_ms=0",
        "network.efficiency=0.9000",
        "network.collective_ms=3.0000",
        "network.stack_cpu_ms_per_mb=6.0000",
    ]
    assert calibrate.simulator_terms(calib, 1e8) == pytest.approx(
        {
            "latency_ms": 0.0,
            "efficiency": 0.8,
            "collective_ms": 1.5,
            "comm_cpu_ms_per_mb": 15.0,
            "cores": os.cpu_count(),
        }  # fmt: skip
    )


def test_emulator_overrides_make_a_valid_config(
    calib: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments.train.run import validate
    from tests.support.launch import compose_config

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cfg = compose_config("network=custom", *calibrate.emulator_overrides(calib, 1e7))
    validate(cfg, 4)
    prof = netem.profile_from_cfg(cfg.network)
    assert prof is not None
    assert (prof.efficiency, prof.collective_ms, prof.stack_cpu_ms_per_mb) == (0.9, 3.0, 6.0)


@pytest.mark.parametrize("rate_bps", [1e7, 1e8])
def test_the_calibrated_models_fixed_cost_is_the_fitted_intercept(
    calib: dict[str, Any], rate_bps: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The intercept holds the wire's latency: no hop latency is added on top of it."""
    from experiments.network.sim_links import Link
    from tests.support.launch import compose_config

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    _, eff, intercept_s, _ = TRUTH["10mbit" if rate_bps == 1e7 else "100mbit"]
    cfg = compose_config(
        "network=custom",
        f"network.bandwidth_gbps={rate_bps / 1e9}",
        *calibrate.emulator_overrides(calib, rate_bps),
    )
    prof = netem.profile_from_cfg(cfg.network)
    assert prof is not None
    # the emulator: a pair and a 4-rank ring cost the intercept beyond their bytes
    assert netem.gossip_time(0, 2, prof) == pytest.approx(intercept_s, rel=1e-9)
    assert netem.ring_allreduce_time(0, 4, prof) == pytest.approx(intercept_s, rel=1e-9)
    # and a pair exchange of S bytes is the fitted line itself
    size = 212_992
    line = intercept_s + size * 8 / (eff * rate_bps)
    assert netem.gossip_time(size, 2, prof) == pytest.approx(line, rel=1e-9)
    # the simulator's link from the same terms
    terms = calibrate.simulator_terms(calib, rate_bps)
    link = Link(
        "calibrated",
        rate_bps / 1e9,
        terms["latency_ms"],
        efficiency=terms["efficiency"],
        collective_ms=terms["collective_ms"],
    )
    assert link.ring_s(0, 2) == pytest.approx(intercept_s, rel=1e-9)
    assert link.ring_s(0, 4) == pytest.approx(intercept_s, rel=1e-9)


def test_the_worst_fit_error_counts_a_fit_below_a_measurement() -> None:
    """A measurement above the line (the fit under it) is an error as much as one below."""
    rows = synthetic_rows({"10mbit": TRUTH["10mbit"]})
    wire = [r for r in rows if r["where"] == "wire"]
    wire[0]["median_s"] *= 1.5  # the smallest payload slow: the line passes well below it
    got = calibrate.summarize(rows)["rates"]["10mbit"]
    a, b = calibrate.fit_line([(r["bytes"] * 8 / 1e7, r["median_s"]) for r in wire])
    errors = [(a + b * r["bytes"] * 8 / 1e7) / r["median_s"] - 1 for r in wire]
    assert -min(errors) > max(errors) > 0  # the worst error is the fit below a measurement
    assert got["worst_fit_error"] == pytest.approx(max(abs(e) for e in errors), rel=1e-12)


def test_load_is_none_without_a_calibration(tmp_path: Path, calib: dict[str, Any]) -> None:
    assert calibrate.load(tmp_path) is None
    (tmp_path / "calibration.json").write_text(json.dumps(calib))
    assert calibrate.load(tmp_path) == calib


def test_show_writes_the_page(
    tmp_path: Path, calib: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert calibrate.main(["show", "--out", str(tmp_path)]) == 1
    assert "no calibration.json" in capsys.readouterr().err
    assert not (tmp_path / "calibration.md").exists()

    (tmp_path / "calibration.json").write_text(json.dumps(calib))
    assert calibrate.main(["show", "--out", str(tmp_path)]) == 0
    page = (tmp_path / "calibration.md").read_text()
    assert page == calibrate.markdown(calib)
    assert capsys.readouterr().out.strip() == page.strip()
    assert "| 10mbit | 0.900 | 3.00 | 0.0% | 11.0 | 6.0 |" in page
    assert "| 100mbit | 0.800 | 1.50 | 0.0% | 15.0 | 10.0 |" in page
    assert "(loopback: 5.0 ms)" in page
    assert "| loopback | – | 851,968 | 0.0010 | – | 6.0 |" in page
    # one table line per measured row
    assert sum(line.startswith(("| wire |", "| loopback |")) for line in page.splitlines()) == 12


@pytest.mark.slow
def test_measure_loopback_runs_pairbench_on_four_processes() -> None:
    # torchrun with 4 gloo ranks, twice: tens of seconds on a busy machine
    rows = calibrate.measure_loopback([4096, 8192], reps=2)
    assert [r["bytes"] for r in rows] == [4096, 8192]
    for r in rows:
        assert r["where"] == "loopback" and r["mode"] == calibrate.MODE and r["world"] == 4
        assert r["median_s"] > 0
        assert r["cpu_ms_per_mb"] > 0
        # pairbench's definition: the machine's CPU per MB all ranks sent over reps + 2 rounds
        assert r["cpu_ms_per_mb"] == pytest.approx(r["cpu_s"] * 1e3 / (4 * 4 * r["bytes"] / 1e6))


def test_summarize_without_cpu_readings_and_with_a_flat_line() -> None:
    # no CPU counters and no loopback rows: every CPU term 0; times that do not grow
    # with the payload: no finite efficiency, so the line rate's
    rows = [{"mode": "allreduce-ring", "bytes": s, "world": 4, "median_s": 0.01, "where": "wire",
             "rate": "1mbit", "rate_bps": 1e6} for s in SIZES]  # fmt: skip
    got = calibrate.summarize(rows)
    r = got["rates"]["1mbit"]
    assert r["efficiency"] == 1.0 and r["collective_ms"] == pytest.approx(10.0)
    assert (r["comm_cpu_ms_per_mb"], r["stack_cpu_ms_per_mb"]) == (0.0, 0.0)
    assert got["loopback_cpu_ms_per_mb"] == 0.0


@pytest.mark.parametrize(("bulk_cpu", "comm"), [(0.5, 0.5), (-0.5, 0.0)])
def test_summarize_keeps_a_small_cpu_cost_and_drops_a_negative_one(
    bulk_cpu: float, comm: float
) -> None:
    truth = {"10mbit": (1e7, 0.9, 3e-3, (0.3, 0.3, bulk_cpu, bulk_cpu))}
    rows = [r for r in synthetic_rows(truth) if r["where"] == "wire"]  # no loopback rows
    r = calibrate.summarize(rows)["rates"]["10mbit"]
    assert r["comm_cpu_ms_per_mb"] == comm
    # without loopback's reading the whole cost is beyond loopback
    assert r["stack_cpu_ms_per_mb"] == comm


def test_fit_line_through_two_points() -> None:
    assert calibrate.fit_line([(1.0, 1.0), (2.0, 3.0)]) == pytest.approx((-1.0, 2.0), abs=1e-12)
