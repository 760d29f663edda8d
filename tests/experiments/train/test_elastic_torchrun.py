"""``fault_tolerance=torchft`` with a host of two processes: two real torchruns of ``train.py``.

Each host is ``torchrun --standalone --nproc_per_node=2 train.py fault_tolerance=torchft ...``,
as the docs launch it; its two processes are one replica group, and the ring runs
over the four processes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchft")

from tests.support import elastic_cases as ec  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # two torchruns of two train.py processes each
def test_two_torchruns_of_two_processes_train_one_ring_of_four(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")

    def host(rid: str, url: str) -> list[str]:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc_per_node", "2", str(ROOT / "train.py")]
        return cmd + [
            "fault_tolerance=torchft",
            f"fault_tolerance.lighthouse={url}",
            f"fault_tolerance.replica_id={rid}",
            "fault_tolerance.min_replicas=2",
            "fault_tolerance.timeout_s=30",
            "fault_tolerance.quorum_every=3",
            "fault_tolerance.host=127.0.0.1",
            "topology=ring",
            "logger=none",
            "train.max_steps=6",
            "log.every=3",
            "checkpoint.on_signal=false",
            f"hydra.run.dir={tmp_path}",
        ]

    for code, out in ec.host_torchruns(host, ("hA", "hB"), cwd=tmp_path, env=env, timeout=240):
        assert code == 0, out[-3000:]
    accs = set()
    for name in ("hA.0", "hA.1", "hB.0", "hB.1"):
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        accs.add(summary["eval/acc"])
        assert summary["steps"] == 6 and summary["members"] == ["hA", "hB"], summary
        lines = [
            json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
        quorums = [x for x in lines if "elastic/members" in x]
        assert [x["step"] for x in quorums] == [1, 4]
        assert quorums[0]["consensus/distance"] == 0.0  # every process starts from rank 0's model
        assert quorums[1]["consensus/distance"] > 0.0  # each its own data since
    assert len(accs) == 1  # the members' average model, the same on every process
