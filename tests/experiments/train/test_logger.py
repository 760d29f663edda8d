"""The metrics file: one JSON object per line, and a resumed run forgets what it recomputes."""

from __future__ import annotations

import json

from experiments.train.logger import MetricsLogger


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
