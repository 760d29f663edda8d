"""Elastic gossip on torchft: membership changes 4 -> 3 -> 4 against a float64 replay.

Each replica is a real process with its own torchft ``Manager`` and gloo group,
on an in-process lighthouse on loopback (as torchft's own tests run it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchft")

from tests.support import elastic_cases as ec  # noqa: E402

RIDS = ["r0", "r1", "r2", "r3"]


def _plans(steps: int, every: int, topology: str, **r2: object) -> dict[str, dict[str, object]]:
    plans: dict[str, dict[str, object]] = {
        rid: {"steps": steps, "every": every, "topology": topology} for rid in RIDS
    }
    plans["r2"].update(r2)
    return plans


# slow: the elastic wrapper's replay (tests/decent_dp/test_elastic_wrapper.py) keeps elastic
# gossip in the fast tier
@pytest.mark.slow
@pytest.mark.parametrize("topology", ["ring", "one-peer-exp"])
def test_clean_leave_and_rejoin_replays_4_3_4(topology: str) -> None:
    """r2 leaves cleanly after step 4 and rejoins from its step-4 state; it heals at step 8."""
    every = 4
    plans = _plans(12, every, topology, leave_after=4, rejoin_when="rejoin", set_at={"joined": 4})
    # the survivors pass the quorum of step 5 without r2, then let it come back, and wait for
    # its quorum request before theirs of step 9 (else they would go on without it)
    for rid in ("r0", "r1", "r3"):
        plans[rid]["set_at"] = {"rejoin": 6}
        plans[rid]["wait_for"] = {"joined": 8}
    reports = ec.run_threads(plans)
    result = ec.replay(reports, topology, every)
    members = result["members"]
    assert [len(members[t]) for t in range(1, 13)] == [4] * 4 + [3] * 4 + [4] * 4
    # r2 came back with its stale state (step 4) and continued from its neighbour's at step 8
    resumed = [m for m in reports["r2"] if m[0] == "resumed"]
    assert resumed and resumed[0][1] == 4
    healed = result["steps"]["r2"][9]
    # its neighbour in the round of step 9 (ring: rank 3; one-peer-exp: round 0 pairs 2 with 3)
    assert healed["healed_from"] == "r3"
    assert healed["cursor"] == 8  # the data position came with the state, not the stale 4
    # every replica ended on step 12
    assert all(m[-1][0] == "done" and m[-1][1] == 12 for m in reports.values())


@pytest.mark.slow
def test_killed_replica_rejoins_from_a_neighbour(tmp_path: Path) -> None:
    """r2 is killed after step 2; survivors lose no step; its restart heals past its checkpoint."""
    every = 4
    ckpt = str(tmp_path / "r2.pt")
    plans = _plans(12, every, "ring", kill_after=2, save_at=2, save_to=ckpt)
    for rid in ("r0", "r1", "r3"):
        plans[rid]["set_at"] = {"restart": 6}
        plans[rid]["wait_for"] = {"joined": 8}
    # the restarted host loads its own checkpoint of step 2 first: the heal must replace it
    restart = dict(plans["r2"], kill_after=None, save_at=None, resume=ckpt, set_at={"joined": 2})
    reports = ec.run(plans, {"r2": dict(restart, after_event="restart")})
    result = ec.replay(reports, "ring", every)
    members = result["members"]
    # 4 members whose quorum still holds r2 until step 4 (its neighbours lose it at 3 and 4),
    # 3 from the quorum of step 5, 4 again from the quorum of step 9
    assert [len(members[t]) for t in range(1, 13)] == [4] * 4 + [3] * 4 + [4] * 4
    lost = {
        (t, rid)
        for rid in ("r1", "r3")
        for t in (3, 4)
        if "r2" not in result["steps"][rid][t]["mixed"]
    }
    assert lost, "no survivor noticed r2's death"
    for rid in ("r0", "r1", "r3"):
        assert sorted(result["steps"][rid]) == list(range(1, 13))  # no survivor lost a step
    resumed = [m for m in reports["r2"] if m[0] == "resumed"]
    assert resumed and resumed[0][1] == 2
    assert result["steps"]["r2"][9]["healed_from"] in ("r1", "r3")
    assert result["steps"]["r2"][9]["cursor"] == 8


@pytest.mark.slow  # make test's budget; the wrapper's replay keeps elastic gossip in the fast tier
def test_outer_rounds_restart_from_the_members_mean_at_each_change() -> None:
    """DiLoCo over 4 -> 3 -> 4: quorums every 2 steps, outer rounds every 4.

    r2 leaves after step 2 (the quorum of step 3 restarts the round from the 3
    members' mean), the outer round of step 5 steps the outer optimizer, r2
    rejoins at the quorum of step 7 (the round restarts again; r2 heals the outer
    momentum from its neighbour) and the round of step 9 steps with that momentum.
    """
    every, outer_every = 2, 4
    plans = _plans(12, every, "ring", leave_after=2, rejoin_when="rejoin", set_at={"joined": 2})
    for rid, plan in plans.items():
        plan["outer_every"] = outer_every
        if rid != "r2":
            plan["set_at"] = {"rejoin": 4}
            plan["wait_for"] = {"joined": 6}
    reports = ec.run_threads(plans)
    result = ec.replay(reports, "ring", every, outer_every=outer_every)
    members = result["members"]
    assert [len(members[t]) for t in range(1, 13)] == [4] * 2 + [3] * 4 + [4] * 6
    assert result["steps"]["r2"][7]["healed_from"] in ("r1", "r3")


@pytest.mark.slow  # processes that die inside a quorum wait out timeout_s
@pytest.mark.parametrize("where", ["die_in_quorum_at", "die_in_allreduce_at"])
def test_a_member_that_dies_inside_a_quorum_is_dropped_and_the_others_go_on(where: str) -> None:
    """r2 joins the quorum of step 5 and dies before it takes part in it, or in its all-reduce.

    The others wait for it on the quorum's store, or in the all-reduce of the
    members' mean, for timeout_s, then ask again: the lighthouse, no longer
    hearing r2, forms a quorum of three. The lighthouse's join timeout (6 s)
    is above timeout_s (3 s), so that it waits for a survivor still stuck in
    the all-reduce rather than re-forming without it.
    """
    every = 4
    plans = _plans(8, every, "ring", **{where: 4})
    for plan in plans.values():
        plan["timeout_s"] = 3.0
    reports = ec.run_threads(plans, join_timeout_ms=6000)
    assert reports["r2"][-1][0] == "died"
    reports["r2"] = [m for m in reports["r2"] if m[0] != "died"]
    result = ec.replay(reports, "ring", every)
    members = result["members"]
    assert [len(members[t]) for t in range(1, 9)] == [4] * 4 + [3] * 4


@pytest.mark.gpu
def test_gossip_of_cuda_replicas_exchanges_host_copies() -> None:
    """Two replicas on the GPU: gloo's send/recv move host memory only, so the exchange of
    CUDA parameters is staged through the host; every step mixes (none lost), as replayed."""
    plans = {
        rid: {"steps": 6, "every": 3, "topology": "ring", "device": "cuda"} for rid in ("r0", "r1")
    }
    reports = ec.run(plans, {}, timeout=180)
    result = ec.replay(reports, "ring", 3)
    assert all(result["steps"][rid][t]["mixed"] for rid in plans for t in range(1, 7))


def _state(device: str) -> dict:
    import torch

    w = torch.arange(8.0, device=device)
    return {
        "model": {"w": w, "view": w[2:4]},
        "optimizer": {
            "state": {0: {"momentum_buffer": torch.ones(4 << 20, device=device)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "step": 3,
        "extra": ("pos", [1, 2]),
    }


def test_a_heal_snapshot_is_a_host_copy_sharing_nothing() -> None:
    import torch

    from decent_dp._elastic_common import host_snapshot

    state = _state("cpu")
    snap = host_snapshot(state)
    state["model"]["w"].add_(1.0)  # the live state moves on; the staged copy must not
    state["optimizer"]["param_groups"][0]["lr"] = 0.5
    assert snap["model"]["w"].tolist() == list(range(8))
    assert snap["model"]["view"].tolist() == [2.0, 3.0]
    assert snap["optimizer"]["param_groups"][0]["lr"] == 0.1
    assert snap["step"] == 3 and snap["extra"] == ("pos", [1, 2])
    assert snap["extra"][1] is not state["extra"][1]
    momentum = snap["optimizer"]["state"][0]["momentum_buffer"]
    assert isinstance(momentum, torch.Tensor) and momentum.device.type == "cpu"


@pytest.mark.gpu
def test_a_heal_snapshot_of_cuda_state_takes_no_gpu_memory() -> None:
    """The staged copy goes straight to the host (copy.deepcopy would first copy on the GPU)."""
    import torch

    from decent_dp._elastic_common import host_snapshot

    state = _state("cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    snap = host_snapshot(state)
    assert torch.cuda.max_memory_allocated() == before
    assert snap["optimizer"]["state"][0]["momentum_buffer"].device.type == "cpu"
    torch.testing.assert_close(snap["model"]["w"], state["model"]["w"].cpu())


def _get(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=0.5) as f:
        return bytes(f.read())


@ec.isolated  # torchft's threads stay out of the test process
def test_a_heal_source_withdraws_its_staged_state() -> None:
    """After the heal of the first quorum (b takes a's state), a serves and holds no copy of it."""
    import gc
    import threading
    import weakref

    import torch

    from decent_dp.elastic import ElasticGossip

    server = ec.lighthouse()
    lh = ec.loopback_address(server)
    staged: list[weakref.ref[torch.Tensor]] = []
    seen: dict[str, object] = {}
    errors: list[str] = []
    barrier = threading.Barrier(2)

    def replica(rid: str) -> None:
        torch.manual_seed(len(rid))
        model = torch.nn.Linear(2, 1)
        gossip = ElasticGossip(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
            lighthouse=lh,
            replica_id=rid,
            min_replicas=2,
            timeout_s=5.0,
            quorum_every=4,
            host="127.0.0.1",
            log=lambda line: None,
        )
        membership = gossip.membership
        serve = membership.serve_state

        def watched(step: int, state: dict) -> None:
            staged.append(weakref.ref(state["model"]["weight"]))
            serve(step, state)

        membership.serve_state = watched  # type: ignore[method-assign]
        try:
            barrier.wait(30)
            for _ in range(2):
                gossip.zero_grad()
                model(torch.ones(3, 2)).sum().backward()
                gossip.step()
            barrier.wait(30)  # both past the heal: nothing may still be fetching
            if gossip.rank == 0:
                assert gossip.view is not None
                seen["held"] = membership.transport._state_dict
                try:  # what a joiner would get, asking now for the state of step 0
                    seen["got"] = len(_get(f"{gossip.view.addresses[0]}0/full"))
                except OSError as exc:  # withdrawn: refused at once
                    seen["got"] = type(exc).__name__
            else:
                seen["healed_from"] = gossip.healed_from
            barrier.wait(30)
        except Exception as exc:
            errors.append(f"{rid}: {type(exc).__name__}: {exc}")
            barrier.abort()
        finally:
            gossip.close()

    ec.in_threads(replica, [("a",), ("b",)], server)
    assert not errors, errors
    assert seen["healed_from"] == "a" and len(staged) == 1
    assert seen["got"] == "HTTPError"  # not served any more (400: no such step)
    assert seen["held"] is None  # the transport dropped its copy
    gc.collect()
    assert staged[0]() is None  # and nothing else holds it


class _CutSource:
    """A heal source of the test's own on 127.0.0.1 whose stream breaks: each request is
    answered with the first ``cuts[i]`` bytes of a real staged state, then the connection
    closes (a source that died in the transfer); requests past the cuts get it whole."""

    def __init__(self, state: dict, cuts: list[int]) -> None:
        import io
        import threading
        from http.server import BaseHTTPRequestHandler, HTTPServer

        from torch.distributed._serialization import _streaming_save

        buf = io.BytesIO()
        _streaming_save(state, buf)  # what torchft's HTTPTransport sends
        body, pending = buf.getvalue(), list(cuts)
        self.size, self.requests = len(body), 0
        source = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                source.requests += 1
                n = pending.pop(0) if pending else len(body)
                self.send_response(200)
                self.send_header("Content-type", "application/octet-stream")
                self.end_headers()
                self.wfile.write(body[:n])
                self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        self._server = HTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self._server.server_address[1]}/checkpoint/"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@ec.isolated  # torchft's threads stay out of the test process
def test_a_heal_whose_stream_breaks_asks_again() -> None:
    """A joiner's fetch cut at 0, 8, 40 and 200 bytes (header, pickle, data) is a failed heal:
    the quorum is asked again and the next, whole, transfer heals it."""
    import torch

    from decent_dp._elastic_common import ask_quorum
    from decent_dp._elastic_quorum import Membership

    state = {"model": {"w": torch.arange(1000, dtype=torch.float32)}, "step": 7}
    server = ec.lighthouse()
    membership = Membership(ec.loopback_address(server), "joiner", 1, 5.0, "127.0.0.1", print)
    lines: list[str] = []
    try:
        for cut in (0, 8, 40, 200):
            source = _CutSource(state, [cut])
            assert source.size > 200
            asked: list[int] = []
            got: list[dict] = []

            def ask(asked: list[int] = asked) -> object:
                asked.append(1)
                return membership.quorum(0)

            def work(view: object, got: list[dict] = got, address: str = source.address) -> None:
                got.append(membership.fetch_state(address, 7))

            try:
                ask_quorum(ask, work, lines.append, "joiner")  # type: ignore[arg-type]
            finally:
                source.close()
            assert (len(asked), source.requests) == (2, 2), cut
            torch.testing.assert_close(got[0]["model"]["w"], state["model"]["w"])
            assert got[0]["step"] == 7
    finally:
        membership.close()
        server.shutdown()
    assert len(lines) == 4 and all("the quorum's work failed (HealFailed" in s for s in lines)


@ec.isolated  # torchft's threads stay out of the test process
def test_a_joiner_whose_source_breaks_off_heals_at_the_next_try() -> None:
    """ElasticGossip's own heal: b joins a (at step 4); the first transfer breaks off at 40 bytes
    (a proxy of the test's own in front of a's transport); both ask again at once, and b heals."""
    import threading
    import time
    import urllib.request

    import torch

    from decent_dp.elastic import ElasticGossip

    server = ec.lighthouse()
    lh = ec.loopback_address(server)
    logs: dict[str, list[str]] = {"a": [], "b": []}
    out: dict[str, object] = {}
    errors: list[str] = []
    ready = threading.Barrier(2)
    proxy: dict[str, object] = {}

    def make(rid: str) -> ElasticGossip:
        model = torch.nn.Linear(2, 1)
        return ElasticGossip(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            lighthouse=lh,
            replica_id=rid,
            min_replicas=2,
            timeout_s=10.0,
            quorum_every=4,
            host="127.0.0.1",
            log=logs[rid].append,
        )

    def replica(rid: str) -> None:
        try:
            gossip = make(rid)
        except Exception as exc:
            errors.append(f"{rid}: {exc}")
            ready.abort()
            return
        try:
            if rid == "a":  # ahead: the source; peers reach it through the cutting proxy
                state = gossip.state_dict()
                gossip.load_state_dict(dict(state, step=4))
                real = gossip.membership._checkpoint_address()
                proxy["real"] = real
                gossip.membership._checkpoint_address = lambda: str(proxy["address"])  # type: ignore[method-assign]
            ready.wait(30)
            start = time.monotonic()
            gossip.zero_grad()
            out[rid] = (gossip.step_count, gossip.healed_from, time.monotonic() - start)
        except Exception as exc:
            errors.append(f"{rid}: {type(exc).__name__}: {exc}")
        finally:
            gossip.close()

    # the proxy: the first transfer cut at 40 bytes (in the pickle), later ones whole
    from http.server import BaseHTTPRequestHandler, HTTPServer

    cuts = [40]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with urllib.request.urlopen(f"{proxy['real']}{self.path.split('/', 2)[2]}") as f:
                body = f.read()
            n = cuts.pop(0) if cuts else len(body)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body[:n])

        def log_message(self, *args: object) -> None:
            pass

    http = HTTPServer(("127.0.0.1", 0), Handler)
    proxy["address"] = f"http://127.0.0.1:{http.server_address[1]}/checkpoint/"
    threading.Thread(target=http.serve_forever, daemon=True).start()
    ec.in_threads(replica, [("a",), ("b",)], http, server)
    assert not errors, errors
    assert out["b"][:2] == (4, "a") and out["a"][:2] == (4, None)  # type: ignore[index]
    assert any("asking again" in line and "HealFailed" in line for line in logs["b"]), logs
    # a heard of b's failure on the store: it asked again at once, not after timeout_s
    assert any("could not fetch" in line for line in logs["a"]), logs
    assert out["a"][2] < 10.0  # type: ignore[index]


@ec.isolated  # torchft's threads stay out of the test process
def test_a_change_of_membership_makes_the_outer_momentum_one_again() -> None:
    """Outer rounds every 2 steps: a and b take the round of step 3 (momentum is made), then
    b's momentum is made to differ (what a mean all-reduce that completed on a only and failed
    on b leaves behind: a stepped its outer optimizer, b did not). c joins at the quorum of
    step 5, a change of membership: a, b and c must leave it with one outer momentum."""
    import threading
    import time

    import torch

    from decent_dp.elastic import ElasticGossip

    server = ec.lighthouse()
    lh = ec.loopback_address(server)
    start, at_four = threading.Barrier(2), threading.Barrier(2)
    go, asking = threading.Event(), threading.Event()
    momenta: dict[str, torch.Tensor] = {}
    errors: list[str] = []

    def replica(rid: str) -> None:
        if rid == "c":
            go.wait(30)  # a and b are past step 4: c joins at the quorum of step 5
        model = torch.nn.Linear(2, 1)
        gossip = ElasticGossip(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            lighthouse=lh,
            replica_id=rid,
            min_replicas=2,
            timeout_s=10.0,
            quorum_every=2,
            host="127.0.0.1",
            log=lambda line: None,
            outer_optim_fn=lambda p: torch.optim.SGD(p, lr=0.7, momentum=0.9, nesterov=True),
            outer_every=2,
        )
        try:
            if rid == "c":
                asking.set()  # its quorum request goes out now
            else:
                start.wait(30)
                time.sleep(0.5)  # both heartbeats reach the lighthouse before the first quorum
            while gossip.step_count < 5:
                if gossip.step_count == 4 and rid != "c":
                    assert gossip.outer is not None and gossip.outer.x is not None
                    if rid == "b":
                        opt = gossip.outer.opt
                        assert opt is not None
                        opt.state[gossip.outer.x]["momentum_buffer"].add_(1.0)
                    at_four.wait(30)
                    go.set()
                    asking.wait(30)
                    time.sleep(1.0)  # c's request reaches the lighthouse before theirs
                gossip.zero_grad()
                model(torch.ones(3, 2)).sum().backward()
                gossip.step()
            assert gossip.members == ("a", "b", "c") and gossip.outer is not None
            assert gossip.last_change is not None and gossip.last_change["step"] == 4
            assert gossip.outer.opt is not None and gossip.outer.x is not None
            momenta[rid] = gossip.outer.opt.state[gossip.outer.x]["momentum_buffer"].clone()
        except Exception as exc:
            errors.append(f"{rid}: {type(exc).__name__}: {exc}")
            start.abort()
            at_four.abort()
        finally:
            gossip.close()

    ec.in_threads(replica, [("a",), ("b",), ("c",)], server)
    assert not errors, errors
    assert set(momenta) == {"a", "b", "c"}
    torch.testing.assert_close(momenta["b"], momenta["a"], rtol=0, atol=0)
    torch.testing.assert_close(momenta["c"], momenta["a"], rtol=0, atol=0)
