"""``make gpu-check``'s assembly, on CPU: no GPU part runs here."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from experiments.bench import gpu_check
from experiments.bench.gpu_check import PartResult, metrics_table, pytest_summary, render


def test_without_cuda_it_says_so_in_one_line_and_exits_non_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu.md"
    assert gpu_check.main(["--out", str(out)]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], lines
    assert not out.exists()


def test_a_failing_or_hanging_part_is_recorded_and_never_raises() -> None:
    failed, _ = gpu_check.run_command("x", [sys.executable, "-c", "print('boom'); exit(3)"], 30)
    assert failed.status == "failed (exit 3)" and "boom" in failed.tail
    slow = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"]
    hung, _ = gpu_check.run_command("y", slow, 2)
    assert hung.status == "timed out after 2 s" and hung.seconds < 20
    ok, output = gpu_check.run_command("z", [sys.executable, "-c", "print('fine')"], 30)
    assert ok.ok and ok.tail == "" and "fine" in output


def test_main_runs_every_part_after_one_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Fake GPU 80GB")
    calls = []

    def tests(timeout_s: float) -> PartResult:
        calls.append("tests")
        raise RuntimeError("pytest vanished")

    def bench(timeout_s: float, work: Path) -> PartResult:
        calls.append("bench")
        return PartResult("bench", "timed out after 120 s", 120.0)

    def train(timeout_s: float, work: Path) -> PartResult:
        calls.append("train")
        return PartResult("train", "ok", 42.0, body="| metric | value |")

    monkeypatch.setattr(gpu_check, "run_tests", tests)
    monkeypatch.setattr(gpu_check, "spawn_seconds", lambda: 9.0)
    monkeypatch.setattr(gpu_check, "count_gpu_tests", lambda: 30)
    monkeypatch.setattr(gpu_check, "run_bench", bench)
    monkeypatch.setattr(gpu_check, "run_train", train)
    out = tmp_path / "gpu.md"
    assert gpu_check.main(["--out", str(out)]) == 1
    assert calls == ["train", "tests", "bench"]  # the whole stack first, then the tests
    text = out.read_text()
    assert "Fake GPU 80GB" in text
    assert "| tests | error: RuntimeError: pytest vanished | 0 |" in text
    assert "| bench | timed out after 120 s | 120 |" in text
    assert "| train | ok | 42 |" in text


def test_the_report_renders_each_part() -> None:
    results = [
        PartResult("tests", "ok", 100.0, body="```\n30 passed in 99.0s\n```"),
        PartResult("bench", "failed (exit 1)", 5.0, tail="Traceback ...\nOSError: x"),
        PartResult(
            "train",
            "ok",
            60.0,
            body=metrics_table({"train/loss": 0.25, "topology": "ring"}, "train.py"),
        ),
    ]
    text = render("NVIDIA H200", results, "2026-12-01 12:00 UTC", "2.14.1")
    assert text.startswith("# GPU check\n")
    assert "Device: **NVIDIA H200**; torch 2.14.1; 2026-12-01 12:00 UTC." in text
    assert "| bench | failed (exit 1) | 5 |" in text
    assert "30 passed in 99.0s" in text
    assert "OSError: x" in text
    assert "| train/loss | 0.25 |" in text and "| topology | ring |" in text
    assert text.index("## Tests") < text.index("## Step time") < text.index("## Training run")


def test_pytest_summary_keeps_failures_and_the_final_line() -> None:
    output = "....F.s\nFAILED tests/a.py::test_x - AssertionError\n==== 1 failed, 5 passed, 1 skipped in 12.3s ====\n"
    assert pytest_summary(output) == (
        "FAILED tests/a.py::test_x - AssertionError\n1 failed, 5 passed, 1 skipped in 12.3s"
    )
    assert "no pytest summary" in pytest_summary("Traceback: import error")


@pytest.mark.slow  # make test's 5-minute budget
def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    """A part that spawned children and hangs leaves no child running after its timeout."""
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)"
    )
    result, _ = gpu_check.run_command("hang", [sys.executable, "-c", code], 3)
    assert result.status == "timed out after 3 s"
    child = int(pidfile.read_text())
    deadline = time.time() + 10
    while time.time() < deadline and Path(f"/proc/{child}").exists():
        stat = Path(f"/proc/{child}/stat").read_text().split()
        if stat[2] == "Z":  # killed, waiting for its (gone) parent's reaper
            break
        time.sleep(0.1)
    alive = (
        Path(f"/proc/{child}").exists()
        and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z"
    )
    assert not alive


def test_the_tests_budget_follows_the_measured_start_cost() -> None:
    slow, fast = gpu_check.tests_budget(25, 12.0, 2000.0), gpu_check.tests_budget(25, 3.0, 2000.0)
    assert slow > fast >= gpu_check.TESTS_MIN_S
    assert slow == pytest.approx((30 + 25 * (12.0 + gpu_check.TEST_WORK_S)) * 1.25)
    # never more than leaves the bench its minimum
    assert gpu_check.tests_budget(200, 12.0, 400.0) == 400.0 - gpu_check.BENCH_MIN_S
