"""Time to a loss on an emulated link, from written run folders: full runs plus one link run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.report.link_time import (
    default_target,
    link_name,
    load_arms,
    main,
    page,
    table,
    time_to,
)
from tests.experiments.report.common import write_overrides, write_summary


def _full(path: Path, seed: int, losses: list[float], every: int = 32) -> None:
    path.mkdir(parents=True)
    rows = [{"step": every * (k + 1), "eval/loss": v} for k, v in enumerate(losses)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_summary(path, {"topology": "local-sgd", "seed": seed, "eval/loss": losses[-1]})
    write_overrides(path, [f"train.seed={seed}"])


def _link(path: Path, step_s: list[float], mean: float, peak: float | None) -> None:
    path.mkdir(parents=True)
    rows = [
        {"step": 16 * (k + 1), "perf/step_s": s, "perf/tokens_per_s": 8192 / s}
        for k, s in enumerate(step_s)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"topology": "local-sgd", "comm/bytes_per_step": mean}
    if peak is not None:
        summary["comm/peak_bytes_per_step"] = peak
    write_summary(path, summary)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    # allreduce: better per step, 4x slower per step on the link (the first window is start-up)
    _full(tmp_path / "allreduce-adamw/final/seed0", 0, [5.0, 4.0, 3.5])
    _full(tmp_path / "allreduce-adamw/final/seed1", 1, [5.2, 4.2, 3.7])
    _link(tmp_path / "link/allreduce-adamw", [9.0, 2.0, 2.0, 2.2], 5.6e6, None)
    _full(tmp_path / "streaming/final/seed0", 0, [5.5, 4.4, 3.9])
    _full(tmp_path / "streaming/final/seed1", 1, [5.7, 4.2, 3.9])
    _link(tmp_path / "link/streaming", [7.0, 0.5, 0.5], 3.5e5, 1.4e6)
    # an arm with no link run is left out, as is a link run with no full runs
    _full(tmp_path / "unlinked/final/seed0", 0, [9.0, 9.0, 9.0])
    _link(tmp_path / "link/orphan", [1.0, 1.0], 1.0, 1.0)
    return tmp_path


def test_each_arm_gets_its_median_link_step_time_and_mean_curve(runs: Path) -> None:
    arms = {a.name: a for a in load_arms(runs)}
    assert sorted(arms) == ["allreduce-adamw", "streaming"]
    ar, st = arms["allreduce-adamw"], arms["streaming"]
    assert ar.step_s == pytest.approx(2.0) and st.step_s == pytest.approx(0.5)
    assert ar.curve == [
        (32, pytest.approx(5.1)),
        (64, pytest.approx(4.1)),
        (96, pytest.approx(3.6)),
    ]
    assert st.final == pytest.approx(3.9) and st.final_std == pytest.approx(0.0)
    # a summary without a peak (every step the same) takes the mean as the peak
    assert ar.bytes_peak == 5.6e6 and st.bytes_peak == 1.4e6


def test_time_to_a_loss_is_the_first_evaluation_at_or_below_it_times_the_step_time(
    runs: Path,
) -> None:
    arms = {a.name: a for a in load_arms(runs)}
    assert time_to(arms["allreduce-adamw"], 4.1) == (64, pytest.approx(128.0))
    assert time_to(arms["streaming"], 4.31) == (64, pytest.approx(32.0))
    assert time_to(arms["streaming"], 3.8) is None


def test_the_table_gives_peak_ratio_and_speed_up_against_allreduce(runs: Path) -> None:
    lines = table(load_arms(runs), 3.9)
    rows = {
        c[0]: c[1:] for line in lines[2:] if (c := [x.strip() for x in line.strip("|").split("|")])
    }
    # streaming reaches 3.9 at step 96 (48 s), allreduce at step 96 (192 s): 4x sooner
    assert rows["streaming"][4] == "0.250" and rows["streaming"][-1] == "4.00×"
    assert rows["allreduce-adamw"][-3:] == ["96", "192", "1.00×"]


def test_the_command_writes_table_json_and_plot_with_the_worst_final_as_target(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main([str(runs), "--out", str(out), "--gbps", "0.05", "--latency-ms", "10"]) == 0
    record = json.loads((out / "link_time.json").read_text())
    assert record["target"] == pytest.approx(3.9) and record["link"] == "50 Mb/s, 10 ms"
    assert (out / "link_time.png").stat().st_size > 0
    arms = load_arms(runs)
    text = page(arms, default_target(arms), link_name(0.05, 10))
    assert (out / "link_time.md").read_text() == text
    assert text.startswith("# Time to eval/loss 3.900 on 50 Mb/s, 10 ms\n\n| arm |")
    assert link_name(None, 10) == "the emulated link"


def test_a_directory_without_link_runs_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PART=link" in err[0]
