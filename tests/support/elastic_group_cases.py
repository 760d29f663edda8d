"""Replica groups of several processes (one torchrun per host) on an in-process lighthouse.

Each process of each group is spawned (torchft runs only in spawned processes)
and builds its own :class:`decent_dp.elastic._quorum.Membership` with its group
rank. Group rank 0 also hosts the group's rendezvous store, as torchrun's
agent does, and the other ranks find it either through ``MASTER_ADDR`` /
``MASTER_PORT`` or through ``group_store``. Every process reports what it saw
to the test, which compares.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch

from tests.support import elastic_cases as ec

GROUP = 2  # processes per replica group
# each group's step when it asks for its first quorum: the same, so that torchft gives group
# rank g the store of member g (the members at the highest step take turns), not all one store
STEPS = {"hostA": 2, "hostB": 2}
# each group's address (loopback, but not the rendezvous stores' 127.0.0.1): what it advertises
HOSTS = {"hostA": "127.0.0.2", "hostB": "127.0.0.3"}


def staged_state(rid: str, group_rank: int) -> torch.Tensor:
    """What process ``(rid, group_rank)`` stages for joiners: its own, unlike the others'."""
    g = torch.Generator().manual_seed(100 * sum(map(ord, rid)) + group_rank)
    return torch.randn(5, generator=g, dtype=torch.float64)


def flat_values(flat: int) -> torch.Tensor:
    """Flat rank ``flat``'s summand: dyadic, so that any order of summation is exact."""
    return torch.tensor([2.0**flat, 0.5 ** (flat + 1), (flat + 1) * 0.25], dtype=torch.float64)


def _view(view: Any) -> dict[str, Any]:
    return {
        "quorum_id": view.quorum_id,
        "rank": view.rank,
        "members": list(view.members),
        "steps": list(view.steps),
        "addresses": list(view.addresses),
        "group_rank": view.group_rank,
        "group_world_size": view.group_world_size,
        "process_addresses": [list(row) for row in view.process_addresses],
    }


def _flat_allreduce(membership: Any, view: Any, prefix: str) -> tuple[int, list[float]]:
    import torch.distributed as dist

    flat = view.rank * membership.group_world_size + membership.group_rank
    size = view.world_size * membership.group_world_size
    pg = dist.ProcessGroupGloo(membership.world_store(prefix), flat, size, timedelta(seconds=10))
    t = flat_values(flat)
    pg.allreduce([t]).wait()
    return flat, t.tolist()


def member(
    rid: str, group_rank: int, size: int, lh: str, rdzv_port: int, env: bool, out: Any, bar: Any
) -> None:
    """One process of replica group ``rid`` (of ``size``): quorum, flat all-reduce, healing, leaving."""
    import torch.distributed as dist
    from torch.distributed import TCPStore

    from decent_dp.elastic._quorum import Membership

    torch.set_num_threads(1)
    try:
        rdzv = None
        if group_rank == 0:  # torchrun's agent store, which the group's processes share
            rdzv = TCPStore("127.0.0.1", rdzv_port, is_master=True, wait_for_workers=False)
        kwargs: dict[str, Any] = {}
        if env:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(rdzv_port))
        else:
            kwargs["group_store"] = ("127.0.0.1", rdzv_port)
        m = Membership(
            lh,
            rid,
            min_replicas=2,
            timeout_s=5.0,
            host=HOSTS[rid],
            log=lambda line: None,
            group_rank=group_rank,
            group_world_size=size,
            **kwargs,
        )
        bar.wait(60)  # every group's server heartbeats before the first quorum
        time.sleep(0.5)
        view = m.quorum(STEPS[rid])
        # the quorum's store, as torchft gave it to this process (the primary's group store)
        out.put((rid, group_rank, "view", _view(view), m._seen["store"]))
        flat, total = _flat_allreduce(m, view, "flat")
        # the quorum's own group spans one group rank of every member
        mine = torch.tensor([float(flat)], dtype=torch.float64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        m.pg.allreduce([mine], opts).wait()
        out.put((rid, group_rank, "sums", flat, total, mine.item()))
        m.serve_state(STEPS[rid], {"w": staged_state(rid, group_rank)})
        bar.wait(30)
        if rid == "hostB":  # each group rank heals from the source's same group rank
            src = view.members.index("hostA")
            got = m.fetch_state(view.address(src, group_rank), STEPS["hostA"])
            out.put((rid, group_rank, "fetched", got["w"].tolist()))
        bar.wait(30)
        if rid == "hostB":
            m.close()
        else:
            m.min_replicas = 1
            view = m.quorum(STEPS[rid] + 1)
            out.put((rid, group_rank, "view2", _view(view)))
            flat, total = _flat_allreduce(m, view, "flat")
            out.put((rid, group_rank, "sums2", flat, total))
            m.close()
        out.put((rid, group_rank, "done"))
        del rdzv
    except BaseException as exc:  # every failure goes to the parent, as one line
        out.put((rid, group_rank, "error", f"{type(exc).__name__}: {exc}"))


def run(
    sizes: dict[str, int] | None = None, timeout: float = 60
) -> dict[tuple[str, int], dict[str, Any]]:
    """Replica groups ``hostA`` and ``hostB`` of ``sizes`` processes (:data:`GROUP` each).

    Returns:
        ``{(rid, group_rank): {kind: report}}``, an ``"error"`` kind for each failed process.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    sizes = sizes or {"hostA": GROUP, "hostB": GROUP}
    out, bar = ctx.Queue(), ctx.Barrier(sum(sizes.values()))
    server = ec._LighthouseProcess(ctx)
    ports = {"hostA": ec.free_port(), "hostB": ec.free_port()}
    procs = [
        ctx.Process(
            target=member, args=(rid, g, n, server.url, ports[rid], rid == "hostA", out, bar)
        )
        for rid, n in sizes.items()
        for g in range(n)
    ]
    reports: dict[tuple[str, int], dict[str, Any]] = {
        (rid, g): {} for rid, n in sizes.items() for g in range(n)
    }
    try:
        for p in procs:
            p.start()
        running = set(reports)
        deadline = time.monotonic() + timeout
        while running and time.monotonic() < deadline:
            try:
                msg = out.get(timeout=0.5)
            except Exception:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            key = (msg[0], msg[1])
            reports[key][msg[2]] = msg[3:]
            if msg[2] in ("done", "error"):
                running.discard(key)
        assert not running, f"processes {sorted(running)} did not finish: {reports}"
    finally:
        ec.stop_all(procs, server)
    return reports
