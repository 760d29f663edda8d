"""What losing a host costs with ``fault_tolerance=torchft``: kill one, restart it, measure.

``python -m experiments.bench.elastic_faults --hosts 4 --kill-step 20 --restart-after 10``
starts a torchft lighthouse on loopback and one ``train.py fault_tolerance=torchft``
process per host (``log.every=1``, so every step has a timed metrics line), kills
one host outright (SIGKILL) once its metrics show ``--kill-step``, starts it again
``--restart-after`` seconds later with the same replica id and, with
``--uninterrupted``, runs the same job without the fault too. From the metrics
lines it reports, per run:

- ``survivor_gap_s``: the longest wait between two consecutive steps of any
  survivor around the kill (what the kill cost a survivor);
- ``survivor_steps_lost``: steps a survivor did not complete (it must finish all);
- ``rejoin_s``: from the restart to the restarted host's first completed step;
- ``healed_from`` and ``healed_to_step``: its source and the step it continued at;
- each host's final ``train/loss``, ``eval/acc_local`` and throughput
  (``perf/samples_per_s``, the mean of its metrics windows), and the hosts' mean.

Without ``--testbed`` the hosts share this machine's loopback (not a capped
wire). With ``--testbed RATE`` (as root) each host is a testbed namespace
whose link is capped at ``RATE`` (:mod:`experiments.network.testbed`), the
lighthouse runs on host 0 (``torchft_lighthouse``) and a kill is of every
process in the victim's namespace, as a power cut; the testbed is built for
the run and torn down after. Either way the seconds are this machine's, under
whatever else it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.bench.options import add_options

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for raw in path.read_text().splitlines():
        try:
            out.append(json.loads(raw))
        except json.JSONDecodeError:  # a line being written
            continue
    return out


def _launch(
    rid: str, lh: str, out: Path, args: argparse.Namespace, bed: Any = None
) -> subprocess.Popen:
    i = int(rid[1:])
    host = "127.0.0.1"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    prefix: list[str] = []
    if bed is not None:
        from experiments.network import testbed as tb
        from experiments.network.testbed.launch import host_env

        host = tb.address(i)
        env = host_env(i, bed, {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
        prefix = ["ip", "netns", "exec", tb.host_ns(i, bed.prefix)]
    cmd = [
        *prefix,
        sys.executable,
        str(ROOT / "train.py"),
        "fault_tolerance=torchft",
        f"fault_tolerance.lighthouse={lh}",
        f"fault_tolerance.replica_id={rid}",
        f"fault_tolerance.min_replicas={args.min_replicas}",
        f"fault_tolerance.timeout_s={args.timeout_s}",
        f"fault_tolerance.quorum_every={args.quorum_every}",
        f"fault_tolerance.host={host}",
        f"topology={args.topology}",
        "logger=none",
        f"train.max_steps={args.steps}",
        f"train.seed={args.seed}",
        "log.every=1",
        "checkpoint.on_signal=false",
        f"hydra.run.dir={out}",
        *args.overrides,
    ]
    log = open(out.parent / f"{out.name}-{rid}.log", "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


class _Lighthouse:
    """torchft's lighthouse: in this process on loopback, or ``torchft_lighthouse`` on host 0."""

    def __init__(self, args: argparse.Namespace, bed: Any) -> None:
        flags = dict(
            min_replicas=args.min_replicas,
            join_timeout_ms=int(args.join_timeout_ms),
            heartbeat_timeout_ms=int(args.heartbeat_timeout_ms),
        )
        self.proc: subprocess.Popen | None = None
        self.server: Any = None
        if bed is None:
            from torchft._torchft import LighthouseServer

            self.server = LighthouseServer(bind="127.0.0.1:0", **flags)
            self.address = f"http://127.0.0.1:{self.server.address().rsplit(':', 1)[1]}"
            return
        from experiments.network import testbed as tb

        binary = Path(sys.executable).with_name("torchft_lighthouse")
        cmd = [
            "ip",
            "netns",
            "exec",
            tb.host_ns(0, bed.prefix),
            str(binary),
            "--bind",
            "0.0.0.0:29510",
        ]
        cmd += [f"--{k}={v}" for k, v in flags.items()]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.address = f"http://{tb.address(0)}:29510"

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def _kill(proc: subprocess.Popen, rid: str, bed: Any) -> None:
    """Kill a host outright: its process, or on the testbed every process of its namespace."""
    if bed is None:
        proc.send_signal(signal.SIGKILL)
        return
    from experiments.network.testbed.hosts import host_ns, netns_pids

    lighthouse_host = rid == "h0"
    for pid in netns_pids(host_ns(int(rid[1:]), bed.prefix)):
        if lighthouse_host and pid != proc.pid and _is_lighthouse(pid):
            continue  # the lighthouse on host 0 is not the host under test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _is_lighthouse(pid: int) -> bool:
    try:
        return "torchft_lighthouse" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


class Tail:
    """Every metrics line a file has shown while it was watched, in the order they came.

    A job restarted from a checkpoint drops the lines logged after it from its
    ``metrics.jsonl`` (docs/recovery.md); the lines seen before that are kept here.
    With ``stamp``, a line without ``time`` (``train.py``'s non-elastic lines carry only
    ``time_s`` since their attempt's start) gets the time it was read at as ``time``.
    """

    def __init__(self, path: Path, stamp: bool = False) -> None:
        self.path = path
        self.stamp = stamp
        self.lines: list[dict[str, Any]] = []
        self._seen: set[str] = set()
        self._offset = 0

    def poll(self) -> list[dict[str, Any]]:
        """Read what is new; return all lines seen so far."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return self.lines
        if size < self._offset:  # rewritten shorter: read it again, keep the lines seen
            self._offset = 0
        if size == self._offset:
            return self.lines
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # a line being written waits for the next poll
        self._offset += end
        for raw in chunk[:end].decode(errors="replace").splitlines():
            if raw in self._seen:
                continue
            self._seen.add(raw)
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if self.stamp and "time" not in line and "step" in line:
                line["time"] = time.time()
            self.lines.append(line)
        return self.lines


def last_step(lines: list[dict[str, Any]]) -> int:
    """The highest step among the timed metrics lines (0 without any)."""
    return max((int(x["step"]) for x in lines if "time" in x), default=0)


def drive(
    launch: Callable[[str], subprocess.Popen],
    rids: list[str],
    *,
    victim: str | None,
    victim_step: Callable[[], int],
    kill: Callable[[str, subprocess.Popen], None],
    kill_step: int,
    restart_after: float,
    limit_s: float,
    poll: Callable[[], None] = lambda: None,
    relaunch_all: bool = False,
) -> dict[str, float | None]:
    """Start one process per host; with a ``victim``, kill it at ``kill_step`` and start it again.

    Args:
        launch: Starts host ``rid``'s process (again, for the restart).
        rids: The hosts.
        victim: The host to kill, or ``None`` for the uninterrupted run.
        victim_step: The step the victim has logged (read at each poll).
        kill: Kills a host outright (its process, or all of its processes).
        kill_step: Kill once ``victim_step()`` reaches it.
        restart_after: Seconds from the kill to the victim's new start.
        limit_s: The whole run's limit; what is left then is killed.
        poll: Called every poll (e.g. :meth:`Tail.poll` of each file).
        relaunch_all: Start every host again, not only the victim, once all have exited
            (a non-elastic job: the survivors stop on their own, and the whole job is
            started again as ``docs/recovery.md`` says), ``restart_after`` after the kill
            at the earliest.

    Returns:
        ``t_start``, ``t_kill``, ``t_restart`` and ``t_end`` (``time.time()``; ``None`` if not).
    """
    t_start = time.time()
    procs = {rid: launch(rid) for rid in rids}
    t_kill = t_restart = None
    try:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            poll()
            if victim is not None and t_kill is None and victim_step() >= kill_step:
                kill(victim, procs[victim])
                t_kill = time.time()
            late = t_kill is not None and time.time() - t_kill >= restart_after
            if victim is not None and late and t_restart is None:
                if not relaunch_all:
                    procs[victim].wait()
                    procs[victim] = launch(victim)
                    t_restart = time.time()
                elif all(p.poll() is not None for p in procs.values()):
                    procs = {rid: launch(rid) for rid in rids}
                    t_restart = time.time()
            if all(p.poll() is not None for p in procs.values()) and (victim is None or t_restart):
                break
            time.sleep(0.05)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        poll()
    return {"t_start": t_start, "t_kill": t_kill, "t_restart": t_restart, "t_end": time.time()}


def run_once(args: argparse.Namespace, out: Path, fault: bool, bed: Any = None) -> dict[str, Any]:
    """One job of ``args.hosts`` hosts, with or without the kill and restart."""
    lighthouse = _Lighthouse(args, bed)
    rids = [f"h{i}" for i in range(args.hosts)]
    victim = rids[args.victim]
    try:
        times = drive(
            lambda rid: _launch(rid, lighthouse.address, out, args, bed),
            rids,
            victim=victim if fault else None,
            victim_step=lambda: last_step(_lines(out / victim / "metrics.jsonl")),
            kill=lambda rid, proc: _kill(proc, rid, bed),
            kill_step=args.kill_step,
            restart_after=args.restart_after,
            limit_s=args.limit_s,
        )
    finally:
        lighthouse.close()
    t_kill, t_restart = times["t_kill"], times["t_restart"]
    return _measure(out, rids, victim if fault else None, t_kill, t_restart, args.steps)


def _measure(
    out: Path,
    rids: list[str],
    victim: str | None,
    t_kill: float | None,
    t_restart: float | None,
    steps: int,
) -> dict[str, Any]:
    lines = {rid: _lines(out / rid / "metrics.jsonl") for rid in rids}
    summaries = {}
    for rid in rids:
        path = out / rid / "summary.json"
        summaries[rid] = json.loads(path.read_text()) if path.exists() else {}
    return measure(lines, summaries, victim, t_kill, t_restart, steps)


def measure(
    lines: dict[str, list[dict[str, Any]]],
    summaries: dict[str, dict[str, Any]],
    victim: str | None,
    t_kill: float | None,
    t_restart: float | None,
    steps: int,
) -> dict[str, Any]:
    """What the kill cost, from each host's metrics lines and summary.

    Args:
        lines: Each host's metrics lines (timed step lines carry ``time`` and ``train/loss``;
            a heal is a line with ``elastic/change``).
        summaries: Each host's ``summary.json`` (``steps`` and its ``eval/*`` values).
        victim: The host killed, or ``None`` for an uninterrupted run.
        t_kill: When it was killed (``time.time()``).
        t_restart: When it was started again.
        steps: The run's steps.

    Returns:
        ``hosts`` (per host: ``final_loss``, eval values, ``steps``, ``samples_per_s``; a
        survivor's ``gap_s``, ``steps_lost`` and ``step_at_kill``; the victim's ``rejoin_s``
        and heal), the hosts' mean ``samples_per_s``, the worst survivor's
        ``survivor_gap_s`` and ``survivor_steps_lost``, and ``rejoin_s``.
    """
    result: dict[str, Any] = {"hosts": {}}
    for rid, own in lines.items():
        timed = [x for x in own if "time" in x and "train/loss" in x]
        summary = summaries.get(rid, {})
        host: dict[str, Any] = {
            "final_loss": timed[-1]["train/loss"] if timed else None,
            **{k: v for k, v in summary.items() if k.startswith("eval/")},
            "steps": summary.get("steps"),
            # the mean of its metrics windows (train.py's; the torchft clients log none)
            "samples_per_s": summary.get("perf/samples_per_s"),
        }
        if victim is not None and rid != victim and t_kill is not None:
            after = [x for x in timed if x["time"] > t_kill - 5]
            gaps = [b["time"] - a["time"] for a, b in zip(after, after[1:])]
            host["gap_s"] = max(gaps) if gaps else None
            # every step from the last one before the kill to the end has its line
            done = {x["step"] for x in timed}
            at_kill = max((x["step"] for x in timed if x["time"] <= t_kill), default=0)
            host["steps_lost"] = len(set(range(at_kill, steps + 1)) - done)
            host["step_at_kill"] = at_kill
        if rid == victim and t_restart is not None:
            change = [
                x["elastic/change"]
                for x in own
                if "elastic/change" in x
                and (x["elastic/change"].get("healed_from") or x["elastic/change"].get("healed"))
            ]
            healed_to = 0
            if change:
                last = change[-1]
                if last.get("healed_from"):
                    host["healed_from"] = last["healed_from"]
                host["healed_to_step"] = healed_to = int(last["step"])
            # taking part: its first step after the restart, from the step it healed to on
            later = [x for x in timed if x["time"] > t_restart and x["step"] >= healed_to]
            host["rejoin_s"] = later[0]["time"] - t_restart if later else None
        result["hosts"][rid] = host
    rates = [h["samples_per_s"] for h in result["hosts"].values() if h["samples_per_s"]]
    result["samples_per_s"] = sum(rates) / len(rates) if rates else None  # per host
    survivors = [h for r, h in result["hosts"].items() if victim is not None and r != victim]
    if survivors:
        result["survivor_gap_s"] = max(h["gap_s"] or 0.0 for h in survivors)
        result["survivor_steps_lost"] = max(h["steps_lost"] for h in survivors)
    if victim is not None:
        result["rejoin_s"] = result["hosts"][victim].get("rejoin_s")
        result["t_kill"], result["t_restart"] = t_kill, t_restart
    return result


def measure_again(out: Path, victim: str, t_kill: float, t_restart: float, steps: int) -> dict:
    """:func:`_measure` on a finished run's files (``--measure``)."""
    rids = sorted(p.name for p in out.iterdir() if (p / "metrics.jsonl").exists())
    return _measure(out, rids, victim, t_kill, t_restart, steps)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_options(
        p, hosts=4, topology="ring", steps=60, quorum_every=5, min_replicas=2, timeout_s=20.0
    )
    # above timeout_s, below twice it (decent_dp.elastic._quorum.QUORUM_TIMEOUTS)
    add_options(p, join_timeout_ms=30000, heartbeat_timeout_ms=2000)
    add_options(p, kill_step=20, victim=2, restart_after=10.0, seed=0)
    p.add_argument("--uninterrupted", action="store_true", help="also run without the fault")
    add_options(p, limit_s=900.0)
    p.add_argument("--out", type=Path, default=Path("outputs/elastic_faults"))
    p.add_argument("--testbed", metavar="RATE", help="run on testbed hosts with links of RATE")
    p.add_argument(
        "--measure",
        nargs=3,
        metavar=("RUN_DIR", "T_KILL", "T_RESTART"),
        help="only measure a finished fault run's directory (kill and restart times in s)",
    )
    p.add_argument("overrides", nargs="*", help="more train.py overrides")
    args = p.parse_args(argv)
    if args.measure:
        run, t_kill, t_restart = args.measure
        victim = f"h{args.victim}"
        result = measure_again(Path(run), victim, float(t_kill), float(t_restart), args.steps)
        print(json.dumps(result, indent=2))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    with contextlib.ExitStack() as stack:
        bed = None
        if args.testbed:
            from experiments.network import testbed as tb

            spec = tb.Spec(hosts=args.hosts, rate_bps=tb.parse_rate(args.testbed), prefix="ddpel")
            bed = stack.enter_context(tb.testbed(spec))
        name = f"{args.topology}-s{args.seed}"
        report["fault"] = run_once(args, args.out / f"fault-{name}", True, bed)
        if args.uninterrupted:
            report["uninterrupted"] = run_once(args, args.out / f"clean-{name}", False, bed)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
