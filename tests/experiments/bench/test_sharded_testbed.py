"""The sharded testbed study's table, from run folders laid out as ``run`` writes them."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.bench import sharded_testbed


def _summary(root: Path, shape: str, arm: str, seed: int, tps: float, loss: float) -> None:
    d = root / shape / arm / f"seed{seed}"
    d.mkdir(parents=True)
    summary = {
        "tokens": 1000,
        "perf/tokens_per_s": tps,
        "eval/loss": loss,
        "comm/bytes_per_step": None if arm == "allreduce" else 2048.0,
        "wire": {"tx_bytes_per_step": 4096.0 * (seed + 1), "rate_bps": 10**8},
    }
    (d / "summary.json").write_text(json.dumps(summary))


def test_the_table_has_one_row_per_shape_and_arm_with_a_band_over_seeds(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed in (0, 1):
        _summary(runs, "2x2", "ring", seed, 100.0 + seed * 10, 5.0 + seed * 0.2)
        _summary(runs, "2x2", "allreduce", seed, 80.0, 5.1)
    out = tmp_path / "out"
    sharded_testbed.main(["table", "--runs", str(runs), "--out", str(out)])
    lines = (out / "study.md").read_text().splitlines()
    assert len(lines) == 4
    assert lines[2] == "| 2x2 | ring | 2 | 1000 | 105 ± 7.1 | 6144 ± 2.9e+03 | 2048 | 5.1 ± 0.14 |"
    assert lines[3] == "| 2x2 | allreduce | 2 | 1000 | 80 ± 0 | 6144 ± 2.9e+03 | - | 5.1 ± 0 |"
    assert len(json.loads((out / "study.json").read_text())) == 4
