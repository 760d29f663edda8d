"""Elastic runs on real processes: replicas that train, leave (cleanly or killed) and rejoin.

Each replica is its own process (a host, as torchft launches them) running
:func:`tests.support.elastic_wrapper_cases.replica` on a lighthouse of the test.
Each reports every step (members, rank, the peers it mixed with, its
parameters) so that :func:`replay`, the single-process float64 reference of
the mathematics, can recompute the whole run.
"""

from __future__ import annotations

import functools
import importlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

DIM = 3
LR = 0.1
MOMENTUM = 0.5
# the outer optimizer of plans with "outer_every": DiLoCo's Nesterov SGD
OUTER_LR = 0.7
OUTER_MOMENTUM = 0.9
# the data position of a step's second micro-batch (accumulated gradients): cursor + MICRO
MICRO = 100_000


def outer_sgd(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The outer optimizer of plans with ``outer_every`` (the replay's)."""
    return torch.optim.SGD(params, lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lighthouse(min_replicas: int = 1, join_timeout_ms: int = 5000) -> Any:
    """An in-process torchft lighthouse on loopback, quick to drop a silent replica."""
    from torchft._torchft import LighthouseServer

    return LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=min_replicas,
        join_timeout_ms=join_timeout_ms,
        quorum_tick_ms=50,
        heartbeat_timeout_ms=800,
    )


class _LighthouseProcess:
    """:func:`lighthouse` in a process of its own, for runs whose replicas are processes.

    The test process then holds no torchft thread (see :func:`_pool`).
    """

    def __init__(self, ctx: Any, **kwargs: Any):
        urls, self._stop = ctx.Queue(), ctx.Event()
        self._proc = ctx.Process(target=_serve, args=(urls, self._stop, kwargs), daemon=True)
        self._proc.start()
        self.url: str = urls.get(timeout=60)

    def shutdown(self) -> None:
        self._stop.set()
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()


def _serve(urls: Any, stop: Any, kwargs: dict[str, Any]) -> None:
    server = lighthouse(**kwargs)
    urls.put(loopback_address(server))
    stop.wait()
    server.shutdown()


def loopback_address(server: Any) -> str:
    """The lighthouse's address with its port on 127.0.0.1 (``address()`` gives the hostname)."""
    return f"http://127.0.0.1:{server.address().rsplit(':', 1)[1]}"


def initial_params(rid: str) -> torch.Tensor:
    """Each replica's own initial ``[w (DIM), b]``: they differ, the first quorum aligns them."""
    g = torch.Generator().manual_seed(sum(map(ord, rid)))
    return torch.randn(DIM + 1, generator=g, dtype=torch.float64)


def batch(rid: str, cursor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica ``rid``'s batch at data position ``cursor``."""
    g = torch.Generator().manual_seed(1000 * sum(map(ord, rid)) + cursor)
    x = torch.randn(4, DIM, generator=g, dtype=torch.float64)
    y = torch.randn(4, 1, generator=g, dtype=torch.float64)
    return x, y


def _model(rid: str) -> nn.Linear:
    m = nn.Linear(DIM, 1).double()
    p = initial_params(rid)
    with torch.no_grad():
        m.weight.copy_(p[:DIM].view(1, DIM))
        m.bias.copy_(p[DIM:])
    return m


def _flat(m: nn.Linear) -> list[float]:
    return torch.cat([m.weight.detach().reshape(-1), m.bias.detach()]).tolist()


class Died(Exception):
    """A replica that stops in the middle of a quorum (the test's crash)."""


def die_inside_quorum(edp: Any) -> None:
    """Make the next quorum stop this replica once torchft has formed it, before it takes part.

    The replica's membership is closed (its heartbeats stop, its servers and
    group go) where it would read the quorum's store: what the others see of a
    host that crashed there.
    """
    membership = edp.membership

    def crash(qid: int) -> Any:
        membership.close()
        raise Died(f"died inside quorum {qid}")

    membership._quorum_store = crash


def gate(plan: dict[str, Any], events: dict[str, Any], step: int) -> None:
    """Before step ``step + 1``: wait for the plan's ``wait_for`` events due now, set its ``set_at``."""
    for name, at in plan.get("wait_for", {}).items():
        if at == step:
            events[name].wait(60)
            # the joiner sets the event just before asking for its quorum; a quorum of
            # the others that reaches the lighthouse first would go on without it
            time.sleep(1.0)
    for name, at in plan.get("set_at", {}).items():
        if at == step:
            events[name].set()


def run(
    plans: dict[str, dict[str, Any]],
    restarts: dict[str, dict[str, Any]],
    timeout: float = 90,
    *,
    target: Callable[..., None],
):
    """Run the replicas (and restarted ones after their first process died); gather reports.

    ``target`` is the replica's function
    (:func:`tests.support.elastic_wrapper_cases.replica`), run in a spawned
    process with ``(rid, lighthouse, plan, queue, events)``.

    Returns:
        ``{rid: [report, ...]}`` in arrival order.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    events: dict[str, Any] = {name: ctx.Event() for name in ("rejoin", "restart", "joined")}
    events["start"] = ctx.Barrier(len(plans))
    server = _LighthouseProcess(ctx)
    lh = server.url
    procs = {
        rid: ctx.Process(target=target, args=(rid, lh, p, out, events)) for rid, p in plans.items()
    }
    for p in procs.values():
        p.start()
    reports: dict[str, list[Any]] = {rid: [] for rid in plans}
    restarted: set[str] = set()
    running = set(plans)
    deadline = time.monotonic() + timeout
    try:
        while running and time.monotonic() < deadline:
            for rid, plan in restarts.items():
                if rid in restarted or procs[rid].is_alive():
                    continue
                if plan.get("after_event") and not events[plan["after_event"]].is_set():
                    continue
                restarted.add(rid)
                plan = dict(plan, restarted=True)
                procs[rid] = ctx.Process(target=target, args=(rid, lh, plan, out, events))
                procs[rid].start()
                running.add(rid)
            try:
                msg = out.get(timeout=0.5)
            except Exception:
                for rid in list(running):
                    # a process that died for good (not one the test restarts later)
                    if not procs[rid].is_alive() and (rid not in restarts or rid in restarted):
                        running.discard(rid)
                continue
            reports[msg[0]].append(msg[1:])
            if msg[1] in ("done", "error"):
                running.discard(msg[0])
        if running:
            raise TimeoutError(f"replicas {sorted(running)} did not finish: {reports}")
    finally:
        stop_all(procs.values(), server)
    return reports


def host_torchruns(
    command: Callable[[str, str], list[str]],
    rids: tuple[str, ...],
    *,
    cwd: Any,
    env: dict[str, str],
    timeout: float,
) -> list[tuple[int, str]]:
    """One process per host (a torchrun), ``command(replica id, lighthouse)``, on a fresh
    lighthouse in a process of its own; each one's exit status and output, once all ended."""
    import multiprocessing as mp
    import subprocess

    server = _LighthouseProcess(mp.get_context("spawn"))
    runs: list[subprocess.Popen[str]] = []
    try:
        for rid in rids:
            runs.append(
                subprocess.Popen(
                    command(rid, server.url), cwd=cwd, env=env, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
        outs = [r.communicate(timeout=timeout)[0] for r in runs]
    finally:
        for r in runs:
            if r.poll() is None:
                r.kill()
        server.shutdown()
    return [(r.returncode, out) for r, out in zip(runs, outs)]


def stop_all(procs: Any, server: Any, timeout: float = 5) -> None:
    """Join the processes (killing those still alive after ``timeout``), then stop the lighthouse."""
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()
            p.join()
    server.shutdown()


def _grad(x: torch.Tensor, rid: str, cursor: int) -> torch.Tensor:
    w = x.clone().requires_grad_(True)
    xb, yb = batch(rid, cursor)
    pred = xb @ w[:DIM].view(DIM, 1) + w[DIM:]
    nn.functional.mse_loss(pred, yb).backward()
    assert w.grad is not None
    return w.grad


def replay(
    reports: dict[str, list[Any]],
    topology: str,
    every: int,
    outer_every: int | None = None,
    identical_start: bool = False,
    local: int = 1,
    topology_kwargs: dict[str, Any] | None = None,
    accumulate: bool = False,
) -> dict[str, Any]:
    """Recompute the run in one process: ``x(t) = x(t-1) + d(t) + sum_j W_ij (x_j - x_i)``.

    ``W(t)`` is built here, from the registry, over the members each step
    reports. A peer lost between quorums contributes nothing: in an edge of two (or
    ``hierarchical``'s edge between hosts) its weight stays with each survivor; in a
    larger edge it goes to the edge's live members, who average among themselves (each keeps ``s + d p / (k - d)`` and
    gives as much to every other survivor, ``s`` and ``p`` the edge's weights over
    ``k`` members, ``d`` of them lost). A joiner takes its source's parameters, momentum
    and data position at its first quorum. With ``outer_every``, outer rounds
    (DiLoCo's Nesterov SGD on ``x_outer - xbar``) at quorum steps ``t > 1`` with
    ``(t - 1) % outer_every == 0``, and at every new quorum id ``x_outer`` restarts
    from the members' mean (:mod:`decent_dp.elastic._outer`). Checks every reported step's
    parameters against the recomputed ones, and that each replica mixed with
    exactly the edge the topology gives (less peers that were gone).

    Returns:
        The members of each step and the final parameters.
    """
    from decent_dp.elastic import elastic_topology

    steps: dict[str, dict[int, dict[str, Any]]] = {rid: {} for rid in reports}
    for rid, msgs in reports.items():
        for m in msgs:
            if m[0] == "error":
                raise AssertionError(f"{rid}: {m[1]}")
            if m[0] == "step":
                steps[rid][m[1]] = m[2]
    last = max(t for s in steps.values() for t in s)
    x = {rid: initial_params(rid) for rid in reports}
    buf: dict[str, torch.Tensor | None] = {rid: None for rid in reports}
    cursor = {rid: 0 for rid in reports}
    members_of: dict[int, list[str]] = {}
    x_outer: torch.Tensor | None = None
    outer_buf: torch.Tensor | None = None
    quorum_id = None
    for t in range(1, last + 1):
        active = sorted(rid for rid in reports if t in steps[rid])
        members = steps[active[0]][t]["members"]
        members_of[t] = members
        # a member killed since the quorum is still listed until the next one, silent
        assert set(active) <= set(members), f"step {t}: members {members}, reports from {active}"
        for rid in set(members) - set(active):
            assert t not in steps[rid], f"step {t}: {rid} listed but silent"
        for rid in active:
            assert steps[rid][t]["members"] == members, f"step {t}: {rid} saw other members"
        quorum = (t - 1) % every == 0
        for rid in active:
            src = steps[rid][t]["healed_from"]
            if src is not None:
                assert quorum, f"{rid} healed at step {t}, not a quorum step"
                x[rid] = x[src].clone()
                buf[rid] = None if buf[src] is None else buf[src].clone()
                cursor[rid] = cursor[src]
        outer_round = False
        if outer_every is not None and quorum:
            assert set(active) == set(members), f"step {t}: a quorum step with a silent member"
            mean = torch.stack([x[rid] for rid in members]).mean(0)
            qid = steps[active[0]][t]["quorum_id"]
            outer_round = t > 1 and (t - 1) % outer_every == 0
            if x_outer is None or qid != quorum_id:  # a change: the round restarts from xbar
                x_outer = mean.clone()
            elif outer_round:
                g = x_outer - mean
                outer_buf = g.clone() if outer_buf is None else OUTER_MOMENTUM * outer_buf + g
                x_outer = x_outer - OUTER_LR * (g + OUTER_MOMENTUM * outer_buf)
            quorum_id = qid
        # one-peer-exp on 3 members is base-k with k=1 (elastic_topology's fallback)
        topo = elastic_topology(topology, len(members), dict(topology_kwargs or {}), local)
        new = {}
        for rid in active:
            info = steps[rid][t]
            i = members.index(rid)
            edge = topo.get_edge((t - 1) % topo.period, i)
            expected = [members[r] for r in sorted(edge.ranks) if r != i]
            if not outer_round:
                assert set(info["mixed"]) <= set(expected), (t, rid, info["mixed"], expected)
            if identical_start and t == 1 and not info["mixed"]:
                expected = []
            missing = set(expected) - set(info["mixed"])
            # an edge's exchange fails as a whole: one member that died drops all of it
            dead = [g for g in missing if t + 1 not in steps[g] and (t % every) != 0]
            for gone in missing if not dead else ():
                nxt = steps[gone].get(t + 1)
                assert nxt is None or (t + 1 - 1) % every == 0, f"{rid} lost {gone}, alive"
            silent = {g for g in missing if t not in steps[g]}  # gone since the quorum
            weight = edge.peer_weight
            if silent and len(edge.ranks) > 2 and topology != "hierarchical":
                # the edge's live members average among themselves: the lost weight goes to them
                # (or, at the step whose exchange went through for one of them, nothing)
                mixed = set(info["mixed"])
                assert mixed in (set(expected) - silent, set()), (t, rid, info["mixed"])
                weight += edge.peer_weight * len(silent) / (len(info["mixed"]) + 1)
            else:  # an edge between hosts (hierarchical's phases) mixes nothing once it failed
                assert not info["mixed"] or not missing or len(edge.ranks) == 2 or not dead, (
                    f"{rid} mixed part of an edge that failed at step {t}"
                )
            assert info["cursor"] == cursor[rid], (t, rid, info["cursor"], cursor[rid])
            g = _grad(x[rid], rid, cursor[rid])
            if accumulate:  # the summed gradient of the step's two micro-batches
                g = g + _grad(x[rid], rid, cursor[rid] + MICRO)
            b = g.clone() if buf[rid] is None else MOMENTUM * buf[rid] + g
            buf[rid] = b
            if outer_round:  # x(t) = x_outer + d(t), no gossip
                assert x_outer is not None
                out = x_outer - LR * b
            else:
                out = x[rid] - LR * b
                for j in info["mixed"]:
                    out = out + weight * (x[j] - x[rid])
            new[rid] = out
            cursor[rid] += 1
        x.update(new)
        for rid in active:
            got = torch.tensor(steps[rid][t]["params"], dtype=torch.float64)
            torch.testing.assert_close(
                got, x[rid], rtol=1e-9, atol=1e-12, msg=lambda m, r=rid, s=t: f"{r} step {s}: {m}"
            )
    return {"members": members_of, "final": x, "steps": steps}


_POOL: Any = None


def in_threads(
    target: Callable[..., Any], args: list[tuple[Any, ...]], *servers: Any, timeout: float = 60
) -> None:
    """``target(*a)`` for each ``a`` in threads started together, joined, then ``servers`` shut down."""
    threads = [threading.Thread(target=target, args=a) for a in args]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=timeout)
    finally:
        for server in servers:
            server.shutdown()


def _pool() -> Any:
    """One spawned process, for this test process's life, where torchft runs in-process.

    Not the test process itself: torchft's runtime threads (the lighthouse's,
    a Manager's) outlive ``shutdown()``, and a later test that forks its ranks
    from a process holding them can inherit a held lock and hang every rank.
    """
    global _POOL
    if _POOL is None:
        import atexit
        import multiprocessing as mp

        _POOL = mp.get_context("spawn").Pool(1)
        atexit.register(_POOL.terminate)
    return _POOL


def isolated(test: Callable[..., Any]) -> Callable[..., Any]:
    """Run a test's body in the spawned process of :func:`_pool` (fixtures are resolved here)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        return _pool().apply(_call, (test.__module__, test.__name__, args, kwargs))

    return run


def _call(module: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return getattr(importlib.import_module(module), name).__wrapped__(*args, **kwargs)
