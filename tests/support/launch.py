"""Paths, a clean environment for launching ranks, and ``torchrun`` / Hydra helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
        list(args),
        cwd=cwd,
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def torchrun(
    nproc: int, *overrides: str, timeout: float = 120, script: str = "train.py", **kwargs: Any
) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=nproc script overrides...`` from the root."""
    return launch(
        [*TORCHRUN, f"--nproc_per_node={nproc}", script, *overrides], timeout=timeout, **kwargs
    )


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
