"""``train.py`` jobs under torchrun: launched into a run or sweep directory, exit status checked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.launch import torchrun


def train_job(
    nproc: int,
    out_dir: Path,
    *overrides: str,
    sweep: bool = False,
    status: int = 0,
    timeout: float = 240,
) -> subprocess.CompletedProcess:
    """``train.py overrides`` on ``nproc`` ranks, its exit status asserted to be ``status``.

    Args:
        nproc: Ranks torchrun starts.
        out_dir: Hydra's run directory, or with ``sweep`` the multirun's sweep directory.
        overrides: Hydra overrides of the job (or with ``sweep`` the sweep's).
        sweep: A multirun (``-m``): one job per combination, each in ``out_dir/<index>``.
        status: The exit status the launch must end with (the stderr tail is shown if not).
        timeout: Seconds before the launch is killed.
    """
    mode, key = (["-m"], "hydra.sweep.dir") if sweep else ([], "hydra.run.dir")
    proc = torchrun(nproc, *mode, *overrides, f"{key}={out_dir}", timeout=timeout)
    assert proc.returncode == status, proc.stderr[-4000:]
    return proc


def read_summary(run_dir: Path) -> dict[str, Any]:
    """The run's ``summary.json``."""
    return json.loads((run_dir / "summary.json").read_text())


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl``, one dict a line."""
    return [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]
