"""``fault_tolerance=torchft`` with ``checkpoint.every_steps``: a whole-job restart resumes.

Two hosts (threads of one process, each running ``run(cfg)`` as its own ``torchrun``
would) train 6 steps, saving at steps 3 and 6. Then every host "dies" after step 3's
save (step 6's checkpoints are removed) and the job starts again: each host resumes
from its own step-3 checkpoint (nobody is ahead, so nobody heals) and ends at exactly
the parameters of the uninterrupted run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from experiments.train.checkpoint import checkpoint_dir, latest_checkpoint, load_shard

pytest.importorskip("torchft")

from tests.support.elastic_hosts import run_hosts  # noqa: E402

HOSTS = ("h0", "h1")


def _job(run_dir: Path) -> dict[str, Any]:
    """Both hosts, 6 steps, a checkpoint every 3, on a fresh lighthouse."""
    out = run_hosts(run_dir, "checkpoint.every_steps=3", hosts=HOSTS)
    for rid in HOSTS:
        assert not isinstance(out[rid], BaseException), out[rid]
    return out


def _quorum_lines(run_dir: Path, rid: str) -> list[dict[str, Any]]:
    text = (run_dir / rid / "metrics.jsonl").read_text()
    return [x for x in map(json.loads, text.splitlines()) if "elastic/members" in x]


@pytest.mark.slow  # two whole jobs of two hosts
def test_a_whole_job_restart_resumes_each_host_from_its_own_checkpoint(tmp_path: Path) -> None:
    first = _job(tmp_path)
    saved: dict[str, dict[str, Any]] = {}
    final: dict[str, dict[str, Any]] = {}
    distances: dict[str, list[float]] = {}
    for rid in HOSTS:
        root = tmp_path / rid / "checkpoints"
        assert first[rid]["resumed_from_step"] is None
        assert [info.step for info in [latest_checkpoint(root)] if info] == [6]
        saved[rid] = load_shard(latest_checkpoint(root) or pytest.fail("no checkpoint"), 0)
        final[rid] = saved[rid]
        distances[rid] = [x["consensus/distance"] for x in _quorum_lines(tmp_path, rid)]
        # every host dies after step 3's checkpoint: step 6's is lost
        shutil.rmtree(checkpoint_dir(root, 6))
        step3 = latest_checkpoint(root)
        assert step3 is not None and step3.step == 3
        saved[rid] = load_shard(step3, 0)
        assert saved[rid]["training"]["training"]["step"] == 3 and saved[rid]["step"] == 3
        (tmp_path / rid / "metrics.jsonl").unlink()
    # the two hosts' models differ at step 3 (ring gossip, their own data)
    h0, h1 = (list(saved[rid]["model"].values()) for rid in HOSTS)
    assert not all(torch.equal(a, b) for a, b in zip(h0, h1))

    second = _job(tmp_path)
    for rid in HOSTS:
        summary = second[rid]
        assert summary["resumed_from_step"] == 3 and summary["steps"] == 6
        # nobody was ahead at the first quorum (both at step 3): each kept its own state
        assert summary["changes"][0]["step"] == 3
        assert summary["changes"][0]["healed_from"] is None
        quorums = _quorum_lines(tmp_path, rid)
        assert [x["step"] for x in quorums] == [4]  # the first quorum is the run's second
        assert [x["consensus/distance"] for x in quorums] == distances[rid][1:]
        info = latest_checkpoint(tmp_path / rid / "checkpoints")
        assert info is not None and info.step == 6
        end = load_shard(info, 0)
        assert end["step"] == final[rid]["step"] == 6
        assert end["model"].keys() == final[rid]["model"].keys()
        for name, value in end["model"].items():
            assert torch.equal(value, final[rid]["model"][name]), name
        training, before = end["training"]["training"], final[rid]["training"]["training"]
        assert training["schedulers"] == before["schedulers"]
        assert training["step"] == before["step"] == 6
