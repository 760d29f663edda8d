"""The example package of ``examples/own_model`` trained by ``train.py``, as a user runs it.

One ``torchrun`` of 2 ranks, with the example's config directory (``--config-dir``) and
``PYTHONPATH=examples``, sweeps ``experiment=own_model`` over the example's own topology and
``ring`` (a multirun); ``python -m experiments.report`` then reports the sweep. A bad value
of a ``_target_`` section under the same torchrun stops both ranks with one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launch import QUIET, ROOT, clean_env, launch, torchrun

CONF = ROOT / "examples" / "own_model" / "conf"
ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")])}

pytestmark = pytest.mark.slow  # two torchrun launches of 2 ranks: ~20-40 s on 2 cores


def _example(
    *overrides: str, timeout: float, multirun: bool = False
) -> subprocess.CompletedProcess:
    """``train.py --config-dir examples/own_model/conf experiment=own_model overrides``, 2 ranks.

    Quiet; ``multirun`` puts ``-m`` first (a sweep).
    """
    sweep = ["-m"] if multirun else []
    args = ["--config-dir", str(CONF), *sweep, "experiment=own_model", *overrides, *QUIET]
    return torchrun(2, *args, timeout=timeout, env=clean_env(**ENV))


def test_the_example_trains_sweeps_two_topologies_and_is_reported(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = _example("topology=own_hub,ring", f"hydra.sweep.dir={sweep}", multirun=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summaries = [json.loads((sweep / job / "summary.json").read_text()) for job in ("0", "1")]
    assert [s["topology"] for s in summaries] == ["own_model.topology.Hub", "ring"]
    for s in summaries:
        assert s["model"] == "own_model.models.TinyMLP" and s["dataset"] == "own_model.data.Stripes"
        assert s["optim"] == "torch.optim.SGD" and s["world_size"] == 2 and s["train/steps"] == 64
        assert s["eval/acc"] > 0.6  # four classes: chance is 0.25
    out = tmp_path / "report"
    report = launch([sys.executable, "-m", "experiments.report", str(sweep), "--out", str(out)])
    assert report.returncode == 0, report.stderr[-3000:]
    text = (out / "report.md").read_text()
    assert "| own_model.topology.Hub | 2 | own_model.data.Stripes |" in text
    assert "| ring | 2 | own_model.data.Stripes |" in text


def test_a_bad_target_value_stops_both_ranks_with_one_line(tmp_path: Path) -> None:
    start = time.monotonic()
    run_dir = tmp_path / "run"
    proc = _example("model.hidden=0", "dist.timeout_s=30", f"hydra.run.dir={run_dir}", timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error")]
    assert lines == [
        "train.py: error on rank 0: ConfigError: model._target_=own_model.models.TinyMLP raised "
        "ValueError: hidden=0 is invalid; it must be >= 1"
    ], proc.stderr[-3000:]
    assert time.monotonic() - start < 90  # no rank waited for the timeout
    assert not (run_dir / "metrics.jsonl").exists()
