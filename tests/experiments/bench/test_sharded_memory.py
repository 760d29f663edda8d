"""``make bench-sharded``: the peak-memory bench of the wrapper over a device mesh, run small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.bench import sharded_memory


@pytest.mark.slow
def test_the_bench_measures_every_rank_of_every_arm(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--world", "2", "--shards", "1,2", "--steps", "2", "--n-layer", "1", "--n-head", "2"]
    args += ["--n-embd", "32", "--vocab", "64", "--seq", "8", "--out", str(out)]
    assert sharded_memory.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["shards"], r["rank"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(r["peak_mb"] > 0 and r["step_s"] > 0 for r in rows)
    whole = rows[0]["param_bytes"]
    # two shards split the model between them (up to rows FSDP cannot split evenly)
    halves = [r["param_bytes"] for r in rows[2:]]
    assert sum(halves) == whole and max(halves) <= 0.6 * whole
    assert rows[0]["model_params"] == rows[2]["model_params"]


def test_the_table_has_one_row_per_arm() -> None:
    rows = [
        {
            "shards": s,
            "replicas": 4 // s,
            "rank": r,
            "peak_mb": 10.0 * s + r,
            "step_s": 0.1,
            "param_bytes": 2**20,
            "optim_bytes": 2**21,
            "comm_bytes": 2**20,
        }
        for s in (1, 2)
        for r in range(2)
    ]
    lines = sharded_memory.table(rows).splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| 1 x 4 | 10.5, 11.0 | 4.0 |")
    assert lines[3].startswith("| 2 x 2 | 20.5, 21.0 | 4.0 |")
