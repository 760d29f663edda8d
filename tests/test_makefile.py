"""The Makefile's command targets pass ``ARGS`` on to the command they name."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _make(*args: str) -> subprocess.CompletedProcess:
    # A make that runs this suite (`make test ARGS=...`) hands its own ARGS down through
    # MAKEFLAGS; the target under test must see only the arguments given here.
    env = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS")
    }
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_make_topo_passes_args_to_the_table() -> None:
    proc = _make("topo", "ARGS=--world-size 8 --local-world-size 2 --inter ring")
    assert proc.returncode == 0, proc.stderr
    assert "world size n=8, local world size L=2" in proc.stdout
    assert "hierarchical: ring over 4 hosts of 2 ranks" in proc.stdout


def test_make_topo_keeps_64_workers_without_args() -> None:
    proc = _make("-n", "topo")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("-m decent_dp.topo --world-size 64")


def test_make_choose_passes_args() -> None:
    proc = _make("-n", "choose", "ARGS=--nodes 2 --procs-per-node 8 --link 1gbit --model 100")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(
        "-m experiments.network.choose --nodes 2 --procs-per-node 8 --link 1gbit --model 100"
    )


def test_make_test_runs_check_docs_before_the_suite() -> None:
    # pytest's summary stays the last line, the one CI reads for the count of tests.
    proc = _make("-n", "test")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].endswith("-m experiments.report.check_docs")
    assert "-m pytest -m" in lines[-1]


def test_make_check_docs_passes_args_and_has_help() -> None:
    proc = _make("-n", "check-docs", "ARGS=--write")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("-m experiments.report.check_docs --write")
    assert "check-docs" in _make("help").stdout
