"""The trajectory report on metrics files the test writes."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.report import trajectory


def _run(root: Path, name: str, losses: dict[int, float]) -> Path:
    run = root / name
    run.mkdir()
    lines = [{"step": s, "train/loss": v, "train/update_norm": v / 10} for s, v in losses.items()]
    lines.append({"step": 4, "eval/loss": 9.0})  # an evaluation line: no training keys
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    return run


def test_table_and_plot(tmp_path: Path) -> None:
    a = _run(tmp_path, "seed0", {2: 6.0, 4: 5.0, 6: 4.0})
    b = _run(tmp_path, "seed1", {2: 6.0, 4: 5.9})
    out = tmp_path / "out"
    assert (
        trajectory.main([str(a), str(b), "--out", str(out), "--at", "2,6", "--max-step", "6"]) == 0
    )
    md = (out / "trajectory.md").read_text()
    assert "| seed0 | 6 | 4 |" in md and "| seed1 | 6 | – |" in md
    assert "| seed0 | 0.6 | 0.4 |" in md  # update_norm
    assert (out / "trajectory.png").stat().st_size > 1000
    assert trajectory.series(a, "train/loss", 4) == [(2, 6.0), (4, 5.0)]


def test_missing_run_is_one_line(tmp_path: Path, capsys) -> None:
    assert trajectory.main([str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "no metrics.jsonl in" in capsys.readouterr().err
