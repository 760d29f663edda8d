"""Crash recovery and never hanging, with real processes, real signals and real gloo groups.

* ``kill -9`` of one worker under ``torchrun --max-restarts=1``: the group restarts,
  resumes from the newest complete checkpoint in the same run directory, and ends
  with the parameters of an uninterrupted run (slow).
* A missing or dead peer is an error within ``dist.timeout_s``, not a hang.
* Half-written checkpoints are skipped on resume; ``checkpoint.keep`` is honoured.
* Resharding starts every worker from the global average, and a crash after it
  resumes the resharded run instead of resharding again.
* A SLURM-style launch (the submitit launcher, run locally) writes into the sweep
  directory chosen at submission, so a requeued job finds its checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from experiments.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
)
from experiments.train.run import run
from tests.support.checkpoints import assert_same_models, models
from tests.support.dist_harness import free_port, run_distributed
from tests.support.launch import (
    QUIET,
    ROOT,
    compose_config,
    finish,
    launch,
    rank_env,
    started,
    torchrun_args,
    uninterrupted_run,
)
from tests.support.procs import wait_for, worker_pids

QUICK = [*QUIET, "log.every=10", "log.consensus_every=0"]


def _compose(*overrides: str) -> DictConfig:
    return compose_config(*QUICK, *overrides)


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("train.py: error")]


# ----------------------------------------------------------------- kill -9 under torchrun

KILL_RUN = [
    *QUICK,
    "topology=one-peer-exp",
    "train.max_steps=300",
    "checkpoint.every_steps=20",
    "checkpoint.keep=2",
    "dist.timeout_s=60",
]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same 4-worker run as the killed one, uninterrupted."""
    return uninterrupted_run(tmp_path_factory, 4, KILL_RUN, timeout=300)


@pytest.mark.slow
def test_kill9_of_a_worker_restarts_resumes_and_matches_a_clean_run(
    clean_run: Path, tmp_path: Path
) -> None:
    victim = 0  # the rank that also writes the indexes, the metrics and the summary
    # no hydra.run.dir: the restarted workers must find the same outputs/<date>/<time> themselves
    args = torchrun_args(4, *KILL_RUN, script=str(ROOT / "train.py"), max_restarts=1)
    with started(args, cwd=tmp_path) as agent:
        index = wait_for("outputs/*/*/checkpoints/step_*/index.json", tmp_path, agent, 240)
        os.kill(worker_pids(agent.pid, 4)[victim], signal.SIGKILL)
        output = finish(agent, 300)
    assert agent.returncode == 0, output[-4000:]

    run_dirs = list(tmp_path.glob("outputs/*/*"))
    assert run_dirs == [index.parents[2]]  # the restart wrote into the first attempt's directory
    summary = json.loads((run_dirs[0] / "summary.json").read_text())
    clean = json.loads((clean_run / "summary.json").read_text())
    assert summary["train/steps"] == 300 and summary["restarts"] == 1
    resumed = summary["resumed_from_step"]
    assert resumed is not None and resumed % 20 == 0 and 20 <= resumed < 300
    assert summary["config_hash"] == clean["config_hash"]
    for key in ("eval/acc", "eval/acc_local", "eval/loss"):
        assert summary[key] == clean[key], key
    killed_final = latest_checkpoint(run_dirs[0] / "checkpoints")
    clean_final = latest_checkpoint(clean_run / "checkpoints")
    assert killed_final is not None and clean_final is not None and killed_final.step == 300
    assert_same_models(killed_final, clean_final)
    assert [info.step for info in list_checkpoints(run_dirs[0] / "checkpoints")] == [280, 300]


# ----------------------------------------------------------------- missing and dead peers


def _lone_rank(
    rank: int, port: int, run_dir: Path, *overrides: str
) -> contextlib.AbstractContextManager[subprocess.Popen]:
    """Rank ``rank`` of two, started without torchrun; its stderr is its output."""
    args = [sys.executable, "train.py", *QUICK, "topology=ring", f"hydra.run.dir={run_dir}"]
    return started(
        [*args, *overrides],
        env=rank_env(rank, 2, port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
def test_a_missing_peer_is_an_error_within_the_timeout(tmp_path: Path) -> None:
    timeout_s = 3
    start = time.monotonic()
    # rank 0 waits for a rank 1 that never comes; another rank 1 waits for a rank 0 that never comes
    ended: dict[int, float] = {}
    errors: dict[int, str] = {}
    with contextlib.ExitStack() as stack:
        procs = {
            rank: stack.enter_context(
                _lone_rank(rank, free_port(), tmp_path / str(rank), f"dist.timeout_s={timeout_s}")
            )
            for rank in (0, 1)
        }
        for rank, proc in procs.items():
            errors[rank] = finish(proc, 120)
            ended[rank] = time.monotonic() - start
    for rank, proc in procs.items():
        assert proc.returncode == 1, errors[rank][-3000:]
        lines = _error_lines(errors[rank])
        assert len(lines) == 1 and f"on rank {rank}:" in lines[0], errors[rank][-3000:]
        assert "timed out" in lines[0].lower(), lines[0]
        # start-up (imports) takes a few seconds; the default timeout would be 1800 s
        assert ended[rank] < timeout_s + 60, ended


@pytest.mark.slow
def test_a_peer_killed_mid_run_is_an_error_not_a_hang(tmp_path: Path) -> None:
    port, timeout_s = free_port(), 10
    common = ["train.max_steps=100000", "checkpoint.every_steps=20", f"dist.timeout_s={timeout_s}"]
    with (
        _lone_rank(0, port, tmp_path, *common) as rank0,
        _lone_rank(1, port, tmp_path, *common) as rank1,
    ):
        wait_for("checkpoints/step_*/index.json", tmp_path, rank0, 120)
        rank1.kill()
        killed = time.monotonic()
        err = finish(rank0, timeout_s + 60)
        waited = time.monotonic() - killed
    assert rank0.returncode == 1, err[-3000:]
    assert len(_error_lines(err)) == 1 and "on rank 0:" in _error_lines(err)[0], err[-3000:]
    assert waited < timeout_s + 30


# ----------------------------------------------------------------- half-written checkpoints


def test_half_written_checkpoints_are_skipped_and_the_resume_is_exact(
    tmp_path: Path, world_of_one: None
) -> None:
    # a constant schedule: the interrupted and the straight run differ only in max_steps
    common = [
        "topology=ring",
        "scheduler=constant",
        "checkpoint.every_steps=3",
        "checkpoint.keep=2",
    ]
    run(_compose(*common, "train.max_steps=9"), run_dir=tmp_path / "straight")
    run(_compose(*common, "train.max_steps=6"), run_dir=tmp_path / "crashed")
    root = tmp_path / "crashed" / "checkpoints"
    good = latest_checkpoint(root)
    assert good is not None and good.step == 6
    shard = good.path / "rank_00000.pt"
    # killed while writing step 9: a temp file and no index
    (root / "step_000000009").mkdir()
    (root / "step_000000009" / "rank_00000.pt.4242.tmp").write_bytes(shard.read_bytes()[:100])
    # killed in a later save after the index but with a truncated shard (a lying filesystem)
    shutil.copytree(good.path, root / "step_000000012")
    index = json.loads((good.path / "index.json").read_text())
    index["step"] = 12
    (root / "step_000000012" / "index.json").write_text(json.dumps(index))
    truncated = root / "step_000000012" / "rank_00000.pt"
    truncated.write_bytes(truncated.read_bytes()[:-10])

    summary = run(_compose(*common, "train.max_steps=9"), run_dir=tmp_path / "crashed")
    assert summary["resumed_from_step"] == 6 and summary["train/steps"] == 9
    straight = latest_checkpoint(tmp_path / "straight" / "checkpoints")
    resumed = latest_checkpoint(root)
    assert straight is not None and resumed is not None
    assert_same_models(resumed, straight)
    assert [info.step for info in list_checkpoints(root)] == [6, 9]  # keep=2
    assert not list((root / "step_000000009").glob("*.tmp"))


# ----------------------------------------------------------------- resharding

RESHARD_SOURCE = ["topology=ring", "train.max_steps=4", "checkpoint.every_steps=4"]


def _train_on_rank(rank: int, world_size: int, overrides: list[str], run_dir: str) -> dict:
    torch.set_num_threads(1)
    return run(_compose(*overrides), run_dir=run_dir)


def test_reshard_starts_from_the_global_average_and_a_crash_then_resumes_it(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_dir = tmp_path / "run"
    results = run_distributed(_train_on_rank, 2, RESHARD_SOURCE, str(run_dir), init=False)
    assert [status for status, _ in results] == ["ok", "ok"], results
    source = latest_checkpoint(run_dir / "checkpoints")
    assert source is not None and source.world_size == 2
    shards = models(source)
    assert any(not torch.equal(shards[0][k], shards[1][k]) for k in shards[0])
    average = {
        k: (shards[0][k] + shards[1][k]) / 2 for k in shards[0] if shards[0][k].is_floating_point()
    }

    request.getfixturevalue("world_of_one")
    # lr 0 leaves the parameters where the reshard put them
    resharded = [
        "topology=ring",
        "optim.lr=0",
        "checkpoint.every_steps=1",
        "checkpoint.allow_reshard=true",
    ]
    first = run(_compose(*resharded, "train.max_steps=2"), run_dir=run_dir)
    assert first["resumed_from_step"] == 4 and first["train/steps"] == 2
    after = latest_checkpoint(run_dir / "checkpoints")
    assert after is not None and after.world_size == 1 and after.step == 2
    model = models(after)[0]
    for key, value in average.items():
        torch.testing.assert_close(model[key], value, rtol=0, atol=0)
    # the 2-rank checkpoint moved aside, so it no longer shadows the resharded run's
    assert (run_dir / "checkpoints" / "before_reshard_step4_ws2" / "step_000000004").is_dir()

    # as after a crash: the next launch resumes the resharded run, it does not reshard again
    again = run(_compose(*resharded, "train.max_steps=3"), run_dir=run_dir)
    assert again["resumed_from_step"] == 2 and again["train/steps"] == 3


# ----------------------------------------------------------------- SLURM-style launch


@pytest.mark.slow
def test_submitit_job_writes_into_the_sweep_dir_chosen_at_submission(tmp_path: Path) -> None:
    # a requeued SLURM job re-runs the pickled job; it must land in the same directory
    job = ["-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5", *QUICK]
    job += ["train.max_steps=3", "checkpoint.every_steps=3"]
    proc = launch([sys.executable, str(ROOT / "train.py"), *job], timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sweeps = list(tmp_path.glob("multirun/*/*"))
    assert len(sweeps) == 1, sweeps
    summary = json.loads((sweeps[0] / "0" / "summary.json").read_text())
    assert summary["train/steps"] == 3
    assert latest_checkpoint(sweeps[0] / "0" / "checkpoints") is not None
