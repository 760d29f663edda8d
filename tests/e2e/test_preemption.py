"""A stop on SIGTERM or the pre-emption signal, with real torchrun workers and real signals.

* ``SIGTERM`` to one worker of two under torchrun: both ranks agree on a step,
  save that step's checkpoint, exit with status 143; a relaunch resumes from that
  checkpoint (not the older periodic one) and ends bit for bit where an
  uninterrupted run ends, and counts ``SLURM_RESTART_COUNT`` in ``restarts`` (the
  relaunch is slow; the stop is fast).
* ``SIGTERM`` to every process of a two-rank job whose loaders read with worker
  processes, as SLURM signals a job step: the loader workers ignore it, the ranks
  save the checkpoint of an agreed step and exit with status 143, and no worker
  outlives them.
* ``SIGUSR2`` to torchrun's agent: with ``PET_SIGNALS_TO_HANDLE`` naming it the
  agent forwards it and the ranks save and exit; without, the agent dies of it and
  leaves its workers training on, unsaved (slow).
* ``SIGUSR2`` under the submitit launcher (run locally, time limit): submitit's
  own handler requeues the job after the checkpoint, and the requeued job resumes (slow).

The SLURM versions of both are in ``tests/e2e/test_slurm.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from experiments.train.checkpoint import latest_checkpoint, list_checkpoints
from experiments.train.preempt import EXIT_CODE
from tests.support.checkpoints import assert_same_models
from tests.support.dist_harness import free_port
from tests.support.launch import (
    QUIET,
    ROOT,
    clean_env,
    finish,
    launch,
    rank_env,
    started,
    torchrun,
    torchrun_args,
    uninterrupted_run,
)
from tests.support.procs import alive, descendants, last_step, wait_for, wait_until, worker_pids

EVERY, CHECK, STEPS = 100, 5, 400
JOB = [
    *QUIET,
    "log.every=10",
    "log.consensus_every=0",
    "topology=ring",
    f"train.max_steps={STEPS}",
    f"checkpoint.every_steps={EVERY}",
    f"checkpoint.signal_check_every={CHECK}",
    "dist.timeout_s=60",
]
LONG = 8000  # steps of one process: longer than the 30 s before submitit's signal
EVAL_KEYS = ("eval/acc", "eval/acc_local", "eval/loss", "train/loss")


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same 2-worker run, uninterrupted."""
    return uninterrupted_run(tmp_path_factory, 2, JOB, timeout=240)


def _past_the_first_checkpoint(run_dir: Path, proc: subprocess.Popen, limit_s: float) -> None:
    """Wait until the run has logged a step after its first periodic checkpoint.

    A signal from then on is agreed on after that checkpoint's step, so the checkpoint
    saved on it is a newer one.
    """
    wait_for(f"checkpoints/step_{EVERY:09d}/index.json", run_dir, proc, limit_s)
    metrics = run_dir / "metrics.jsonl"
    wait_until(lambda: last_step(metrics) > EVERY, limit_s, f"a step after {EVERY}", proc)


def _exit_codes(report: str) -> dict[int, int]:
    """``rank -> exit code`` from torchrun's failure report."""
    found = re.findall(r"rank\s*:\s*(\d+) \(local_rank.*\n\s*exitcode\s*:\s*(-?\d+)", report)
    return {int(rank): int(code) for rank, code in found}


def _sigterm_to_one_worker(tmp_path: Path) -> tuple[Path, Any]:
    """SIGTERM to rank 1 of two under torchrun; both stop at one step. The run and its checkpoint."""
    run_dir = tmp_path / "run"
    with started(torchrun_args(2, *JOB, f"hydra.run.dir={run_dir}")) as agent:
        _past_the_first_checkpoint(run_dir, agent, 120)
        os.kill(worker_pids(agent.pid, 2)[1], signal.SIGTERM)
        output = finish(agent, 120)
    assert agent.returncode != 0, output[-4000:]
    assert _exit_codes(output) == {0: EXIT_CODE, 1: EXIT_CODE}, output[-4000:]
    stopped = latest_checkpoint(run_dir / "checkpoints")
    assert stopped is not None and stopped.world_size == 2, output[-4000:]
    # a complete checkpoint holds both shards: both ranks saved the same step
    assert EVERY < stopped.step < STEPS and stopped.step % CHECK == 0, stopped.step
    assert f"stopping at step {stopped.step} on SIGTERM" in output
    assert not (run_dir / "summary.json").exists()
    return run_dir, stopped


@pytest.mark.slow  # SIGTERM to every process of a step stays fast below; test_preempt checks the agreement
def test_sigterm_to_one_worker_stops_both_at_one_step(tmp_path: Path) -> None:
    _sigterm_to_one_worker(tmp_path)


@pytest.mark.slow  # exact resume is checked fast in-process (tests/experiments/train/test_run.py)
def test_sigterm_to_one_worker_stops_both_at_one_step_and_the_relaunch_is_exact(
    clean_run: Path, tmp_path: Path
) -> None:
    run_dir, stopped = _sigterm_to_one_worker(tmp_path)

    # as a requeued SLURM job would: the same command in the same run directory
    env = clean_env(SLURM_RESTART_COUNT="1")
    again = torchrun(2, *JOB, f"hydra.run.dir={run_dir}", timeout=240, env=env)
    assert again.returncode == 0, again.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    clean = json.loads((clean_run / "summary.json").read_text())
    assert summary["resumed_from_step"] == stopped.step
    assert summary["resumed_from_checkpoint"] == str(stopped.path)
    assert summary["restarts"] == 1 and summary["train/steps"] == STEPS
    for key in EVAL_KEYS:
        assert summary[key] == clean[key], key
    final, clean_final = (latest_checkpoint(d / "checkpoints") for d in (run_dir, clean_run))
    assert final is not None and clean_final is not None and final.step == STEPS
    assert_same_models(final, clean_final)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    resumes = [line for line in lines if "resume/step" in line]
    assert resumes == [resumes[0]] and resumes[0]["resume/step"] == stopped.step
    assert resumes[0]["restarts"] == 1


def _stopped_at(run_dir: Path, output: str, signame: str) -> int:
    """The step both ranks stopped at on ``signame``, whose complete checkpoint is the newest."""
    stops = {int(m) for m in re.findall(rf"stopping at step (\d+) on {signame}", output)}
    assert output.count(f"on {signame};") == 2 and len(stops) == 1, output[-4000:]
    (step,) = stops
    stopped = latest_checkpoint(run_dir / "checkpoints")
    assert stopped is not None and stopped.world_size == 2 and stopped.step == step, output[-4000:]
    assert step > EVERY and step % CHECK == 0, step
    assert "train.py: error" not in output and not (run_dir / "summary.json").exists()
    return step


# ----------------------------------------------------------------- loader workers


def _image_folder(root: Path) -> Path:
    """A tiny ``dataset=imagenet`` folder: 8x8 PNGs, 40 training and 8 test images per class."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 40), ("val", 8)):
        for cls in ("ant", "bee"):
            (root / split / cls).mkdir(parents=True)
            for k in range(count):
                pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / cls / f"{k:02d}.png")
    return root


@pytest.mark.slow  # make test's 5-minute budget
def test_sigterm_to_every_process_of_a_step_with_loader_workers_saves_and_exits(
    tmp_path: Path,
) -> None:
    # each rank is one SLURM task, as under the submitit launcher, and SLURM signals
    # every process of the step: the ranks and their loaders' worker processes
    run_dir, port = tmp_path / "run", free_port()
    job = [*JOB, f"hydra.run.dir={run_dir}", "dataset=imagenet", "model=small_cnn"]
    job += [f"dataset.root={_image_folder(tmp_path / 'images')}", "dataset.image_size=8"]
    job += ["dataset.num_workers=2", "train.batch_size=4", "train.max_steps=100000"]
    args = [sys.executable, "train.py", *job]
    with (
        started(args, env=rank_env(0, 2, port)) as rank0,
        started(args, env=rank_env(1, 2, port), group=rank0.pid) as rank1,
    ):
        _past_the_first_checkpoint(run_dir, rank0, 240)
        loader_workers = descendants(rank0.pid) + descendants(rank1.pid)
        assert len(loader_workers) >= 4, loader_workers  # 2 per rank, more once evaluated
        os.killpg(rank0.pid, signal.SIGTERM)
        output = finish(rank0, 120) + finish(rank1, 120)
    assert (rank0.returncode, rank1.returncode) == (EXIT_CODE, EXIT_CODE), output[-4000:]
    assert "DataLoader worker" not in output, output[-4000:]
    _stopped_at(run_dir, output, "SIGTERM")
    # the loaders shut their workers down as the ranks left
    wait_until(lambda: not any(alive(pid) for pid in loader_workers), 30, "end of the workers")


# ----------------------------------------------------------------- SIGUSR2 and torchrun

# what torchrun's agent handles by default, and the pre-emption signal: PET_ for torch
# with --signals-to-handle, TORCHELASTIC_ for an older one
FORWARD = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"
FORWARD_ENV = {"PET_SIGNALS_TO_HANDLE": FORWARD, "TORCHELASTIC_SIGNALS_TO_HANDLE": FORWARD}


@pytest.mark.slow  # the agent forwarding a signal; the ranks' handling stays fast below
def test_sigusr2_to_torchruns_agent_stops_the_ranks_once_the_agent_forwards_it(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    args = torchrun_args(2, *JOB, f"hydra.run.dir={run_dir}", "train.max_steps=100000")
    with started(args, env=clean_env(**FORWARD_ENV)) as agent:
        _past_the_first_checkpoint(run_dir, agent, 120)
        workers = worker_pids(agent.pid, 2)
        os.kill(agent.pid, signal.SIGUSR2)  # as sbatch --signal=B:USR2@... does
        output = finish(agent, 120)
    assert "closing signal SIGUSR2" in output, output[-4000:]
    _stopped_at(run_dir, output, "SIGUSR2")
    # the ranks left within the agent's grace period: it had no need to kill them
    assert "forcefully" not in output and not any(alive(pid) for pid in workers.values())


@pytest.mark.slow  # torch's own default; the forwarding test above is the fast one
def test_sigusr2_kills_torchruns_agent_and_orphans_its_ranks_by_default(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = torchrun_args(2, *JOB, f"hydra.run.dir={run_dir}", "train.max_steps=100000")
    with started(args) as agent:
        _past_the_first_checkpoint(run_dir, agent, 120)
        workers = worker_pids(agent.pid, 2)
        try:
            os.kill(agent.pid, signal.SIGUSR2)
            # only the agent: its orphans keep its output open
            assert agent.wait(timeout=60) == -signal.SIGUSR2
            # the ranks never heard of it: they train on past several agreements, and
            # under SLURM would be killed at the time limit with nothing saved
            metrics = run_dir / "metrics.jsonl"
            at_kill = last_step(metrics)
            wait_until(lambda: last_step(metrics) >= at_kill + 4 * CHECK, 120, "steps")
            assert all(alive(pid) for pid in workers.values())
            steps = [info.step for info in list_checkpoints(run_dir / "checkpoints")]
            assert all(step % EVERY == 0 for step in steps), steps  # periodic ones only
        finally:
            for pid in workers.values():
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_sigusr2_under_submitit_requeues_through_its_handler_and_resumes(tmp_path: Path) -> None:
    # submitit's local executor sends SIGUSR2 30 s before timeout_min and requeues a
    # job whose rank 0 exits with its requeue status, up to 3 times
    job = ["-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=1"]
    job += [*QUIET, "log.every=50", "log.consensus_every=0"]
    job += ["topology=ring", f"train.max_steps={LONG}", "checkpoint.every_steps=0"]
    proc = launch([sys.executable, str(ROOT / "train.py"), *job], timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (sweep,) = tmp_path.glob("multirun/*/*")
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["train/steps"] == LONG
    resumed = summary["resumed_from_step"]
    assert resumed is not None and 0 < resumed < LONG and resumed % 10 == 0
    logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.*"))
    assert "on SIGUSR2" in logs and "Requeued job" in logs, logs[-4000:]
