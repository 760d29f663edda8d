"""Elastic gossip's parts below the wrapper: the membership's heal, its staged copies, the outer state.

The replays of whole runs through 4 -> 3 -> 4 members are the wrapper's
(``tests/decent_dp/test_elastic_wrapper.py``); here each part runs on real
torchft objects (an in-process lighthouse on loopback, its ``Manager`` and
transport) or real gloo processes.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torchft")

from tests.support import elastic_cases as ec  # noqa: E402


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

    from decent_dp.elastic.common import host_snapshot

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

    from decent_dp.elastic.common import host_snapshot

    state = _state("cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    snap = host_snapshot(state)
    assert torch.cuda.max_memory_allocated() == before
    assert snap["optimizer"]["state"][0]["momentum_buffer"].device.type == "cpu"
    torch.testing.assert_close(snap["model"]["w"], state["model"]["w"].cpu())


class _Store:
    """The keys a store holds, as ``torch.distributed.Store.set``/``check`` see them."""

    def __init__(self, *noted: int) -> None:
        self.keys = {str(r) for r in noted}

    def set(self, key: str, value: str) -> None:
        self.keys.add(key)

    def check(self, keys: list[str]) -> bool:
        return all(k in self.keys for k in keys)


def test_the_survivors_of_an_edge_name_its_one_lost_member_and_share_its_weight() -> None:
    from decent_dp._comm.survivors import find_lost, survivors_of
    from decent_dp.topo import Edge

    ranks = (0, 1, 2, 3)
    # 0 and 3 noted themselves before 1: 1 names 2, the one that never will
    assert find_lost(_Store(0, 3), ranks, 1, timeout_s=1.0) == 2
    # two lost (or a store that never fills): no one to name, within the timeout
    assert find_lost(_Store(3), ranks, 1, timeout_s=0.05) is None
    # a uniform edge of 4 less one: the three survivors average
    live = survivors_of(Edge(ranks, 0.25), 2)
    assert live.ranks == (0, 1, 3)
    assert (live.self_weight, live.peer_weight) == pytest.approx((1 / 3, 1 / 3))
    # a lazy edge (keeps half): each survivor keeps s + p / 2, rows still sum to one
    lazy = survivors_of(Edge(ranks, 0.5), 0)
    assert lazy.self_weight == pytest.approx(0.5 + (0.5 / 3) / 3)
    assert lazy.self_weight + 2 * lazy.peer_weight == pytest.approx(1.0)
    assert lazy.peer_weight == pytest.approx(0.5 / 3 + (0.5 / 3) / 3)


def _get(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=0.5) as f:
        return bytes(f.read())


def _member(lh: str, rid: str, log: Any = None) -> Any:
    from decent_dp.elastic._quorum import Membership

    return Membership(lh, rid, 2, 10.0, "127.0.0.1", log or (lambda line: None))


def _heal_at_quorum(membership: Any, step: int, state: dict, log: Any) -> dict[str, Any]:
    """A quorum at ``step`` and its heal: the members behind take the state of the first ahead.

    What the wrapper's quorum does with the heal's sources (asked again if the heal fails).
    """
    from decent_dp.elastic.common import ask_quorum, host_snapshot

    out: dict[str, Any] = {}

    def work(view: Any) -> None:
        top = max(view.steps)
        sources = {j: view.steps.index(top) for j, s in enumerate(view.steps) if s < top}
        out["view"] = view
        out["healed"] = membership.heal(
            sources, top, lambda: host_snapshot(state), lambda r: view.addresses[r]
        )

    ask_quorum(lambda: membership.quorum(step), work, log, membership.replica_id)
    return out


@ec.isolated  # torchft's threads stay out of the test process
def test_a_heal_source_withdraws_its_staged_state() -> None:
    """After b heals from a (a at step 4, b at 0), a serves and holds no copy of the state."""
    import gc
    import threading
    import weakref

    import torch

    server = ec.lighthouse()
    lh = ec.loopback_address(server)
    staged: list[weakref.ref[torch.Tensor]] = []
    seen: dict[str, object] = {}
    errors: list[str] = []
    barrier = threading.Barrier(2)

    def replica(rid: str, step: int) -> None:
        membership = _member(lh, rid)
        serve = membership.serve_state

        def watched(at: int, state: dict) -> None:
            staged.append(weakref.ref(state["model"]["w"]))
            serve(at, state)

        membership.serve_state = watched  # type: ignore[method-assign]
        try:
            barrier.wait(30)
            state = {"model": {"w": torch.full((4,), float(step))}, "step": step}
            out = _heal_at_quorum(membership, step, state, print)
            barrier.wait(30)  # both past the heal: nothing may still be fetching
            view = out["view"]
            if out["healed"] is None:
                seen["held"] = membership.transport._state_dict
                try:  # what a joiner would get, asking now for the state of step 4
                    seen["got"] = len(_get(f"{view.addresses[view.rank]}4/full"))
                except OSError as exc:  # withdrawn: refused at once
                    seen["got"] = type(exc).__name__
            else:
                seen["healed"] = out["healed"]["model"]["w"].tolist()
            barrier.wait(30)
        except Exception as exc:
            errors.append(f"{rid}: {type(exc).__name__}: {exc}")
            barrier.abort()
        finally:
            membership.close()

    ec.in_threads(replica, [("a", 4), ("b", 0)], server)
    assert not errors, errors
    assert seen["healed"] == [4.0] * 4 and len(staged) == 1
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

    from decent_dp.elastic._quorum import Membership
    from decent_dp.elastic.common import ask_quorum

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
    """b joins a (at step 4); the first transfer breaks off at 40 bytes (a proxy of the test's
    own in front of a's transport); both ask again at once, and b heals."""
    import threading
    import time
    import urllib.request

    import torch

    server = ec.lighthouse()
    lh = ec.loopback_address(server)
    logs: dict[str, list[str]] = {"a": [], "b": []}
    out: dict[str, object] = {}
    errors: list[str] = []
    ready = threading.Barrier(2)
    proxy: dict[str, object] = {}

    def replica(rid: str) -> None:
        try:
            membership = _member(lh, rid, logs[rid].append)
        except Exception as exc:
            errors.append(f"{rid}: {exc}")
            ready.abort()
            return
        try:
            step = 4 if rid == "a" else 0
            if rid == "a":  # ahead: the source; peers reach it through the cutting proxy
                proxy["real"] = membership._checkpoint_address()
                membership._checkpoint_address = lambda: str(proxy["address"])  # type: ignore[method-assign]
            ready.wait(30)
            start = time.monotonic()
            state = {"model": {"w": torch.arange(64.0)}, "step": step}
            got = _heal_at_quorum(membership, step, state, logs[rid].append)["healed"]
            out[rid] = (None if got is None else got["step"], time.monotonic() - start)
        except Exception as exc:
            errors.append(f"{rid}: {type(exc).__name__}: {exc}")
        finally:
            membership.close()

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
    assert out["b"][0] == 4 and out["a"][0] is None  # type: ignore[index]
    assert any("asking again" in line and "HealFailed" in line for line in logs["b"]), logs
    # a heard of b's failure on the store: it asked again at once, not after timeout_s
    assert any("could not fetch" in line for line in logs["a"]), logs
    assert out["a"][1] < 10.0  # type: ignore[index]


def _outer_worker(rank: int, world_size: int) -> list[float]:
    import torch

    from decent_dp.elastic._outer import ElasticOuter, _allreduce_sum

    outer = ElasticOuter(ec.outer_sgd, 2, 2)
    mean = torch.arange(4.0)
    outer.at_quorum(1, mean, changed=True)  # the first quorum: x_outer = the mean
    outer.at_quorum(3, mean + 1.0, changed=False)  # an outer round: momentum is made
    assert outer.opt is not None and outer.x is not None
    if rank == 1:  # what a round that completed on some members only leaves behind
        outer.opt.state[outer.x]["momentum_buffer"].add_(1.0)
    outer.at_quorum(5, mean + 2.0, changed=True)  # a change: the round restarts
    outer.agree(rank, _allreduce_sum)
    assert outer.x.tolist() == (mean + 2.0).tolist()
    return outer.opt.state[outer.x]["momentum_buffer"].tolist()


def test_a_change_of_membership_makes_the_outer_momentum_one_again() -> None:
    """Three members' outer momenta differ (one took a round the others did not); at a change
    every member takes rank 0's, over a real gloo group, and x_outer restarts from the mean."""
    from tests.support.dist_harness import ok_values, run_distributed

    momenta = ok_values(run_distributed(_outer_worker, 3))
    assert momenta[0] == momenta[1] == momenta[2] and momenta[0] != [0.0] * 4
