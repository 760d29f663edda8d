"""A command's wall time and the memory of its process tree, polled from ``/proc``.

:func:`watch` runs a command and, every ``poll_s`` seconds until it exits, walks the tree
below it (``/proc/<pid>/task/*/children``, recursively) and reads each process's
``/proc/<pid>/status``: ``VmHWM`` (the kernel's high-water mark of resident memory, kept
per process, its last value seen), and the sums over the tree of ``VmRSS`` and ``RssAnon``
(their largest values at one poll). Nothing in the watched program changes. Linux only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Watched", "watch", "tree"]

# a launcher's variables: a bench started under torchrun must not pass its own rank on
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _status_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon"):
            out[key] = int(value.split()[0])
    return out


def tree(root: int) -> list[int]:
    """``root`` and every process below it now (children of any of their threads)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # exited meanwhile
            continue
    return found


@dataclass
class Watched:
    """What :func:`watch` saw of one command: exit status, seconds, memory in kB."""

    returncode: int
    wall_s: float
    hwm_kb: dict[int, int]
    rss_peak_kb: int
    anon_peak_kb: int
    root: int


def watch(
    cmd: list[str],
    cwd: Path,
    log: Path,
    poll_s: float,
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> Watched:
    """Run ``cmd`` in ``cwd``, output into ``log``, polling its memory.

    Args:
        cmd: The command line.
        cwd: Where it runs; also put first on its ``PYTHONPATH``.
        log: Where its stdout and stderr go.
        poll_s: Seconds between two polls of the process tree.
        timeout_s: Seconds before the tree is killed.
        env: Variables set on top of this process's environment (less torchrun's).

    Returns:
        Its exit status, wall seconds and memory.

    Raises:
        subprocess.TimeoutExpired: If it runs past ``timeout_s``.
    """
    full = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), full.get("PYTHONPATH")]))
    full.update(env or {})
    hwm: dict[int, int] = {}
    rss_peak = anon_peak = 0
    with log.open("w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=full, stdout=out, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                if time.perf_counter() - start > timeout_s:
                    raise subprocess.TimeoutExpired(cmd, timeout_s)
                rss = anon = 0
                for pid in tree(proc.pid):
                    try:
                        kb = _status_kb(pid)
                    except OSError:
                        continue
                    rss += kb.get("VmRSS", 0)
                    anon += kb.get("RssAnon", 0)
                    hwm[pid] = max(hwm.get(pid, 0), kb.get("VmHWM", 0))
                rss_peak, anon_peak = max(rss_peak, rss), max(anon_peak, anon)
                time.sleep(poll_s)
        finally:
            # a timeout, Ctrl-C or SIGTERM of the bench must not leave a job training
            if proc.poll() is None:
                for pid in reversed(tree(proc.pid)):
                    _kill(pid)
                proc.wait()
        wall = time.perf_counter() - start
    return Watched(proc.returncode, wall, hwm, rss_peak, anon_peak, proc.pid)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited meanwhile
        os.kill(pid, signal.SIGKILL)
