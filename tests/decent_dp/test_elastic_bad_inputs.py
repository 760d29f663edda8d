"""The elastic wrapper's bad inputs: each one line naming the value, before anything can hang."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

pytest.importorskip("torchft")

from decent_dp.topo import TopologyReg  # noqa: E402
from tests.support import elastic_cases as ec  # noqa: E402


def _membership(lh: str, rid: str, min_replicas: int, timeout_s: float, log: Any) -> Any:
    from decent_dp.elastic._quorum import Membership

    return Membership(lh, rid, min_replicas, timeout_s, "127.0.0.1", log)


@pytest.mark.slow  # waits out a quorum timeout
@ec.isolated  # torchft's threads stay out of the test process
def test_more_min_replicas_than_hosts_waits_with_progress_then_fails() -> None:
    server = ec.lighthouse()
    lines: list[str] = []
    # a quorum may take 3 timeouts
    membership = _membership(ec.loopback_address(server), "alone", 2, 1.5, lines.append)
    try:
        with pytest.raises(TimeoutError, match=r"no quorum of min_replicas=2 .* \(1 came\)") as e:
            membership.quorum(0)
        assert "\n" not in str(e.value)
        assert any("waiting for a quorum of min_replicas=2, 1 so far" in line for line in lines)
    finally:
        membership.close()
        server.shutdown()


@ec.isolated  # torchft's threads stay out of the test process
def test_a_replica_id_used_twice_is_refused_by_both() -> None:
    # two replicas in threads of this process: each has its own Manager, store and group
    server = ec.lighthouse()
    lh = ec.loopback_address(server)
    got: list[tuple[str, str]] = []

    def join() -> None:
        membership = _membership(lh, "twin", 2, 10.0, lambda line: None)
        try:
            got.append(("ok", str(membership.quorum(0).members)))
        except Exception as exc:
            got.append((type(exc).__name__, str(exc)))
        finally:
            membership.close()

    ec.in_threads(join, [(), ()], server, timeout=30)
    # both joined one quorum (the lighthouse tells them apart by a uuid it appends) and both refuse
    assert [g[0] for g in got] == ["ValueError", "ValueError"], got
    for _, line in got:
        assert line.startswith("replica_id='twin' is used by 2 members") and "\n" not in line


def test_one_peer_exp_runs_as_base_k_where_the_members_are_no_power_of_two() -> None:
    from decent_dp.elastic import elastic_topology

    assert elastic_topology("one-peer-exp", 4, {}).name == "one-peer-exp"
    three = elastic_topology("one-peer-exp", 3, {})
    assert three.name == "base-k" and all(len(e.ranks) <= 2 for r in three.rounds for e in r)


def _wrapper(**kwargs: object) -> object:
    from decent_dp.elastic import ElasticDataParallel

    model = torch.nn.Linear(2, 1)
    opt = lambda named: torch.optim.SGD([p for _, p in named], lr=0.1)  # noqa: E731
    args = {"lighthouse": f"http://127.0.0.1:{ec.free_port()}", "timeout_s": 1.0}
    args.update(kwargs)
    return ElasticDataParallel(model, opt, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"outer_every": 4}, r"^outer_optim_fn and outer_every come together"),
        (
            {"outer_optim_fn": ec.outer_sgd, "outer_every": 3, "quorum_every": 2},
            r"^outer_every=3 is invalid; it must be a multiple of quorum_every=2",
        ),
        ({"device_mesh": object()}, r"^device_mesh= cannot be elastic here: a sharded replica"),
        ({"topology": "hierarchical"}, r"^topology='hierarchical' cannot be elastic"),
        ({"topology": "alternating-exp-ring"}, r"^topology='alternating-exp-ring' cannot be"),
        (
            {"topology": TopologyReg.create("ring", 4, 1)},
            r"^topology=RingTopology\(...\) cannot be elastic",
        ),
        ({"topology": "no-such"}, r"^topology='no-such' is not registered; elastic ones: .*ring"),
        ({"quorum_every": 0}, r"^quorum_every=0 is invalid"),
        ({"min_replicas": "2"}, r"^min_replicas='2' is invalid"),
        ({"timeout_s": -1.0}, r"^timeout_s=-1.0 is invalid"),
        ({"group_world_size": 2, "group_rank": 2}, r"^group_rank=2 is invalid; .*\[0, group_"),
        ({"replica_id": ""}, r"^replica_id='' is invalid"),
    ],
)
def test_the_wrapper_refuses_what_cannot_be_elastic_in_one_line(
    kwargs: dict[str, object], message: str
) -> None:
    # refused before torchft starts: nothing of it runs in the test process
    with pytest.raises(ValueError, match=message) as e:
        _wrapper(**kwargs)
    assert "\n" not in str(e.value)


def _not_an_optimizer(named: object) -> object:
    return "sgd"


def _not_a_scheduler(opt: object) -> object:
    return None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"grad_clip": 1.0},
            TypeError,
            r"^grad_clip=1.0 is not an option of the wrapper; did you mean grad_clip_norm\? "
            r"its options: .*bucket_size_in_mb",
        ),
        ({"compression": "bogus"}, ValueError, r"^compression='bogus' is invalid; use None"),
        ({"bucket_size_in_mb": -1}, ValueError, r"^bucket_size_in_mb=-1 is invalid; it must be"),
        ({"grad_clip_norm": -0.5}, ValueError, r"^grad_clip_norm=-0.5 is invalid"),
        ({"state_sync": {"exp_avg_sq": 0}}, ValueError, r"^state_sync\['exp_avg_sq'\]=0: the"),
        ({"outer_fragments": 2}, ValueError, r"^outer_fragments= cannot be elastic here"),
        ({"_broadcast": False}, ValueError, r"^_broadcast= cannot be elastic here"),
        ({"optim_fn": _not_an_optimizer}, TypeError, r"optim_fn returned str"),
        ({"lr_scheduler_fn": _not_a_scheduler}, TypeError, r"^lr_scheduler_fn returned NoneType"),
        (
            {
                "topology": "hierarchical",
                "topology_kwargs": {"inter": "complete"},
                "group_world_size": 2,
                "group_rank": 0,
                "group_store": ("127.0.0.1", 1),
                "compression": "int8",
            },
            ValueError,
            r"^compression='int8' with topology='hierarchical' compresses edges of 2 hosts only",
        ),
    ],
)
def test_the_wrappers_options_are_checked_before_the_lighthouse(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    """Every option fails in the constructor: no lighthouse runs, and none is waited for.

    Were an option checked only when the wrapper is built (at the first
    quorum), the constructor would go on to the lighthouse and fail with its
    TimeoutError (within ``timeout_s=1``), not this error.
    """
    from decent_dp.elastic import ElasticDataParallel

    args: dict[str, object] = {
        "lighthouse": f"http://127.0.0.1:{ec.free_port()}",
        "timeout_s": 1.0,
        "host": "127.0.0.1",
        "optim_fn": lambda named: torch.optim.SGD([p for _, p in named], lr=0.1),
    }
    args.update(kwargs)
    start = time.monotonic()
    with pytest.raises(error, match=message) as e:
        ElasticDataParallel(torch.nn.Linear(2, 1), **args)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)
    assert time.monotonic() - start < 1.0  # the lighthouse's check would take timeout_s


def test_the_wrapper_refuses_a_process_group_it_did_not_make() -> None:
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"^a process group is initialised; .* do not call"):
            _wrapper()
    finally:
        dist.destroy_process_group()


@ec.isolated  # torchft's threads stay out of the test process
def test_the_wrappers_unreachable_lighthouse_fails_within_the_timeout() -> None:
    # the constructor's own checks build a trial optimizer, whose first construction in a
    # process imports torch._dynamo (seconds on a loaded machine): paid before the clock starts
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    start = time.monotonic()
    with pytest.raises(
        TimeoutError, match=r"lighthouse='http://127.0.0.1:\d+' cannot be reached"
    ) as e:
        _wrapper(host="127.0.0.1")
    assert time.monotonic() - start < 5
    assert "timeout_s=1" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow  # waits out a quorum timeout
@ec.isolated  # torchft's threads stay out of the test process
def test_a_replica_alone_at_a_lighthouse_that_needs_two_gives_up_within_its_timeout() -> None:
    """The others finished (or never came): torchft's quorum call blocks, the deadline does not."""
    server = ec.lighthouse(min_replicas=2)
    lines: list[str] = []
    # a quorum may take 3 timeouts
    membership = _membership(ec.loopback_address(server), "late", 2, 1.0, lines.append)
    start = time.monotonic()
    try:
        with pytest.raises(
            TimeoutError, match=r"no quorum of min_replicas=2 .*no other replica came"
        ):
            membership.quorum(0)
        assert time.monotonic() - start < 10
        assert any("waiting for a quorum of min_replicas=2" in line for line in lines)
    finally:
        membership.close()
        server.shutdown()
