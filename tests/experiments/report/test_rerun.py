"""``python -m experiments.report.rerun``: committed runs rerun with their own overrides."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.report import rerun
from tests.support.launch import QUIET, torchrun

JOB = [*QUIET, "topology=ring", "train.max_steps=3", "log.every=1"]


def _committed(tmp_path: Path, name: str = "run") -> Path:
    """A run folder as the sweeps commit it: summary.json and .hydra/overrides.yaml only."""
    run = tmp_path / name
    (run / ".hydra").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"eval/loss": 1.5, "world_size": 2}))
    (run / ".hydra" / "overrides.yaml").write_text("- log.progress=False\n- topology=ring\n")
    return run


def test_the_overrides_are_the_runs_own_but_where_it_writes(tmp_path: Path) -> None:
    run = _committed(tmp_path)
    value, world, overrides = rerun._read(run, "eval/loss")
    assert (value, world, overrides) == (1.5, 2, ["topology=ring"])
    cmd = rerun.command(world, overrides, tmp_path / "w")
    assert cmd[-4:] == [
        "train.py",
        "topology=ring",
        "log.progress=false",
        f"hydra.run.dir={tmp_path / 'w'}",
    ]
    assert "--nproc_per_node=2" in cmd


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda r: (r / "summary.json").unlink(), "no summary.json"),
        (lambda r: (r / ".hydra" / "overrides.yaml").unlink(), "no .hydra/overrides.yaml"),
        (lambda r: (r / "summary.json").write_text('{"world_size": 2}'), "'eval/loss' is not in"),
        (lambda r: (r / "summary.json").write_text('{"eval/loss": 1}'), "no world_size"),
        (lambda r: (r / ".hydra" / "overrides.yaml").write_text("topology: ring\n"),
         "is not a list item"),
    ],
)  # fmt: skip
def test_a_bad_run_folder_fails_in_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], breakage, message: str
) -> None:
    good, bad = _committed(tmp_path, "good"), _committed(tmp_path, "bad")
    breakage(bad)
    assert rerun.main([str(good), str(bad), "--work", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(bad) in err
    assert not (tmp_path / "w").exists()  # the good run did not start either


def test_a_negative_tolerance_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        rerun.main([str(_committed(tmp_path)), "--tol", "-1"])


def test_the_report_names_each_verdict() -> None:
    rows = [
        rerun.Rerun("a", 3.0, 3.0),
        rerun.Rerun("b", 3.0, 3.02),
        rerun.Rerun("c", 3.0, error="exit 1"),
    ]
    text = rerun.report(rows, "eval/loss", 0.01)
    assert "| a | 3.000000 | 3.000000 | 0 | yes |" in text
    assert "| b | 3.000000 | 3.020000 | 0.02 | **no** |" in text
    assert "| c | 3.000000 | – (exit 1) | – | **no** |" in text


@pytest.mark.slow
def test_a_real_run_reruns_to_the_digit_and_a_moved_value_fails(tmp_path: Path) -> None:
    # a real 2-rank gloo job, kept as the sweeps keep it, then rerun by the tool
    src = tmp_path / "src"
    proc = torchrun(2, *JOB, f"hydra.run.dir={src}", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "committed" / "ring"
    (run / ".hydra").mkdir(parents=True)
    shutil.copy(src / "summary.json", run)
    shutil.copy(src / ".hydra" / "overrides.yaml", run / ".hydra")
    committed = json.loads((run / "summary.json").read_text())["eval/loss"]
    work, out = tmp_path / "work", tmp_path / "out"
    assert rerun.main([str(run), "--work", str(work), "--out", str(out)]) == 0
    [result] = json.loads((out / "rerun.json").read_text())
    assert result["rerun"] == committed and result["seconds"] > 0
    # the committed value moved by more than the tolerance: the finished rerun is read back
    summary = json.loads((run / "summary.json").read_text())
    summary["eval/loss"] = committed + 0.05
    (run / "summary.json").write_text(json.dumps(summary))
    assert rerun.main([str(run), "--work", str(work), "--out", str(out)]) == 1
    [result] = json.loads((out / "rerun.json").read_text())
    assert result["seconds"] is None and result["rerun"] == committed
    assert "**no**" in (out / "rerun.md").read_text()
