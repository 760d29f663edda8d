"""A checkpoint written before ``experiments/`` was split into subpackages still resumes.

``tests/fixtures/premove_run`` holds the checkpoint at step 8 of a 2-rank ring run and
what the uninterrupted run logged up to step 16 (see its README). The same job, resumed
from that checkpoint by the current code, must log the same numbers at steps 12 and 16.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.launch import QUIET, ROOT, torchrun

FIXTURE = ROOT / "tests" / "fixtures" / "premove_run"
# the command of the fixture's README, less hydra.run.dir
JOB = [
    *QUIET,
    "topology=ring",
    "train.max_steps=16",
    "log.every=4",
    "log.consensus_every=4",
    "checkpoint.every_steps=8",
    "checkpoint.keep=2",
    "optim=adamw",
]
TRAIN_KEYS = (
    "train/loss",
    "train/acc",
    "train/lr",
    "consensus/distance",
    "consensus/distance_sketch",
)
EVAL_KEYS = ("eval/acc", "eval/acc_local", "eval/loss")


def _train_lines(path: Path) -> dict[int, dict]:
    """The training metrics lines (those with ``train/lr``) by step."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {line["step"]: line for line in lines if "train/lr" in line}


@pytest.mark.slow  # a committed checkpoint resumed under torchrun; in-process resume stays fast (test_run)
def test_checkpoint_from_before_the_move_resumes_bit_for_bit(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE / "checkpoints", tmp_path / "checkpoints")
    proc = torchrun(2, *JOB, f"hydra.run.dir={tmp_path}", timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["resumed_from_step"] == 8 and summary["train/steps"] == 16
    reference = json.loads((FIXTURE / "reference_summary.json").read_text())
    for key in EVAL_KEYS:
        assert summary[key] == pytest.approx(reference[key], rel=1e-6, abs=0), key

    got = _train_lines(tmp_path / "metrics.jsonl")
    want = _train_lines(FIXTURE / "reference_metrics.jsonl")
    for step in (12, 16):
        for key in TRAIN_KEYS:
            if key not in want[step]:  # step 16 has its exact distance on the evaluation line
                assert key not in got[step], (step, key)
                continue
            # the sketch's float32 projection sums round differently on another CPU than the
            # one that recorded the fixture (6e-6 relative here, on unchanged code)
            rel = 1e-4 if key == "consensus/distance_sketch" else 1e-6
            assert got[step][key] == pytest.approx(want[step][key], rel=rel, abs=0), (step, key)
    # the exact distance of step 16 comes with its evaluation line
    last_eval = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert last_eval["step"] == 16 and "eval/acc" in last_eval
    want_eval = json.loads((FIXTURE / "reference_metrics.jsonl").read_text().splitlines()[-1])
    assert last_eval["consensus/distance"] == pytest.approx(
        want_eval["consensus/distance"],
        rel=1e-4,
        abs=0,  # rounds apart across CPUs, as above
    )
