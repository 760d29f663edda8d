"""The submitit launcher against a real one-node SLURM (``tests/support/slurm_cluster.sh``).

Slow, and root only: the fixture installs Debian's ``slurmctld``, ``slurmd`` and
``munge`` if needed, writes a ``slurm.conf`` for this machine, starts the daemons
and stops them afterwards (``make test-slurm``).

* A two-job sweep through ``hydra/launcher=slurm`` runs both jobs at world size 2.
* ``scontrol requeue`` mid-run: the ranks save the checkpoint of the step they agree
  on, the requeued job resumes from it (not from the older periodic one) and ends
  bit for bit where the sweep's uninterrupted job of the same config ends.
* A job that reaches ``timeout_min`` gets ``SIGUSR2``, saves, is requeued by
  submitit and resumes.

A requeued job waits for its begin time (SLURM delays it by two minutes); the
tests move that to now with ``scontrol update``, which changes nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.train.checkpoint import latest_checkpoint
from tests.support.checkpoints import assert_same_models
from tests.support.launch import QUIET, ROOT, clean_env, started
from tests.support.procs import last_step, wait_until

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "support" / "slurm_cluster.sh"
CANNOT_INSTALL = 3  # the script's status when the packages are missing and apt fails
STEPS, EVERY = 1500, 200
TRAIN = [
    *QUIET,
    "log.every=10",
    "log.consensus_every=0",
    f"train.max_steps={STEPS}",
    f"checkpoint.every_steps={EVERY}",
    "checkpoint.signal_check_every=10",
]
# one node of this machine: two tasks of one CPU each, no GPU
NODE = [
    "hydra/launcher=slurm",
    "hydra.launcher.nodes=1",
    "hydra.launcher.tasks_per_node=2",
    "hydra.launcher.gpus_per_node=null",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=1",
]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running one-node cluster; yields the environment its clients need."""
    if os.geteuid() != 0:
        pytest.skip("a local SLURM needs root (the daemons run as root)")
    work = tmp_path_factory.mktemp("slurm")
    env = clean_env(SLURM_CLUSTER_DIR=str(work / "cluster"), SLURM_KILL_WAIT="10")
    up = subprocess.run(
        ["bash", str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=900
    )
    try:
        if up.returncode == CANNOT_INSTALL:
            pytest.skip(f"no SLURM packages and apt cannot install them: {up.stderr.strip()}")
        assert up.returncode == 0, up.stdout + up.stderr
        env["SLURM_CONF"] = str(work / "cluster" / "slurm.conf")
        yield env
    finally:
        subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, timeout=120)


@contextlib.contextmanager
def _submitted(env: dict[str, str], cwd: Path, *overrides: str) -> Iterator[subprocess.Popen]:
    """The sweep launcher submitting ``overrides`` from ``cwd``; killed if still running after."""
    cwd.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, str(ROOT / "train.py"), "-m", *NODE, *TRAIN, *overrides]
    with started(args, cwd=cwd, env=env) as proc:
        yield proc


def _slurm(env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        list(args), env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout


def _jobs(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(job id, state, reason)`` of every job in the queue."""
    out = _slurm(env, "squeue", "-h", "-o", "%i %T %r")
    return [tuple(line.split(maxsplit=2)) for line in out.splitlines()]  # type: ignore[misc]


def _finish(env: dict[str, str], proc: subprocess.Popen, limit_s: float) -> str:
    """Wait for the launcher; start each requeued job as soon as SLURM lets it."""
    deadline = time.monotonic() + limit_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the sweep did not end in time"
        for job, state, reason in _jobs(env):
            if state == "PENDING" and reason == "BeginTime":
                subprocess.run(
                    ["scontrol", "update", f"JobId={job}", "StartTime=now"],
                    env=env,
                    capture_output=True,
                    timeout=60,
                )
        time.sleep(0.5)
    return proc.stdout.read() if proc.stdout else ""


def _task_logs(job_dir: Path) -> list[str]:
    """Every task's submitit log (out and err) of the job in ``job_dir``, all attempts in each."""
    return [p.read_text() for p in sorted(job_dir.parent.glob(".submitit/*/*_log.*"))]


@pytest.fixture(scope="module")
def sweep(slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``topology=ring,complete`` through the launcher, uninterrupted."""
    cwd = tmp_path_factory.mktemp("sweep")
    with _submitted(slurm, cwd, "topology=ring,complete") as proc:
        output = _finish(slurm, proc, 600)
    assert proc.returncode == 0, output[-4000:]
    (found,) = cwd.glob("multirun/*/*")
    return found


def test_a_two_job_sweep_runs_both_jobs_at_world_size_2(sweep: Path) -> None:
    for job, topology in (("0", "ring"), ("1", "complete")):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["topology"] == topology
        assert summary["train/steps"] == STEPS and summary["restarts"] == 0


def test_scontrol_requeue_resumes_from_the_signal_checkpoint_bit_for_bit(
    slurm: dict[str, str], sweep: Path, tmp_path: Path
) -> None:
    with _submitted(slurm, tmp_path, "topology=ring") as proc:
        found = wait_until(
            lambda: list(tmp_path.glob("multirun/*/*/0/metrics.jsonl")), 300, "metrics", proc
        )
        metrics = found[0]
        wait_until(lambda: last_step(metrics) >= 2 * EVERY, 300, f"step {2 * EVERY}", proc)
        job_dir, at_requeue = metrics.parent, last_step(metrics)
        (job,) = [job for job, state, _ in _jobs(slurm) if state == "RUNNING"]
        _slurm(slurm, "scontrol", "requeue", job)
        output = _finish(slurm, proc, 600)
    assert proc.returncode == 0, output[-4000:]
    logs = _task_logs(job_dir)
    # every rank logs its stop, once, in its own task's log
    stops = [int(m) for log in logs for m in re.findall(r"stopping at step (\d+) on SIGTERM", log)]
    assert len(stops) == 2 and len(set(stops)) == 1, stops
    stop = stops[0]
    assert stop >= at_requeue and stop % 10 == 0 and stop % EVERY != 0, stop  # not a periodic one
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["resumed_from_step"] == stop and summary["restarts"] == 1
    assert summary["resumed_from_checkpoint"].endswith(f"step_{stop:09d}")
    assert summary["train/steps"] == STEPS
    reference = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["config_hash"] == reference["config_hash"]
    for key in ("eval/acc", "eval/acc_local", "eval/loss", "train/loss"):
        assert summary[key] == reference[key], key
    final, clean = (latest_checkpoint(d / "checkpoints") for d in (job_dir, sweep / "0"))
    assert final is not None and clean is not None
    assert_same_models(final, clean)
    # nothing was recomputed: every training line was logged once
    lines = [json.loads(x) for x in (job_dir / "metrics.jsonl").read_text().splitlines()]
    train = [line["step"] for line in lines if "train/lr" in line]
    assert train == sorted(set(train)) and train[-1] == STEPS


def test_a_job_at_its_time_limit_is_requeued_by_submitit_and_resumes(
    slurm: dict[str, str], tmp_path: Path
) -> None:
    # SIGUSR2 comes signal_delay_s before the limit (SLURM may send it up to a minute
    # early); the job needs more than one slot, the requeued one finishes in its own
    steps = 8000
    limit = ["hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=60"]
    with _submitted(slurm, tmp_path, "topology=ring", f"train.max_steps={steps}", *limit) as proc:
        output = _finish(slurm, proc, 900)
    assert proc.returncode == 0, output[-4000:]
    (job_dir,) = tmp_path.glob("multirun/*/*/0")
    log = "".join(_task_logs(job_dir))
    assert "on SIGUSR2" in log and "Requeued job" in log, log[-4000:]
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["train/steps"] == steps and summary["restarts"] >= 1
    resumed = summary["resumed_from_step"]
    assert resumed is not None and 0 < resumed < steps and resumed % 10 == 0
