"""The wire study's table from a small hand-written ``runs/`` tree with known step times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from experiments.network import calibrate, wire_table
from tests.experiments.network.test_calibrate import synthetic_rows

MODEL_BYTES = 53_248
STEPS = (4, 8, 12, 16)  # one metrics window every 4 steps
# median step time of every run after its first window (the warm-up, 1 s)
WIRE = {"ring": 0.5, "allreduce": 0.8}
EMULATED = {"ring": 0.45, "allreduce": 0.4}  # 0.9 (within 20%) and 0.5 (a miss)
CALIBRATED = {"ring": 0.55, "allreduce": 0.7}  # 1.1 and 0.875: both within
LOSSES = {"ring": (2.0, 1.0, 0.6, 0.4), "allreduce": (2.0, 1.2, 0.9, 0.7)}
SENT = {"ring": 2 * MODEL_BYTES, "allreduce": 2 * 3 / 4 * MODEL_BYTES}
COMPUTE_S = 0.2


def write_run(path: Path, step_s: float, losses: tuple[float, ...] = (2.0, 1.5, 1.0, 0.5),
              summary: dict[str, Any] | None = None) -> None:  # fmt: skip
    """A kept run: ``summary.json`` and ``metrics.jsonl`` with a warm-up window of 1 s."""
    path.mkdir(parents=True)
    lines = [{"step": s, "perf/step_s": 1.0 if i == 0 else step_s, "train/loss": loss}
             for i, (s, loss) in enumerate(zip(STEPS, losses))]  # fmt: skip
    lines.insert(2, {"step": 8, "eval/acc": 0.5})  # an eval line: no step time, no loss
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (path / "summary.json").write_text(json.dumps(summary or {"train/loss": losses[-1]}))


def make_tree(out: Path, calib: dict[str, Any] | None) -> Path:
    """``runs/digits/4x1`` at 10mbit: ring and allreduce on the wire and emulated twice, a
    failed complete run, and the compute-only run; ``calib`` as ``calibration.json``."""
    shape = out / "runs" / "digits" / "4x1"
    write_run(shape / "compute", COMPUTE_S)
    for arm in ("ring", "allreduce"):
        summary = {"perf/samples_per_s": 100.0 / WIRE[arm], "comm/bytes_per_step": SENT[arm],
                   "comm/peak_bytes_per_step": MODEL_BYTES if arm == "ring" else 4 * MODEL_BYTES,
                   "train/loss": LOSSES[arm][-1],
                   "wire": {"tx_bytes_per_step": 1.05 * SENT[arm], "drops": 0}}  # fmt: skip
        write_run(shape / "10mbit" / arm / "wire", WIRE[arm], LOSSES[arm], summary)
        write_run(shape / "10mbit" / arm / "emulated", EMULATED[arm])
        write_run(shape / "10mbit" / arm / "calibrated", CALIBRATED[arm])
    (shape / "10mbit" / "complete" / "wire").mkdir(parents=True)  # never finished
    if calib is not None:
        (out / "calibration.json").write_text(json.dumps(calib))
    return out


def by_arm(table: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["arm"]: r for r in table}


@pytest.fixture(scope="module")
def calib() -> dict[str, Any]:
    return calibrate.summarize(synthetic_rows())


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory, calib: dict[str, Any]) -> list[dict[str, Any]]:
    return wire_table.rows(make_tree(tmp_path_factory.mktemp("study"), calib))


# A calibration that changes nothing: the line rate, no cost per call, no CPU.
RATE_10 = {"rate_bps": 1e7, "efficiency": 1.0, "collective_ms": 0.0, "worst_fit_error": 0.0,
           "comm_cpu_ms_per_mb": 0.0, "stack_cpu_ms_per_mb": 0.0}  # fmt: skip
NEUTRAL = {"rates": {"10mbit": RATE_10}, "cores": 2}


def test_loss_curve_and_time_to_a_target(tmp_path: Path) -> None:
    write_run(tmp_path / "run", 0.5, (2.0, 1.0, 0.6, 0.4))
    run = wire_table.read_run(tmp_path / "run")
    assert run is not None and run["step_s"] == 0.5 and run["step_cv"] == 0.0
    curve = wire_table.loss_curve(run)
    # 4 steps of 1 s, then 4 steps of 0.5 s per window; the eval line adds nothing
    assert curve == [(4.0, 2.0), (6.0, 1.0), (8.0, 0.6), (10.0, 0.4)]
    assert wire_table.time_to(curve, 0.6) == 8.0
    assert wire_table.time_to(curve, 0.7) == 8.0
    assert wire_table.time_to(curve, 5.0) == 4.0
    assert wire_table.time_to(curve, 0.3) is None
    assert wire_table.read_run(tmp_path / "missing") is None


def test_rows_measure_the_wire(table: list[dict[str, Any]]) -> None:
    rows = by_arm(table)
    assert set(rows) == {"ring", "allreduce", "complete"}
    assert rows["complete"] == {"model": "digits", "hosts": 4, "procs_per_host": 1,
                                "rate": "10mbit", "rate_bps": 10_000_000, "arm": "complete",
                                "failed": True}  # fmt: skip
    ring = rows["ring"]
    assert ring["step_s"] == 0.5 and ring["samples_per_s"] == 200.0
    assert ring["lib_bytes_per_step"] == SENT["ring"]
    assert ring["wire_bytes_per_step"] == 1.05 * SENT["ring"] and ring["drops"] == 0
    # the target is the loss every arm reached: allreduce's best, 0.7
    assert ring["target_loss"] == rows["allreduce"]["target_loss"] == 0.7
    assert ring["time_to_target_s"] == 8.0
    assert rows["allreduce"]["time_to_target_s"] == pytest.approx(4 + 3 * 4 * 0.8)


def test_ratios_are_predicted_over_measured(table: list[dict[str, Any]]) -> None:
    rows = by_arm(table)
    for arm in ("ring", "allreduce"):
        r = rows[arm]
        assert r["emulated_step_s"] == EMULATED[arm]
        assert r["emulated_ratio"] == EMULATED[arm] / WIRE[arm]
        assert r["calibrated_step_s"] == CALIBRATED[arm]
        assert r["calibrated_ratio"] == CALIBRATED[arm] / WIRE[arm]
        for k in ("simulated", "simulated_cal"):
            assert r[f"{k}_step_s"] >= COMPUTE_S - 1e-9  # gossip may hide behind compute
            assert r[f"{k}_ratio"] == r[f"{k}_step_s"] / WIRE[arm]
    # an all-reduce is waited for within the step: a slow link shows
    assert rows["allreduce"]["simulated_step_s"] > COMPUTE_S + 0.01


def test_calibrated_simulation_adds_the_measured_costs(table: list[dict[str, Any]]) -> None:
    # the fixture's calibration: 13 ms of CPU per MB, efficiency 0.9, 3 ms per call at 10 Mb/s
    for r in table:
        if not r.get("failed"):
            assert r["simulated_cal_step_s"] > r["simulated_step_s"], r["arm"]


def test_a_neutral_calibration_leaves_the_simulation_of_pairs_alone(tmp_path: Path) -> None:
    # the calibrated model counts no hop latency: its intercept holds it. An intercept of
    # the line-rate model's two hops of a pair leaves the pairs' arm (ring) alone, and
    # makes a 4-rank all-reduce cheaper by the 4 hops the pair's intercept does not hold
    pair = {**RATE_10, "collective_ms": 2 * calibrate.VETH_LATENCY_MS}
    rows = by_arm(wire_table.rows(make_tree(tmp_path, {**NEUTRAL, "rates": {"10mbit": pair}})))
    ring, allreduce = rows["ring"], rows["allreduce"]
    assert ring["simulated_cal_step_s"] == pytest.approx(ring["simulated_step_s"], abs=1e-9)
    assert allreduce["simulated_cal_step_s"] < allreduce["simulated_step_s"]


def test_the_stack_cpu_is_shared_by_the_cores(tmp_path: Path) -> None:
    cpu_only = {**NEUTRAL, "rates": {"10mbit": {**RATE_10, "comm_cpu_ms_per_mb": 13.0}}}
    ring = by_arm(wire_table.rows(make_tree(tmp_path, cpu_only)))["ring"]
    # ring's gossip hides behind compute, so the step grows by the CPU alone:
    # 13 ms per MB sent, 4 ranks' bytes on 2 cores
    cpu_s = 13e-3 * SENT["ring"] / 1e6 * 4 / 2
    assert ring["simulated_step_s"] == pytest.approx(COMPUTE_S, abs=1e-9)
    assert ring["simulated_cal_step_s"] == pytest.approx(COMPUTE_S + cpu_s, abs=1e-9)


def test_no_calibration_no_calibrated_simulation(tmp_path: Path) -> None:
    rows = by_arm(wire_table.rows(make_tree(tmp_path, None)))
    assert rows["ring"]["simulated_step_s"] is not None
    assert rows["ring"].get("simulated_cal_step_s") is None
    assert rows["ring"]["simulated_cal_ratio"] is None
    # the calibrated emulator's runs do not depend on calibration.json being there
    assert rows["ring"]["calibrated_ratio"] == CALIBRATED["ring"] / WIRE["ring"]


def test_markdown_counts_the_cells_within_20_percent(table: list[dict[str, Any]]) -> None:
    page = wire_table.markdown(table)
    section = page.split("## Within 20% of the wire", 1)[1]
    assert "| emulated | 1 | 2 |" in section
    assert "| emulated, calibrated | 2 | 2 |" in section
    for k, title in (("simulated", "simulated"), ("simulated_cal", "simulated, calibrated")):
        within = sum(1 / 1.2 <= by_arm(table)[a][f"{k}_ratio"] <= 1.2 for a in WIRE)
        assert f"| {title} | {within} | 2 |" in section
    assert "| 10mbit | allreduce |" in page and "0.400 (0.50 **miss**)" in page
    assert "| 10mbit | complete | failed |" in page


def test_write_table_makes_the_files(tmp_path: Path, calib: dict[str, Any]) -> None:
    out = make_tree(tmp_path, calib)
    table = wire_table.write_table(out)
    assert json.loads((out / "table.json").read_text()) == json.loads(json.dumps(table))
    assert (out / "table.md").read_text() == wire_table.markdown(table) + "\n"
    for name in ("loss_vs_time_digits_4x1.png", "step_time_digits_4x1.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_repeats_on_the_wire_give_the_median_and_the_range(tmp_path: Path) -> None:
    out = make_tree(tmp_path, None)
    rel = Path("runs/digits/4x1/10mbit/ring/wire")
    write_run(out / "repeats" / "r1" / rel, 0.7)
    write_run(out / "repeats" / "r2" / rel, 0.6)
    rows = by_arm(wire_table.rows(out))
    ring, allreduce = rows["ring"], rows["allreduce"]
    # 0.5 (the first run), 0.7 and 0.6: the ratio is taken against their median
    assert (ring["step_s"], ring["wire_runs"]) == (0.6, 3)
    assert (ring["step_min_s"], ring["step_max_s"]) == (0.5, 0.7)
    assert ring["emulated_ratio"] == pytest.approx(EMULATED["ring"] / 0.6)
    assert (allreduce["step_s"], allreduce["wire_runs"]) == (WIRE["allreduce"], 1)
    page = wire_table.markdown(list(rows.values()))
    assert "| 0.600 (3 runs, 0.500-0.700) |" in page
