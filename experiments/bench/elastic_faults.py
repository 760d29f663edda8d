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
- each host's final ``train/loss`` and ``eval/acc_local``.

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
from pathlib import Path
from typing import Any

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


def run_once(args: argparse.Namespace, out: Path, fault: bool, bed: Any = None) -> dict[str, Any]:
    """One job of ``args.hosts`` hosts, with or without the kill and restart."""
    lighthouse = _Lighthouse(args, bed)
    lh = lighthouse.address
    rids = [f"h{i}" for i in range(args.hosts)]
    victim = rids[args.victim]
    procs = {rid: _launch(rid, lh, out, args, bed) for rid in rids}
    t_kill = t_restart = None
    try:
        deadline = time.monotonic() + args.limit_s
        while time.monotonic() < deadline:
            if fault and t_kill is None:
                steps = [x["step"] for x in _lines(out / victim / "metrics.jsonl") if "time" in x]
                if steps and max(steps) >= args.kill_step:
                    _kill(procs[victim], victim, bed)
                    t_kill = time.time()
            late = t_kill is not None and time.time() - t_kill >= args.restart_after
            if fault and late and t_restart is None:
                procs[victim].wait()
                procs[victim] = _launch(victim, lh, out, args, bed)
                t_restart = time.time()
            if all(p.poll() is not None for p in procs.values()) and (not fault or t_restart):
                break
            time.sleep(0.05)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        lighthouse.close()
    return _measure(out, rids, victim if fault else None, t_kill, t_restart, args.steps)


def _measure(
    out: Path,
    rids: list[str],
    victim: str | None,
    t_kill: float | None,
    t_restart: float | None,
    steps: int,
) -> dict[str, Any]:
    result: dict[str, Any] = {"hosts": {}}
    for rid in rids:
        lines = _lines(out / rid / "metrics.jsonl")
        timed = [x for x in lines if "time" in x and "train/loss" in x]
        summary_path = out / rid / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        host: dict[str, Any] = {
            "final_loss": timed[-1]["train/loss"] if timed else None,
            "eval/acc_local": summary.get("eval/acc_local"),
            "steps": summary.get("steps"),
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
            later = [x for x in timed if x["time"] > t_restart]
            host["rejoin_s"] = later[0]["time"] - t_restart if later else None
            change = [
                x["elastic/change"]
                for x in lines
                if "elastic/change" in x and x["elastic/change"].get("healed_from")
            ]
            if change:
                host["healed_from"] = change[-1]["healed_from"]
                host["healed_to_step"] = change[-1]["step"]
        result["hosts"][rid] = host
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
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--topology", default="ring")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--quorum-every", type=int, default=5)
    p.add_argument("--min-replicas", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=20.0)
    # above timeout_s, below twice it (decent_dp._elastic_quorum.QUORUM_TIMEOUTS)
    p.add_argument("--join-timeout-ms", type=int, default=30000)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=2000)
    p.add_argument("--kill-step", type=int, default=20)
    p.add_argument("--victim", type=int, default=2)
    p.add_argument("--restart-after", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--uninterrupted", action="store_true", help="also run without the fault")
    p.add_argument("--limit-s", type=float, default=900.0)
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
