"""The metrics file: one JSON object per line, and a resumed run forgets what it recomputes."""

from __future__ import annotations

import json

import torch

from experiments.train.logger import MetricsLogger, TrainWindow, WindowClock


def test_drop_after_forgets_lines_past_the_checkpoint(tmp_path) -> None:
    logger = MetricsLogger(tmp_path)
    for step in range(1, 11):
        logger.log(
            {"step": step, "epoch": step / 10, "time_s": float(step), "train/loss": 1.0 / step}
        )
    # a crash after step 10 with the last checkpoint at step 6
    logger.close()
    (tmp_path / "metrics.jsonl").open("a").write("not json\n")
    resumed = MetricsLogger(tmp_path)
    assert resumed.drop_after(6) == 4
    resumed.log({"step": 7, "epoch": 0.7, "time_s": 7.5, "train/loss": 0.1})
    resumed.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if line.startswith("{")]
    assert steps == [1, 2, 3, 4, 5, 6, 7]
    assert "not json" in lines  # lines it cannot read are kept, not silently lost


def test_other_ranks_write_nothing(tmp_path) -> None:
    logger = MetricsLogger(tmp_path / "run", enabled=False)
    logger.log({"step": 1})
    assert logger.drop_after(0) == 0
    logger.close()
    assert not (tmp_path / "run").exists()


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
    monkeypatch.setattr("experiments.train.logger.time.perf_counter", lambda: now[0])
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
