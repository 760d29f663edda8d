"""Hosts of ``fault_tolerance=torchft`` as spawned processes, each running ``run(cfg)``.

Each process does what its host's own ``torchrun --nproc_per_node=1 train.py`` would
(the elastic wrapper makes a process group of its own per quorum, so a host is a
process), on a fresh lighthouse in a spawned process: torchft stays out of pytest's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.train.run import run
from tests.support import elastic_cases as ec
from tests.support.launch import compose_config

FT = ("fault_tolerance=torchft", "logger=none", "topology=ring")


def _host(cfg: Any, run_dir: str, out: Any) -> None:
    rid = str(cfg.fault_tolerance.replica_id)
    try:
        out.put((rid, run(cfg, run_dir=Path(run_dir))))
    except BaseException as exc:  # reported to the test, as one picklable error
        out.put((rid, RuntimeError(f"{type(exc).__name__}: {exc}")))


def run_hosts(run_dir: Path, *overrides: str, hosts: tuple[str, ...] = ("h0", "h1")) -> dict:
    """Train ``hosts`` together for 6 steps (a quorum every 3); each one's summary, or its error."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    server = ec._LighthouseProcess(ctx)
    out: dict[str, Any] = {}
    cfgs = [
        compose_config(
            *FT,
            f"fault_tolerance.lighthouse={server.url}",
            f"fault_tolerance.replica_id={rid}",
            f"fault_tolerance.min_replicas={len(hosts)}",
            "fault_tolerance.timeout_s=20",
            "fault_tolerance.quorum_every=3",
            "fault_tolerance.host=127.0.0.1",
            "train.max_steps=6",
            "log.every=3",
            "checkpoint.on_signal=false",
            *overrides,
        )
        for rid in hosts
    ]
    queue = ctx.Queue()
    procs = [ctx.Process(target=_host, args=(c, str(run_dir), queue)) for c in cfgs]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            try:
                rid, result = queue.get(timeout=150)
            except Exception:
                break
            out[rid] = result
    finally:
        ec.stop_all(procs, server, timeout=10)
    for rid in hosts:
        out.setdefault(rid, RuntimeError(f"host {rid} did not finish"))
    return out
