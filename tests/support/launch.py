"""Paths, a clean environment for launching ranks, and ``torchrun`` / Hydra helpers.

:func:`launch` and :func:`torchrun` run a command to its end; :func:`started` runs one
in the background (to signal or kill it meanwhile) and cleans up after it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.support.procs import descendants

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# the quiet defaults of an end-to-end job: no wandb, no progress bar
QUIET = ["logger=none", "log.progress=false"]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the launcher variables, one thread, wandb silent."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env.update(OMP_NUM_THREADS="1", WANDB_SILENT="true", **extra)
    return env


def launch(
    args: Sequence[str],
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: str | Path = ROOT,
    **kwargs: Any,
) -> subprocess.CompletedProcess:
    """Run a command in ``cwd`` (the repository root) with :func:`clean_env`, capturing output."""
    return subprocess.run(
        list(args), capture_output=True, timeout=timeout, **_where(cwd, env), **kwargs
    )


def _where(cwd: str | Path, env: dict[str, str] | None) -> dict[str, Any]:
    """Where and how a test's command runs: ``cwd``, :func:`clean_env` unless given, text."""
    return {"cwd": cwd, "env": clean_env() if env is None else env, "text": True}


def torchrun(
    nproc: int, *overrides: str, timeout: float = 120, script: str = "train.py", **kwargs: Any
) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=nproc script overrides...`` from the root."""
    return launch(torchrun_args(nproc, *overrides, script=script), timeout=timeout, **kwargs)


def uninterrupted_run(
    tmp_path_factory: Any, nproc: int, overrides: Sequence[str], timeout: float
) -> Path:
    """The run directory of ``torchrun nproc train.py overrides`` run to its end, unharmed."""
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    proc = torchrun(nproc, *overrides, f"hydra.run.dir={run_dir}", timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir


def torchrun_args(nproc: int, *overrides: str, script: str = "train.py", **flags: Any) -> list[str]:
    """The command line of ``torchrun --standalone --nproc_per_node=nproc [--flag=value]... script``.

    ``flags`` are torchrun's own options, ``max_restarts=1`` for ``--max-restarts=1``.
    """
    options = [f"--{name.replace('_', '-')}={value}" for name, value in flags.items()]
    return [*TORCHRUN, f"--nproc_per_node={nproc}", *options, script, *overrides]


def rank_env(rank: int, world_size: int, port: int, **extra: str) -> dict[str, str]:
    """:func:`clean_env` of one rank started without torchrun, as SLURM's tasks are."""
    return clean_env(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **extra,
    )


@contextlib.contextmanager
def started(
    args: Sequence[str],
    *,
    cwd: str | Path = ROOT,
    env: dict[str, str] | None = None,
    group: int | None = None,
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.STDOUT,
) -> Iterator[subprocess.Popen]:
    """``args`` running in the background, its output as text (by default both streams in
    ``stdout``).

    It runs in a process group of its own, or joins ``group`` (another one's pid), so
    that the test can signal every process of it at once, as SLURM signals a job step.
    Whatever still runs when the block ends, children included (a torchrun agent's
    workers run in groups of their own), is killed and reaped.
    """
    # a group of its own (its pid), or the given one: setpgid, since a new session could
    # not be joined by the next process
    join = functools.partial(os.setpgid, 0, 0 if group is None else group)
    proc = subprocess.Popen(
        list(args), stdout=stdout, stderr=stderr, preexec_fn=join, **_where(cwd, env)
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.communicate()


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Wait for :func:`started`'s process to end; what it wrote to the pipes it was given."""
    out, err = proc.communicate(timeout=timeout)
    return (out or "") + (err or "")


def compose_config(
    *overrides: str, conf: Path = CONF, name: str = "config", hydra_cfg: bool = False
) -> Any:
    """``conf/config.yaml`` composed with the overrides, the Hydra state cleared before and after."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            return compose(name, overrides=list(overrides), return_hydra_config=hydra_cfg)
    finally:
        GlobalHydra.instance().clear()
