"""What a metrics line holds: the window on the device, its clock, the history, the lines."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.train.logger import MetricsLogger
from experiments.train.metrics import History, Metrics, TrainWindow, WindowClock
from tests.support.launch import compose_config


def test_train_window_sums_finite_steps_and_remembers_the_first_bad_one() -> None:
    window = TrainWindow(torch.device("cpu"))
    finite = [
        window.add(torch.tensor(0.5), torch.tensor(3), 4, step=1),
        window.add(torch.tensor(float("nan")), torch.tensor(4), 4, step=2),
        window.add(torch.tensor(1.5), torch.tensor(1), 4, step=3),
        window.add(torch.tensor(float("inf")), torch.tensor(4), 4, step=4),
    ]
    assert [bool(f) for f in finite] == [True, False, True, False]
    assert window.state() == {"loss_sum": 2.0, "batches": 2.0, "correct": 4.0, "samples": 8.0}
    assert window.pop_nonfinite() == (2, 2)
    assert window.pop_nonfinite() == (0, None)
    # a checkpoint round trip, then a new window
    other = TrainWindow(torch.device("cpu"))
    other.load_state(window.state())
    assert other.sums().tolist() == [2.0, 2.0, 4.0, 8.0]
    other.reset()
    assert other.state() == dict.fromkeys(TrainWindow.KEYS, 0.0)


def test_window_clock_leaves_host_phases_out(monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr("experiments.train.metrics.time.perf_counter", lambda: now[0])
    clock = WindowClock(torch.device("cpu"))
    clock.start()
    for t in (1.0, 2.0):
        now[0] = t
        clock.tick()
    clock.pause()  # an evaluation from 2 s to 7 s
    now[0] = 7.0
    clock.resume()
    now[0] = 8.0
    clock.tick()
    assert clock.close() == (3.0, 3)
    now[0] = 20.0  # the metrics line took 12 s: the next window starts on resume
    clock.resume()
    now[0] = 21.5
    clock.tick()
    assert clock.close() == (1.5, 1)


def _metrics(*overrides: str) -> Metrics:
    log_cfg = compose_config(*overrides).log
    return Metrics(
        log_cfg, torch.device("cpu"), rank=0, world_size=1, batch_size=8, steps_per_epoch=10
    )


def test_lines_are_due_as_the_log_section_says() -> None:
    metrics = _metrics("log.every=4", "log.consensus_every=6")
    assert [s for s in range(1, 13) if metrics.line_due(s, last=False)] == [4, 8, 12]
    assert metrics.line_due(5, last=True)
    assert [s for s in range(1, 13) if metrics.consensus_due(s)] == [6, 12]
    assert not any(_metrics("log.consensus_every=0").consensus_due(s) for s in range(1, 13))


def test_train_line_sums_the_window_and_starts_a_new_one(group_of_one) -> None:
    metrics = _metrics()
    for loss in (1.0, 3.0):
        metrics.window.add(torch.tensor(loss), torch.tensor(6), 8, step=1)
    line = metrics.train_line(4, seconds=2.0, steps=4, timers={"comm/wait_s": 0.8}, lr=0.05)
    assert line["step"] == 4 and line["epoch"] == 0.4 and line["time_s"] >= 0
    assert line["train/loss"] == 2.0 and line["train/acc"] == 0.75 and line["train/lr"] == 0.05
    assert line["perf/samples_per_s"] == 16.0 and line["perf/step_s"] == 0.5
    assert line["comm/wait_s"] == pytest.approx(0.2)
    assert metrics.history.last_loss == 2.0 and metrics.history.samples_per_s == [16.0]
    assert metrics.window.state() == dict.fromkeys(TrainWindow.KEYS, 0.0)


def test_state_round_trip_continues_the_run() -> None:
    metrics = _metrics()
    metrics.window.add(torch.tensor(0.5), torch.tensor(2), 8, step=1)
    metrics.history = History(samples_per_s=[10.0], consensus=[0.1, 0.3], last_loss=0.5, skipped=2)
    metrics.time_offset = 100.0
    state = metrics.state()
    assert list(state) == ["time_s", "window", "history"] and state["time_s"] >= 100.0
    resumed = _metrics()
    resumed.load_state(state)
    assert resumed.history == metrics.history and resumed.window.state() == metrics.window.state()
    assert resumed.elapsed() >= 100.0
    assert resumed.mean("consensus") == pytest.approx(0.2) and _metrics().mean("consensus") is None


def test_publish_summary_writes_rank_0s_summary(group_of_one, tmp_path) -> None:
    metrics = _metrics()
    metrics.open(MetricsLogger(tmp_path))
    summary = {"eval/acc": 0.5, "eval/acc_local": 0.25, "train/steps": 3, "x": float("nan")}
    published = metrics.publish_summary(summary, tmp_path)
    metrics.close()
    assert published == {**summary, "x": None}
    assert json.loads((tmp_path / "summary.json").read_text()) == published
