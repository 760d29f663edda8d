"""Processes seen through ``/proc`` (a torchrun agent's workers, a process's descendants) and
waiting on a run (a file, a condition, the last step logged)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["alive", "descendants", "last_step", "wait_for", "wait_until", "worker_pids"]


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


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now: its children, theirs, and so on."""
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


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


def wait_until(
    condition: Callable[[], Any], limit_s: float, what: str, proc: subprocess.Popen | None = None
) -> Any:
    """``condition()``'s first true value, polled until ``limit_s`` seconds have passed.

    Fails when ``proc`` (if given) ends first, or with ``what`` when time runs out.
    """
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        assert proc is None or proc.poll() is None, f"the run ended before {what}"
        time.sleep(0.02)
    raise AssertionError(f"no {what} within {limit_s} s")


def wait_for(pattern: str, where: Path, proc: subprocess.Popen, limit_s: float) -> Path:
    """The first path under ``where`` that matches ``pattern``, once one exists.

    Fails when ``proc`` ends first or nothing matches within ``limit_s`` seconds.
    """
    hits = wait_until(
        lambda: sorted(where.glob(pattern)), limit_s, f"{pattern} under {where}", proc
    )
    return hits[0]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def last_step(metrics: Path) -> int:
    """The step of the last complete line of a run's ``metrics.jsonl`` (0 before the first)."""
    text = metrics.read_text() if metrics.exists() else ""
    lines = text[: text.rfind("\n") + 1].splitlines()  # a line being written is not one yet
    return json.loads(lines[-1])["step"] if lines else 0
