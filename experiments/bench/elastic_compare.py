"""One fault, six ways of surviving it: elastic gossip beside restart, torchft DDP and DiLoCo.

``python -m experiments.bench.elastic_compare --methods gossip-ring,restart,torchft-ddp
--task digits --seeds 0,1,2 --out docs/results/elastic/compare`` runs, per method
and seed, a job of ``--hosts`` hosts on this machine's loopback with one host
(``h2``) killed outright (SIGKILL) once the job has logged ``--kill-step`` and
started again ``--restart-after`` seconds later, and the same job uninterrupted.
It writes one JSON per run (``<task>-<method>-s<seed>-<fault|clean>.json``),
skips a run whose JSON exists, and prints a line per run. The methods:

- ``gossip-ring``, ``gossip-one-peer-exp``: ``train.py fault_tolerance=torchft``
  (:mod:`experiments.bench.elastic_faults` launches them);
- ``restart``: today's non-elastic gossip (``topology=ring``,
  ``checkpoint.every_steps``), one ``torchrun --nnodes=H`` per host on a c10d
  rendezvous: the survivors stop on their own (one line naming the lost peer), and
  once they have, ``--restart-after`` after the kill at the earliest, the whole job
  is started again in its run directory and resumes from the newest checkpoint,
  as docs/recovery.md says for a dead host (torchrun's ``--max-restarts`` on the
  survivors did not re-form the rendezvous with the killed host's new torchrun
  here: the new round timed out after 60 s waiting for its ``role_info`` keys);
- ``torchft-ddp``, ``torchft-diloco``: torchft's own trainers on the same workload
  (:mod:`experiments.bench.torchft_clients`); ``torchft-allreduce``: torchft's Manager
  and optimizer wrapper with the gradients averaged by ``Manager.allreduce`` instead
  of torchft's DDP wrapper (which does not survive a peer dying in its all-reduce).

Measures (:func:`experiments.bench.elastic_faults.measure`; for ``restart``
:func:`measure_restart`): ``survivor_gap_s`` (the longest wait between two
steps a survivor logged from 5 s before the kill on), ``survivor_steps_lost``
(for ``restart``: the steps recomputed after the resume), ``rejoin_s`` (from the
restart to the restarted host's first step from the state it healed to on),
each host's final ``train/loss`` (its last batch) and ``eval/*``, and
``wall_s`` (from the launch to the last host's exit). A torchrun job logs rank
0 only, so ``restart``'s hosts are one: the job.
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

from experiments.bench import elastic_faults as ef
from experiments.bench.options import add_options

ROOT = ef.ROOT
METHODS = (
    "gossip-ring",
    "gossip-one-peer-exp",
    "restart",
    "torchft-ddp",
    "torchft-allreduce",
    "torchft-diloco",
)
# per task: train.py overrides, steps, the kill step, restart's checkpoint interval
TASKS: dict[str, dict[str, Any]] = {
    "digits": {"overrides": [], "steps": 1500, "kill_step": 500, "every": 200},
    "gpt": {
        "overrides": ["experiment=lm_quick", "dataset.root=data/stdlib-bpe", "log.every=1"],
        "steps": 90,
        "kill_step": 30,
        "every": 20,
    },
}
VICTIM = "h2"


def run_name(task: str, method: str, seed: int, fault: bool) -> str:
    return f"{task}-{method}-s{seed}-{'fault' if fault else 'clean'}"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _popen(cmd: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        # a session of its own: the kill reaches the launcher's children too
        return subprocess.Popen(
            cmd, env=_env(), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill a host outright: its launcher and every process under it, at once."""
    for pid in descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _worker_rank(proc: subprocess.Popen) -> int | None:
    """The ``RANK`` of the torchrun worker under a launcher (from its environment)."""
    for pid in descendants(proc.pid)[1:]:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                return int(kv[5:])
    return None


class Job:
    """One run of one method: its launcher per host, its files and how to read them."""

    def __init__(self, method: str, task: str, seed: int, args: argparse.Namespace, out: Path):
        self.method, self.task, self.seed, self.args, self.out = method, task, seed, args, out
        spec = TASKS[task]
        self.steps = args.steps or spec["steps"]
        self.kill_step = args.kill_step or spec["kill_step"]
        self.every = spec["every"]
        self.overrides = [*spec["overrides"], f"train.max_steps={self.steps}", f"train.seed={seed}"]
        self.rids = [f"h{i}" for i in range(args.hosts)]
        self.port = args.port + seed * 10 + METHODS.index(method)  # rendezvous of ``restart``
        self.launches: dict[str, int] = {}

    # ---- launch
    def launch(self, rid: str, lighthouse: str | None) -> subprocess.Popen:
        log = self.out.parent / f"{self.out.name}-{rid}.log"
        if self.method.startswith("gossip-"):
            ns = argparse.Namespace(
                **{
                    **vars(self.args),
                    "topology": self.method.removeprefix("gossip-"),
                    "steps": self.steps,
                    "seed": self.seed,
                    "overrides": list(TASKS[self.task]["overrides"]),
                }
            )
            return ef._launch(rid, str(lighthouse), self.out, ns)
        if self.method.startswith("torchft-"):
            client = "diloco_train" if self.method == "torchft-diloco" else "ddp_train"
            cmd = [
                sys.executable,
                "-m",
                f"experiments.bench.torchft_clients.{client}",
                f"--lighthouse={lighthouse}",
                f"--replica-id={rid}",
                f"--run-dir={self.out}",
                f"--min-replicas={self.args.min_replicas}",
                f"--timeout-s={self.args.timeout_s}",
                f"--sync-every={self.args.sync_every}",
                f"--grad-sync={'allreduce' if self.method == 'torchft-allreduce' else 'ddp'}",
                *self.overrides,
            ]
            return _popen(cmd, log)
        i = int(rid[1:])
        attempt = self.launches[rid] = self.launches.get(rid, -1) + 1
        torchrun = Path(sys.executable).with_name("torchrun")
        cmd = [
            str(torchrun),
            f"--nnodes={self.args.hosts}",
            "--nproc_per_node=1",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{self.port + 100 * attempt}",
            f"--rdzv_id=compare-{self.out.name}-{attempt}",
            f"--rdzv_conf=is_host={int(i == 0)}",
            # one loopback address per host: the rendezvous ranks hosts by address
            f"--local_addr=127.0.0.{i + 1}",
            "--max-restarts=0",
            str(ROOT / "train.py"),
            "topology=ring",
            f"checkpoint.every_steps={self.every}",
            "checkpoint.on_signal=false",
            f"dist.timeout_s={int(self.args.timeout_s)}",
            "logger=none",
            "log.every=1",
            "log.progress=false",
            "log.consensus_every=0",
            "log.consensus_sketch=0",
            f"hydra.run.dir={self.out}",
            *self.overrides,
        ]
        return _popen(cmd, log)

    # ---- run
    def run(self, fault: bool) -> dict[str, Any]:
        restart = self.method == "restart"
        lighthouse = None if restart else ef._Lighthouse(self.args, None)
        address = None if lighthouse is None else lighthouse.address
        files = (
            [self.out / "metrics.jsonl"]
            if restart
            else [self.out / rid / "metrics.jsonl" for rid in self.rids]
        )
        tails = {f: ef.Tail(f, stamp=restart) for f in files}
        watched = tails[files[0]] if restart else tails[self.out / VICTIM / "metrics.jsonl"]
        victim_rank: list[int | None] = []

        def kill(rid: str, proc: subprocess.Popen) -> None:
            if restart:
                victim_rank.append(_worker_rank(proc))
            kill_tree(proc)

        try:
            times = ef.drive(
                lambda rid: self.launch(rid, address),
                self.rids,
                victim=VICTIM if fault else None,
                victim_step=lambda: ef.last_step(watched.lines),
                kill=kill,
                kill_step=self.kill_step,
                restart_after=self.args.restart_after,
                limit_s=self.args.limit_s,
                poll=lambda: [t.poll() for t in tails.values()] and None,
                relaunch_all=restart,
            )
        finally:
            if lighthouse is not None:
                lighthouse.close()
        t_kill, t_restart = times["t_kill"], times["t_restart"]
        if restart:
            summary = _read_json(self.out / "summary.json")
            result = measure_restart(watched.lines, summary, t_kill, t_restart, self.steps)
            if victim_rank:
                result["victim_rank"] = victim_rank[0]
        else:
            lines = {rid: tails[self.out / rid / "metrics.jsonl"].lines for rid in self.rids}
            summaries = {rid: _read_json(self.out / rid / "summary.json") for rid in self.rids}
            result = ef.measure(
                lines, summaries, VICTIM if fault else None, t_kill, t_restart, self.steps
            )
        assert times["t_start"] is not None and times["t_end"] is not None
        result["wall_s"] = times["t_end"] - times["t_start"]
        return result


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def measure_restart(
    lines: list[dict[str, Any]],
    summary: dict[str, Any],
    t_kill: float | None,
    t_restart: float | None,
    steps: int,
) -> dict[str, Any]:
    """What the kill cost a job restarted from its checkpoint, from rank 0's lines as they came.

    The lines hold those the resume dropped from ``metrics.jsonl``. The resume is the
    first timed line whose step is not above the one before it; the steps lost are those
    computed before it and again after it.

    Args:
        lines: Rank 0's metrics lines in the order they were written (:class:`Tail`).
        summary: The job's ``summary.json``.
        t_kill: When the host was killed (``None``: uninterrupted).
        t_restart: When it was started again.
        steps: The run's steps.

    Returns:
        ``hosts`` (one: ``job``), and with a kill ``survivor_gap_s``, ``survivor_steps_lost``,
        ``resumed_from_step`` and ``rejoin_s``.
    """
    timed = [x for x in lines if "time" in x and "train/loss" in x]
    job: dict[str, Any] = {
        "final_loss": timed[-1]["train/loss"] if timed else None,
        **{k: v for k, v in summary.items() if k.startswith("eval/") and v is not None},
        "steps": summary.get("train/steps"),
        "restarts": summary.get("restarts"),
    }
    result: dict[str, Any] = {"hosts": {"job": job}}
    if t_kill is None:
        return result
    after = [x for x in timed if x["time"] > t_kill - 5]
    gaps = [b["time"] - a["time"] for a, b in zip(after, after[1:])]
    result["survivor_gap_s"] = max(gaps) if gaps else None
    resumed = next(
        (i for i in range(1, len(timed)) if timed[i]["step"] <= timed[i - 1]["step"]), None
    )
    if resumed is None:  # no resume seen: every step after the kill's is missing
        reached = ef.last_step(timed)
        result["survivor_steps_lost"] = steps - reached
    else:
        before = timed[resumed - 1]["step"]
        result["resumed_from_step"] = timed[resumed]["step"] - 1
        result["survivor_steps_lost"] = before - result["resumed_from_step"]
        result["step_at_failure"] = before
    if t_restart is not None:
        later = [x for x in timed[resumed or len(timed) :] if x["time"] > t_restart]
        result["rejoin_s"] = later[0]["time"] - t_restart if later else None
    result["t_kill"], result["t_restart"] = t_kill, t_restart
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--task", choices=sorted(TASKS), default="digits")
    add_options(p, seeds="0", hosts=4)
    p.add_argument("--steps", type=int, default=0, help="0: the task's")
    p.add_argument("--kill-step", type=int, default=0, help="0: the task's")
    add_options(p, restart_after=5.0, quorum_every=10)
    p.add_argument("--sync-every", type=int, default=10, help="torchft DiLoCo's H")
    add_options(p, min_replicas=2, timeout_s=20.0, join_timeout_ms=20000)
    add_options(p, heartbeat_timeout_ms=2000, limit_s=900.0)
    p.add_argument("--port", type=int, default=29620, help="restart's rendezvous ports from here")
    p.add_argument("--faults", default="fault,clean", help="fault, clean or both")
    p.add_argument("--out", type=Path, default=Path("docs/results/elastic/compare"))
    p.add_argument("--runs", type=Path, default=Path("outputs/elastic_compare"))
    args = p.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        p.error(f"--methods: {','.join(bad)} unknown; allowed: {','.join(METHODS)}")
    faults = [f for f in args.faults.split(",") if f]
    if not faults or any(f not in ("fault", "clean") for f in faults):
        p.error(f"--faults={args.faults}: allowed fault, clean or fault,clean")
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    for seed in [int(s) for s in args.seeds.split(",") if s]:
        for method in methods:
            for fault in [f == "fault" for f in faults]:
                name = run_name(args.task, method, seed, fault)
                dest = args.out / f"{name}.json"
                if dest.exists():
                    print(f"{name}: done before, skipped", flush=True)
                    continue
                run_dir = args.runs / f"{name}-{int(time.time())}"
                job = Job(method, args.task, seed, args, run_dir)
                load = os.getloadavg()[0]
                result = job.run(fault)
                report = {
                    "method": method,
                    "task": args.task,
                    "seed": seed,
                    "fault": fault,
                    "steps": job.steps,
                    "kill_step": job.kill_step if fault else None,
                    "load_avg_1m": [load, os.getloadavg()[0]],
                    "args": {k: str(v) for k, v in vars(args).items()},
                    **result,
                }
                dest.write_text(json.dumps(report, indent=1) + "\n")
                print(_progress(name, report), flush=True)


def _progress(name: str, r: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    evals = sorted({k for h in r["hosts"].values() for k in h if k.startswith("eval/")})
    key = evals[0] if evals else None
    vals = [h.get(key) for h in r["hosts"].values()] if key else []
    shown = ",".join(f"{v:.4f}" for v in vals if isinstance(v, float))
    return (
        f"{name}: wall {f(r.get('wall_s'))} s, gap {f(r.get('survivor_gap_s'))} s, "
        f"lost {f(r.get('survivor_steps_lost'))}, rejoin {f(r.get('rejoin_s'))} s, "
        f"{key} {shown}"
    )


if __name__ == "__main__":
    main()
