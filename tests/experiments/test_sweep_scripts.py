"""The sweep scripts run from a private copy: editing one mid-sweep changes nothing of that sweep."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from experiments.report import find_run

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "experiments" / "sweeps"
HEADER = '[ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"'


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the script never reached its wait"
        time.sleep(0.02)


def test_an_edit_during_the_run_does_not_reach_the_running_script(tmp_path: Path) -> None:
    sweeps = tmp_path / "repo" / "experiments" / "sweeps"
    sweeps.mkdir(parents=True)
    shutil.copy(SWEEPS / "_snapshot.sh", sweeps)
    script = sweeps / "job.sh"
    script.write_text(
        "set -euo pipefail\n"
        f"{HEADER}\n"
        'cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"\n'
        'pwd > "$OUT/cwd"; echo "$@" > "$OUT/args"; touch "$OUT/waiting"\n'
        'while [ ! -e "$OUT/go" ]; do sleep 0.02; done\n'
        'echo first >> "$OUT/ran"\n'
        'echo second >> "$OUT/ran"\n'
    )
    env = {**os.environ, "OUT": str(tmp_path), "TMPDIR": str(tmp_path)}
    env.pop("SWEEP_SNAPSHOT", None)
    proc = subprocess.Popen(["bash", str(script), "a b", "c"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    _wait_for(tmp_path / "waiting", proc)
    # rewrite the rest of the script as an editor would, while it runs
    text = script.read_text().replace("echo first", "echo EDITED").replace("second", "SECOND")
    script.write_text(text + 'echo appended >> "$OUT/ran"\n')
    (tmp_path / "go").touch()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert (tmp_path / "ran").read_text() == "first\nsecond\n"
    assert (tmp_path / "cwd").read_text().strip() == str(tmp_path / "repo")
    assert (tmp_path / "args").read_text() == "a b c\n"
    assert not list(tmp_path.glob("sweep.*")), "the private copy is removed"


@pytest.mark.parametrize("script", sorted(p.name for p in SWEEPS.glob("*.sh") if p.name[0] != "_"))
def test_every_sweep_script_starts_from_its_copy_at_the_repository_root(script: str) -> None:
    lines = (SWEEPS / script).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    assert lines[start + 1] == 'cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"'
    # nothing but comments and shell options before it
    assert all(not ln.strip() or ln.startswith(("#", "set ")) for ln in lines[:start])


def test_the_shared_lib_keeps_runs_small_files_and_gives_the_best_with_its_edge(
    tmp_path: Path,
) -> None:
    # _lib.sh is sourced by sweep scripts, not run: it is no sweep script (its name starts
    # with "_", so the header check above passes it over)
    from tests.experiments.report.common import write_vision_run

    out = tmp_path / "out"
    for lr, acc in (("1e-3", 0.5), ("2e-3", 0.6), ("4e-3", 0.9)):
        write_vision_run(out / "arm" / "stage1" / lr, "ring", [100.0], [acc],
                         overrides=[f"optim.lr={lr}"])  # fmt: skip
    (out / "arm" / "stage1" / "1e-3" / "checkpoints").mkdir()  # large files stay behind
    script = (
        ". experiments/sweeps/_lib.sh\n"
        'dest_of() { echo "$DOCS/kept/$1"; }\n'
        'keep_runs dest_of "$OUT"/*/*/*/summary.json "$OUT"/none/*/summary.json\n'
        'best "$OUT/arm/stage1" optim.lr\n'
    )
    env = {**os.environ, "OUT": str(out), "DOCS": str(tmp_path / "docs")}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "4e-3 high\n"
    kept = tmp_path / "docs" / "kept" / "arm" / "stage1"
    for lr in ("1e-3", "2e-3", "4e-3"):
        files = sorted(str(p.relative_to(kept / lr)) for p in (kept / lr).rglob("*"))
        assert files == [".hydra", ".hydra/overrides.yaml", "metrics.jsonl", "summary.json"]
        assert (kept / lr / "summary.json").read_bytes() == (
            out / "arm" / "stage1" / lr / "summary.json"
        ).read_bytes()


@pytest.mark.slow
def test_tune_runs_only_what_has_not_run_so_a_cut_short_sweep_resumes(tmp_path: Path) -> None:
    # real 2-rank torchrun jobs of two steps each, launched by tune.sh itself
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "NPROC": "2", "OMP_NUM_THREADS": "1"}
    env.pop("SWEEP_SNAPSHOT", None)
    job = ["logger=none", "topology=ring", "train.max_steps=2", "log.every=1"]

    def tune(values: str, **extra: str) -> str:
        done = subprocess.run(
            ["bash", str(SWEEPS / "tune.sh"), "arm", "optim.lr", values, *job],
            env={**env, **extra}, cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    stage1 = out / "arm" / "stage1"
    tune("1e-1,0.2", STAGE="1")
    runs = lambda: sorted(p.name for p in stage1.iterdir() if p.is_dir())  # noqa: E731
    assert runs() == ["0", "1"]
    first = (stage1 / "0" / "summary.json").stat().st_mtime_ns
    (stage1 / "1" / "summary.json").unlink()  # that run was cut short
    # Hydra wrote 1e-1 as 0.1: the values match as numbers
    log = tune("0.1,2e-1,0.4", STAGE="1")
    assert "optim.lr=0.1 has run already; skipped" in log
    assert "optim.lr=2e-1 has run already" not in log
    # the rest go to named folders, not to the job numbers the first launch used
    assert runs() == ["0", "1", "lr0.4", "lr2e-1"]
    assert (stage1 / "0" / "summary.json").stat().st_mtime_ns == first
    for name, lr in (("lr2e-1", "0.2"), ("lr0.4", "0.4")):
        assert find_run.sets(stage1 / name, "optim.lr", lr)
    log = tune("-", STAGE="2", SEEDS="1", BEST="0.2")
    assert "seeds 1, to run: 1" in log
    seed1 = out / "arm" / "final" / "seed1"
    ran = (seed1 / "summary.json").stat().st_mtime_ns
    assert find_run.sets(seed1, "optim.lr", "0.2")
    assert "seeds 1, to run: none" in tune("-", STAGE="2", SEEDS="1", BEST="0.2")
    assert (seed1 / "summary.json").stat().st_mtime_ns == ran
    # another best: its seeds are not the ones that ran, so they run again
    assert "seeds 1, to run: 1" in tune("-", STAGE="2", SEEDS="1", BEST="0.4")
    assert find_run.sets(seed1, "optim.lr", "0.4")
