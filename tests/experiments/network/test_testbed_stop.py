"""Teardown on SIGTERM and SIGINT: the shared handler, and real entry points killed mid-run.

The first tests run the handler in a subprocess of its own; the others (as root, with
network namespaces; skipped without) start ``calibrate run``, ``wire_study run`` and
``testbed run --hosts`` for real, send SIGTERM once the hosts' launchers run, and check
that the namespaces and every process that ran in them are gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments.network import testbed as tb
from experiments.network.testbed.hosts import netns_pids
from tests.support.launch import ROOT, clean_env

# the handler under test, with a teardown that takes a while (a second signal must not cut it)
_PROGRAM = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from experiments.network.testbed import Interrupted, teardown_on_signals

    marks = Path(sys.argv[1])
    try:
        with teardown_on_signals():
            try:
                print("ready", flush=True)
                time.sleep(60)
            finally:
                (marks / "teardown-began").touch()
                time.sleep(1.0)
                (marks / "teardown-ended").touch()
    except Interrupted as exc:
        print(exc, flush=True)
        sys.exit(128 + exc.signum)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_runs_the_teardown_to_its_end(sig: signal.Signals, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROGRAM, str(tmp_path)],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        deadline = time.monotonic() + 10
        while not (tmp_path / "teardown-began").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(sig)  # a second one, during the teardown: ignored
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "teardown-ended").exists()
    assert proc.returncode == 128 + sig
    assert out.strip() == f"stopped by {sig.name}"


def test_outside_the_main_thread_nothing_is_installed() -> None:
    import threading

    seen: list[object] = []

    def body() -> None:
        with tb.teardown_on_signals():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before]
    with tb.teardown_on_signals():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


# ------------------------------------------------------------------ real entry points


def _namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{prefix}-")]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def _kill_all(namespaces: list[str], pids: set[int]) -> None:
    """SIGKILL the processes in ``namespaces`` and ``pids`` until none is left (workers that a
    launcher starts meanwhile included)."""
    for _ in range(100):
        live = {p for ns in namespaces for p in netns_pids(ns)} | {p for p in pids if _alive(p)}
        if not live:
            return
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _entry(name: str, prefix: str, out: Path) -> list[str]:
    if name == "calibrate":
        return [sys.executable, "-m", "experiments.network.calibrate", "run", "--rates", "5mbit",
                "--sizes", "851968", "--reps", "400", "--prefix", prefix, "--out", str(out)]  # fmt: skip
    if name == "testbed":
        return [sys.executable, "-m", "experiments.network.testbed", "--prefix", prefix, "run",
                "--hosts", "2", "--rate", "5mbit", "--out", str(out), "--port", "29417", "--",
                "train.max_steps=100000", "logger=none"]  # fmt: skip
    return [sys.executable, "-m", "experiments.network.wire_study", "run", "--hosts", "2",
            "--rates", "5mbit", "--arms", "ring", "--no-emulated", "--prefix", prefix,
            "--out", str(out), "--", "train.max_steps=100000"]  # fmt: skip


# builds hosts and starts torchrun on each, stopped as soon as they run: a second or two
@pytest.mark.parametrize("entry", ["calibrate", "wire_study", "testbed"])
def test_sigterm_tears_down_hosts_and_their_launchers(entry: str, tmp_path: Path) -> None:
    why = tb.missing()
    if why is not None:
        pytest.skip(why)
    prefix = f"ddps{entry[0]}"
    proc = subprocess.Popen(
        _entry(entry, prefix, tmp_path / "out"),
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        hosts: list[str] = []
        # up, and every host's launcher running: the moment a kill must not leave anything
        while time.monotonic() < deadline and proc.poll() is None:
            state = tb.read_state(prefix)
            if state and state.get("complete"):
                hosts = [ns for ns in _namespaces(prefix) if ns != f"{prefix}-sw"]
                pids = [netns_pids(ns) for ns in hosts]
                seen.update(p for ps in pids for p in ps)
                if hosts and all(pids):
                    break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert hosts and seen, "the hosts' launchers never started"
        time.sleep(0.5)
        seen.update(p for ns in hosts for p in netns_pids(ns))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        err = "the entry point did not end within 90 s of SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        state = tb.read_state(prefix)
        leftover = _namespaces(prefix)
        for ns in leftover:  # torchrun's workers too, in sessions of their own
            seen.update(netns_pids(ns))
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        running = [p for p in seen if _alive(p)]
        _kill_all(leftover, seen)  # what a failed teardown left: the test's own clean-up
        if leftover or state is not None:
            tb.down(prefix)
    assert running == [], "the hosts' processes outlived the entry point"
    assert leftover == [] and state is None, "the namespaces outlived the entry point"
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM" in err
