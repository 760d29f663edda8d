"""Processes seen through ``/proc``: a torchrun agent's workers, and waiting for a file."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

__all__ = ["wait_for", "worker_pids"]


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its last ')'
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry.name))
    return kids


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def worker_pids(agent: int, world_size: int) -> dict[int, int]:
    """``rank -> pid`` of the workers that the torchrun agent ``agent`` runs now."""
    found: dict[int, int] = {}
    for pid in _children(agent):
        try:
            env = _environ(pid)
        except OSError:
            continue
        if "RANK" in env and env.get("TORCHELASTIC_RESTART_COUNT") == "0":
            found[int(env["RANK"])] = pid
    assert sorted(found) == list(range(world_size)), found
    return found


def wait_for(pattern: str, where: Path, proc: subprocess.Popen, limit_s: float) -> Path:
    """The first path under ``where`` that matches ``pattern``, once one exists.

    Fails when ``proc`` ends first or nothing matches within ``limit_s`` seconds.
    """
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        hits = sorted(where.glob(pattern))
        if hits:
            return hits[0]
        assert proc.poll() is None, "the run ended before the file appeared"
        time.sleep(0.02)
    raise AssertionError(f"{pattern} did not appear under {where} within {limit_s} s")
