"""Hosts of ``fault_tolerance=torchft`` as threads of one process, each running ``run(cfg)``.

Each thread does what its host's own ``torchrun --nproc_per_node=1 train.py`` would, on a
fresh in-process lighthouse. Call it from a test wrapped in
:func:`tests.support.elastic_cases.isolated`, so that torchft stays out of pytest's process.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from experiments.train.run import run
from tests.support import elastic_cases as ec
from tests.support.launch import compose_config

FT = ("fault_tolerance=torchft", "logger=none", "topology=ring")


def _host(cfg: Any, run_dir: Path, out: dict[str, Any]) -> None:
    try:
        out[str(cfg.fault_tolerance.replica_id)] = run(cfg, run_dir=run_dir)
    except BaseException as exc:  # reported to the test
        out[str(cfg.fault_tolerance.replica_id)] = exc


def run_hosts(run_dir: Path, *overrides: str, hosts: tuple[str, ...] = ("h0", "h1")) -> dict:
    """Train ``hosts`` together for 6 steps (a quorum every 3); each one's summary, or its error."""
    server = ec.lighthouse()
    lh = ec.loopback_address(server)
    out: dict[str, Any] = {}
    cfgs = [
        compose_config(
            *FT,
            f"fault_tolerance.lighthouse={lh}",
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
    threads = [threading.Thread(target=_host, args=(c, run_dir, out)) for c in cfgs]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        server.shutdown()
    return out
