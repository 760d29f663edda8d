"""``make bench-sharded``: the peak-memory bench of the wrapper over a device mesh, run small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.bench import sharded_memory


@pytest.mark.slow
def test_the_bench_measures_every_rank_of_every_arm(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--world", "2", "--arms", "1,2,h2", "--steps", "2", "--n-layer", "1", "--n-head", "2"]
    args += ["--n-embd", "32", "--vocab", "64", "--seq", "8", "--out", str(out)]
    assert sharded_memory.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    arms = [("unsharded", 1), ("gossip", 2), ("hsdp", 2)]  # each on ranks 0 and 1
    expected = [(arm, shards, rank) for arm, shards in arms for rank in (0, 1)]
    assert [(r["arm"], r["shards"], r["rank"]) for r in rows] == expected
    assert all(r["peak_mb"] > 0 and r["step_s"] > 0 for r in rows)
    whole = rows[0]["param_bytes"]
    # two shards split the model between them (up to rows FSDP cannot split evenly)
    for arm in (rows[2:4], rows[4:6]):
        halves = [r["param_bytes"] for r in arm]
        assert sum(halves) == whole and max(halves) <= 0.6 * whole
    # gossip keeps a buffer of its shard beside the model state; HSDP does not
    assert rows[2]["comm_bytes"] > 0 and rows[4]["comm_bytes"] == 0
    assert rows[0]["model_params"] == rows[2]["model_params"]


def test_the_table_has_one_row_per_arm() -> None:
    rows = [
        {
            "arm": "gossip",
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
    assert lines[2].startswith("| gossip | 1 x 4 | 10.5, 11.0 | 4.0 |")
    assert lines[3].startswith("| gossip | 2 x 2 | 20.5, 21.0 | 4.0 |")
