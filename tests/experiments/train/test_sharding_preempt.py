"""SIGTERM to a sharded run (2 replicas x 2 shards) under torchrun, and its relaunch.

Every rank saves the checkpoint of an agreed step, its replicas included, and exits
with status 143; the same command relaunched resumes from that checkpoint and ends
bit for bit where an uninterrupted run ends: the same evaluation, and the same
replicas in the final checkpoint (compared through ``dcp_to_torch_save``).
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from experiments.train.checkpoint import latest_checkpoint
from experiments.train.preempt import EXIT_CODE
from experiments.train.sharding import SHARDED_DIR
from tests.support.launch import (
    QUIET,
    finish,
    started,
    torchrun,
    torchrun_args,
    uninterrupted_run,
)
from tests.support.procs import last_step, wait_for, wait_until, worker_pids

EVERY, CHECK, STEPS = 40, 5, 160
JOB = [
    *QUIET,
    "log.every=10",
    "log.consensus_every=0",
    "topology=ring",
    "train.shard_size=2",
    f"train.max_steps={STEPS}",
    f"checkpoint.every_steps={EVERY}",
    f"checkpoint.signal_check_every={CHECK}",
    "dist.timeout_s=60",
]
EVAL_KEYS = ("eval/acc", "eval/acc_local", "eval/loss", "train/loss")


def _replicas(run_dir: Path, out: Path) -> list[dict[str, torch.Tensor]]:
    info = latest_checkpoint(run_dir / "checkpoints")
    assert info is not None and info.step == STEPS
    found = []
    for r in range(2):
        file = out / f"{run_dir.parent.name}-{r}.pt"
        dcp_to_torch_save(info.path / SHARDED_DIR / f"replica-{r}", file)
        found.append(torch.load(file, weights_only=False)["model"])
    return found


@pytest.mark.slow  # three 4-rank torchrun launches
def test_sigterm_saves_the_replicas_and_the_relaunch_is_exact(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    clean = uninterrupted_run(tmp_path_factory, 4, JOB, timeout=300)
    run_dir = tmp_path / "run"
    with started(torchrun_args(4, *JOB, f"hydra.run.dir={run_dir}")) as agent:
        wait_for(f"checkpoints/step_{EVERY:09d}/index.json", run_dir, agent, 200)
        metrics = run_dir / "metrics.jsonl"
        wait_until(lambda: last_step(metrics) > EVERY, 200, f"a step after {EVERY}", agent)
        os.kill(worker_pids(agent.pid, 4)[1], signal.SIGTERM)
        output = finish(agent, 200)
    assert agent.returncode != 0, output[-4000:]
    stopped = latest_checkpoint(run_dir / "checkpoints")
    assert stopped is not None, output[-4000:]
    assert EVERY < stopped.step < STEPS and stopped.step % CHECK == 0, stopped.step
    assert stopped.meta["sharded"]["replicas"] == 2 and stopped.meta["sharded"]["shards"] == 2
    assert f"stopping at step {stopped.step} on SIGTERM" in output
    codes = re.findall(r"rank\s*:\s*\d+ \(local_rank.*\n\s*exitcode\s*:\s*(-?\d+)", output)
    assert codes and set(codes) == {str(EXIT_CODE)}, output[-4000:]

    again = torchrun(4, *JOB, f"hydra.run.dir={run_dir}", timeout=300)
    assert again.returncode == 0, again.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    reference = json.loads((clean / "summary.json").read_text())
    assert summary["resumed_from_step"] == stopped.step
    for key in EVAL_KEYS:
        assert summary[key] == reference[key], key
    for mine, theirs in zip(_replicas(run_dir, tmp_path), _replicas(clean, tmp_path), strict=True):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            torch.testing.assert_close(mine[key], value, rtol=0, atol=0)
