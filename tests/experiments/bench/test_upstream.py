"""bench-upstream without the 0.2.3 venv: its tables, arguments, import checks and script launch."""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from experiments.bench import upstream
from experiments.bench.step_time import median_row
from experiments.bench.upstream_env import IMPLS, UPSTREAM
from experiments.bench.upstream_worker import CATEGORIES, plain_sgd
from experiments.bench.upstream_worker import _check_import as check_import
from tests.support.launch import ROOT, clean_env, launch


def _row(impl: str, step_ms: float, cpu_ms: float) -> dict:
    return {
        "impl": impl,
        "median_step_s": step_ms / 1e3,
        "cpu_step_s": cpu_ms / 1e3,
        "faults_per_step": 10.0,
        "rounds_ms": [step_ms, step_ms],
    }


def test_median_row_takes_the_median_of_floats_and_keeps_the_rest() -> None:
    reps = [{"impl": "ours", "n": 2, "t": 1.0}, {"impl": "x", "n": 3, "t": 3.0}]
    reps.append({"impl": "y", "n": 4, "t": 2.5})
    assert median_row(reps) == {"impl": "ours", "n": 2, "t": 2.5}


def test_tables_give_each_ratio_against_its_target() -> None:
    rows = [_row("ours", 90.0, 50.0), _row(UPSTREAM, 100.0, 60.0), _row("torch-ddp", 120.0, 40.0)]
    results = {"configs": [{"procs": 2, "topology": "ring", "rows": rows, "load_avg": [1, 2]}]}
    text = upstream.tables(results)
    assert "| 2 | ring | ours | 90.0 | 90 90 | 50.0 | 10 |" in text
    # the 2-process ring target is ours <= 1.00 x 0.2.3; there is none against torch DDP there
    assert f"| 2 | ring | ours / {UPSTREAM} | 0.90 | <= 1.00 | yes | 0.83 |" in text
    assert "| 2 | ring | ours / torch-ddp | 0.75 |  |  | 1.25 |" in text
    assert f"torch-ddp / {UPSTREAM}" not in text
    assert "2 procs 1.0 -> 2.0" in text and "Profile" not in text

    slow = [_row("ours", 95.0, 50.0), _row("torch-ddp", 100.0, 50.0)]
    profile = dict.fromkeys(CATEGORIES, 1.0)
    profile.update(step_wall=9.0, cpu_main_thread=7.0, cpu_other_threads=2.0)
    config = {"procs": 4, "topology": "one-peer-exp", "rows": slow, "profile": {"ours": profile}}
    text = upstream.tables({"configs": [config]})
    assert "| 4 | one-peer-exp | ours / torch-ddp | 0.95 | <= 0.65 | no | 1.00 |" in text
    assert "| 4 | one-peer-exp | ours | 9.0 | " + " | ".join(["1.0"] * len(CATEGORIES)) in text


def test_config_and_candidate_arguments(tmp_path: Path) -> None:
    assert upstream._config("4:one-peer-exp") == (4, "one-peer-exp")
    for bad in ("4", "x:ring", "0:ring", "2:"):
        with pytest.raises(argparse.ArgumentTypeError, match="PROCS:TOPOLOGY"):
            upstream._config(bad)
    wrapper = tmp_path / "ddp.py"
    wrapper.write_text("DecentralizedDataParallel = None\n")
    assert upstream._candidate(f"mine={wrapper}") == ("mine", str(wrapper.resolve()))
    for name in IMPLS:
        with pytest.raises(argparse.ArgumentTypeError, match="with a NAME other than"):
            upstream._candidate(f"{name}={wrapper}")
    with pytest.raises(argparse.ArgumentTypeError, match="neither a file nor a git revision"):
        upstream._candidate("mine=no-such-revision-or-file")


def test_one_optim_fn_takes_either_order_of_the_pairs() -> None:
    weight = torch.zeros(2, requires_grad=True)
    for pairs in ([("weight", weight)], [(weight, "weight")]):
        opt = plain_sgd(lr=0.5, momentum=0.0)(pairs)
        assert opt.param_groups[0]["params"] == [weight]
        assert opt.param_groups[0]["lr"] == 0.5


def test_a_worker_refuses_a_decent_dp_that_is_not_the_one_it_times() -> None:
    check_import("ours", "")  # this repository's package, imported here
    with pytest.raises(RuntimeError, match=f"implementation '{UPSTREAM}' imported decent_dp"):
        check_import(UPSTREAM, "")


def test_the_worker_script_runs_by_path_without_the_editable_install(tmp_path: Path) -> None:
    """As in ``.bench/venv``: site-packages as a plain path, no ``.pth`` hooks, no safe path."""
    env = clean_env(PYTHONSAFEPATH="1", PYTHONPATH=sysconfig.get_paths()["purelib"])
    script = ROOT / "experiments" / "bench" / "upstream.py"
    proc = launch([sys.executable, "-S", str(script), "--help"], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--candidate" in proc.stdout
