"""Memory of a process tree, polled from /proc: what a child holds is counted, and a
command past its time is stopped with its children."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.bench.proc_watch import watch

# a child that holds 64 MB of its own (written, so resident) for half a second
HOLD = "import time; b = bytearray(64 << 20); b[::4096] = b'x' * (len(b) // 4096); time.sleep(0.5)"


def test_a_child_s_memory_is_counted(tmp_path: Path) -> None:
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {HOLD!r}])"
    seen = watch([sys.executable, "-c", parent], tmp_path, tmp_path / "log", 0.02, 30)
    assert seen.returncode == 0 and seen.wall_s > 0.5
    assert len(seen.hwm_kb) == 2  # the parent and its child
    child = max(kb for pid, kb in seen.hwm_kb.items() if pid != seen.root)
    assert child >= 64 << 10
    assert seen.anon_peak_kb >= 64 << 10 and seen.rss_peak_kb >= seen.anon_peak_kb


def test_a_command_past_its_time_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    with pytest.raises(subprocess.TimeoutExpired):
        watch([sys.executable, "-c", parent], tmp_path, tmp_path / "log", 0.02, 3.0)
    assert pid_file.exists(), "the child did not start within the timeout"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # an orphan is reaped by init a moment later
    assert not Path(f"/proc/{pid}").exists()
