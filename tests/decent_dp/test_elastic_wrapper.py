"""The wrapper's own path, elastic: buckets stepped in the backward pass, gossip over a torchft quorum.

Each replica is a real process with an :class:`decent_dp.elastic.ElasticDataParallel`
on an in-process lighthouse on loopback; its steps are replayed in float64 in
one process (:func:`tests.support.elastic_cases.replay`), ``W(t)`` built over
the members of each step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchft")

from tests.support import elastic_cases as ec  # noqa: E402
from tests.support import elastic_wrapper_cases as ew  # noqa: E402

RIDS = ["r0", "r1", "r2", "r3"]


def _plans(
    steps: int, every: int, topology: str = "ring", **r2: object
) -> dict[str, dict[str, object]]:
    plans: dict[str, dict[str, object]] = {
        rid: {"steps": steps, "every": every, "topology": topology} for rid in RIDS
    }
    plans["r2"].update(r2)
    return plans


def _leave_and_rejoin(
    steps: int, every: int, topology: str = "ring", **extra: object
) -> dict[str, dict[str, object]]:
    """r2 leaves cleanly after step ``every`` and rejoins at the quorum of step ``2 every + 1``."""
    plans = _plans(
        steps, every, topology, leave_after=every, rejoin_when="rejoin", set_at={"joined": every}
    )
    for rid, plan in plans.items():
        plan.update(extra)
        if rid != "r2":
            plan["set_at"] = {"rejoin": every + 2}
            plan["wait_for"] = {"joined": 2 * every}
    return plans


@pytest.mark.parametrize("topology", ["ring", pytest.param("one-peer-exp", marks=pytest.mark.slow)])
def test_the_wrapper_replays_4_3_4_in_float64(topology: str) -> None:
    """r2 leaves after step 4 and comes back with its stale state; it heals at step 8.

    Each step accumulates two micro-batches (the first under ``no_sync()``).
    ``one-peer-exp`` over the 3 members runs as ``base-k`` with ``k=1``.
    """
    every = 4
    plans = _leave_and_rejoin(12, every, topology, accumulate=True)
    reports = ec.run(plans, {}, timeout=150, target=ew.replica)
    result = ec.replay(reports, topology, every, identical_start=True, accumulate=True)
    members = result["members"]
    assert [len(members[t]) for t in range(1, 13)] == [4] * 4 + [3] * 4 + [4] * 4
    steps = result["steps"]
    # between quorums each bucket mixed with its edge (the replay checked which)
    assert topology != "ring" or all(
        steps[rid][t]["mixed"] for rid in RIDS for t in range(2, 13) if t in steps[rid]
    )
    resumed = [m for m in reports["r2"] if m[0] == "resumed"]
    assert resumed and resumed[0][1] == 4
    # its neighbour in the round of step 9 (ring: rank 3; one-peer-exp: round 0 pairs 2 with 3)
    assert steps["r2"][9]["healed_from"] == "r3"
    assert steps["r2"][9]["cursor"] == 8  # the data position came with the state
    # r3 staged its state for r2 at the quorum of step 9 and withdrew it once r2 had it
    assert not any(s["staged"] for rid in RIDS for s in steps[rid].values())
    assert all(m[-1][0] == "done" and m[-1][1] == 12 for m in reports.values())


@pytest.mark.slow  # about 20 s of five processes; find_lost and survivors_of are tested fast
def test_a_peer_lost_between_quorums_leaves_the_rest_of_its_edge_averaging() -> None:
    """``complete`` over 4, r2 killed after step 2: the other three average among themselves
    (r2's weight goes to them) for the rest of the quorum's interval."""
    every = 8  # no quorum after the kill: the survivors finish the interval
    plans = _plans(6, every, "complete", kill_after=2)
    for plan in plans.values():  # the survivor whose exchange waits on r2 waits this long
        plan["timeout_s"] = 5.0
    reports = ec.run(plans, {}, timeout=150, target=ew.replica)
    result = ec.replay(reports, "complete", every, identical_start=True)
    assert [len(result["members"][t]) for t in range(1, 7)] == [4] * 6
    steps = result["steps"]
    survivors = ("r0", "r1", "r3")
    for rid in survivors:
        assert sorted(steps[rid]) == list(range(1, 7))
        # step 3's exchange may have carried r2's part to some of them before it died (the
        # others then mix nothing, and meet them at step 4's); from step 5 on, never
        for t in (5, 6):
            assert sorted(steps[rid][t]["mixed"]) == [r for r in survivors if r != rid]
    assert all(m[-1][0] == "done" for rid, m in reports.items() if rid != "r2")


@pytest.mark.gpu
def test_the_wrapper_replays_4_3_4_with_cuda_tensors() -> None:
    """The same replay with the model and data on the GPU (4 replicas on one GPU, gloo)."""
    every = 4
    plans = _leave_and_rejoin(12, every, device="cuda")
    reports = ec.run(plans, {}, timeout=240, target=ew.replica)
    result = ec.replay(reports, "ring", every, identical_start=True)
    assert [len(result["members"][t]) for t in range(1, 13)] == [4] * 4 + [3] * 4 + [4] * 4


def _ref_groups(result: dict, t: int) -> list[list[str]]:
    """The groups of each round of the topology over the members of step ``t``."""
    from decent_dp.elastic import elastic_topology

    members = result["members"][t]
    topo = elastic_topology("ring", len(members), {})
    groups = []
    for r in range(topo.period):
        seen = set()
        for i in range(len(members)):
            edge = tuple(sorted(topo.get_edge(r, i).ranks))
            if len(edge) > 1 and edge not in seen:
                seen.add(edge)
                groups.append((r, [members[j] for j in edge]))
    return groups


def _check_refs(reports: dict, last: int) -> int:
    """Every round's reference equal on each member of its group at every step; how many checked."""
    steps: dict[str, dict[int, dict]] = {rid: {} for rid in reports}
    for rid, msgs in reports.items():
        for m in msgs:
            assert m[0] != "error", f"{rid}: {m[1]}"
            if m[0] == "step":
                steps[rid][m[1]] = m[2]
    first = {t: next(s[t] for s in steps.values() if t in s) for t in range(1, last + 1)}
    result = {"members": {t: first[t]["members"] for t in range(1, last + 1)}}
    checked = 0
    for t in range(1, last + 1):
        for r, group in _ref_groups(result, t):
            refs = [steps[rid][t]["refs"].get(r) for rid in group if t in steps[rid]]
            if len(refs) < 2 or any(x is None for x in refs):
                continue
            assert all(x == refs[0] for x in refs), (t, r, group)
            checked += 1
    return checked


@pytest.mark.slow
def test_compressed_references_stay_identical_when_a_host_is_killed() -> None:
    """int8 gossip, r2 killed after step 2: its neighbours' exchanges fail and move no reference."""
    every = 4
    plans = _plans(12, every, kill_after=2)
    for plan in plans.values():
        plan["compression"] = "int8"
    for rid in ("r0", "r1", "r3"):
        plans[rid]["set_at"] = {"restart": 6}
        plans[rid]["wait_for"] = {"joined": 8}
    restart = dict(plans["r2"], kill_after=None, set_at={"joined": 0})
    reports = ec.run(
        plans, {"r2": dict(restart, after_event="restart")}, timeout=150, target=ew.replica
    )
    assert _check_refs(reports, 12) >= 20
    for rid in ("r0", "r1", "r3"):
        assert [m[1] for m in reports[rid] if m[0] == "step"] == list(range(1, 13))


# slow: the framework's two-host run gossips int8 in the fast tier
@pytest.mark.slow
def test_compressed_references_stay_identical_within_each_group_through_4_3_4() -> None:
    """int8 gossip: every round's reference is the same on each member of its group, every step.

    A membership change rebuilds the rounds' groups; every member starts the
    references afresh at that step. A joiner that took its source's references
    (or a survivor that kept those of its old groups) would hold another
    reference than its new neighbour, and the check fails.
    """
    every = 4
    plans = _leave_and_rejoin(12, every, compression="int8")
    reports = ec.run(plans, {}, timeout=150, target=ew.replica)
    checked = _check_refs(reports, 12)
    steps = {rid: {m[1]: m[2] for m in msgs if m[0] == "step"} for rid, msgs in reports.items()}
    # references moved (the gossip ran compressed) and were checked after each change
    assert checked >= 20
    assert any(any(v != 0.0 for v in steps["r2"][12]["refs"][r]) for r in steps["r2"][12]["refs"])
    assert all(m[-1][0] == "done" and m[-1][1] == 12 for m in reports.values())


@pytest.mark.slow
def test_a_killed_host_costs_the_survivors_no_step_and_heals_past_its_checkpoint(
    tmp_path: Path,
) -> None:
    """r2 is killed after step 2; its neighbours' exchanges with it fail and keep its weight."""
    every = 4
    ckpt = str(tmp_path / "r2.pt")
    plans = _plans(12, every, kill_after=2, save_at=2, save_to=ckpt)
    for rid in ("r0", "r1", "r3"):
        plans[rid]["set_at"] = {"restart": 6}
        plans[rid]["wait_for"] = {"joined": 8}
    restart = dict(plans["r2"], kill_after=None, save_at=None, resume=ckpt, set_at={"joined": 2})
    reports = ec.run(
        plans, {"r2": dict(restart, after_event="restart")}, timeout=150, target=ew.replica
    )
    result = ec.replay(reports, "ring", every, identical_start=True)
    members = result["members"]
    assert [len(members[t]) for t in range(1, 13)] == [4] * 4 + [3] * 4 + [4] * 4
    lost = {
        (t, rid)
        for rid in ("r1", "r3")
        for t in (3, 4)
        if "r2" not in result["steps"][rid][t]["mixed"]
    }
    assert lost, "no survivor noticed r2's death"
    for rid in ("r0", "r1", "r3"):
        assert sorted(result["steps"][rid]) == list(range(1, 13))
    resumed = [m for m in reports["r2"] if m[0] == "resumed"]
    assert resumed and resumed[0][1] == 2
    assert result["steps"]["r2"][9]["healed_from"] in ("r1", "r3")
    assert result["steps"]["r2"][9]["cursor"] == 8


@pytest.mark.parametrize(
    ("topology", "every", "outer_every"),
    # slow, all: the fast tier's replay is of one process per host (make test's budget)
    [
        pytest.param("ring", 4, None, marks=pytest.mark.slow),
        pytest.param("hierarchical", 4, None, marks=pytest.mark.slow),
        pytest.param("ring", 2, 4, marks=pytest.mark.slow),
    ],
)
def test_hosts_of_two_processes_leave_and_rejoin_together_replayed_per_process(
    topology: str, every: int, outer_every: int | None
) -> None:
    """Two replica groups (hosts) of two processes each, the topology over the 4 processes.

    hB's two processes leave after step ``every`` and come back; the topology
    re-forms over hA's 2 processes, then over 4 again. Every process heals from
    its source's process of the same group rank. ``hierarchical`` averages each
    host and, between hosts, runs ``ring`` (its three phases: reduce-scatter in
    the host, all-reduce across, all-gather), the host being the replica group.
    With ``outer_every`` the outer rounds average every process (the change at
    step 5 restarts the round, step 9 takes an outer step).
    """
    size = 2
    kwargs = {"inter": "ring"} if topology == "hierarchical" else {}
    ports = {"hA": ec.free_port(), "hB": ec.free_port()}
    plans: dict[str, dict[str, object]] = {}
    for host in ("hA", "hB"):
        for g in range(size):
            plan: dict[str, object] = {"steps": 12, "every": every, "topology": topology}
            plan["group"] = (host, g, size, ports[host])
            plan["topology_kwargs"] = kwargs
            plan["outer_every"] = outer_every
            if host == "hB":
                plan.update(leave_after=every, rejoin_when="rejoin", set_at={"joined": every})
            else:
                plan.update(set_at={"rejoin": every + 2}, wait_for={"joined": 2 * every})
            plans[f"{host}.{g}"] = plan
    reports = ec.run(plans, {}, timeout=180, target=ew.replica)
    result = ec.replay(
        reports,
        topology,
        every,
        outer_every=outer_every,
        identical_start=True,
        local=size,
        topology_kwargs=kwargs,
    )
    members = result["members"]
    assert [len(members[t]) for t in range(1, 13)] == [4] * every + [2] * every + [4] * (
        12 - 2 * every
    )
    for g in range(size):
        assert result["steps"][f"hB.{g}"][2 * every + 1]["healed_from"] == f"hA.{g}"
        assert result["steps"][f"hB.{g}"][2 * every + 1]["cursor"] == 2 * every
    if topology == "hierarchical":  # each process mixed with every other of the edge's hosts
        assert result["steps"]["hA.0"][10]["mixed"] == ["hA.1", "hB.0", "hB.1"]


@pytest.mark.slow
def test_a_killed_host_of_two_processes_under_hierarchical_costs_no_survivor_a_step() -> None:
    """hB (both processes) killed after step 2: hA's exchanges across fail in phase 2 and mix
    nothing; hA averages alone from the quorum of step 5; hB restarts and heals at step 9."""
    every, size = 4, 2
    kwargs = {"inter": "ring"}
    ports = {"hA": ec.free_port(), "hB": ec.free_port()}
    plans: dict[str, dict[str, object]] = {}
    restarts: dict[str, dict[str, object]] = {}
    for host in ("hA", "hB"):
        for g in range(size):
            plan: dict[str, object] = {"steps": 12, "every": every, "topology": "hierarchical"}
            plan.update(group=(host, g, size, ports[host]), topology_kwargs=kwargs)
            if host == "hB":
                plan["kill_after"] = 2
                restarts[f"{host}.{g}"] = dict(
                    plan, kill_after=None, set_at={"joined": 0}, after_event="restart"
                )
            else:
                plan.update(set_at={"restart": 6}, wait_for={"joined": 8})
            plans[f"{host}.{g}"] = plan
    reports = ec.run(plans, restarts, timeout=180, target=ew.replica)
    result = ec.replay(
        reports, "hierarchical", every, identical_start=True, local=size, topology_kwargs=kwargs
    )
    members = result["members"]
    assert [len(members[t]) for t in range(1, 13)] == [4] * 4 + [2] * 4 + [4] * 4
    for g in range(size):
        steps = result["steps"][f"hA.{g}"]
        assert sorted(steps) == list(range(1, 13))
        assert steps[3]["mixed"] == [] or steps[4]["mixed"] == []  # the lost exchange
        assert result["steps"][f"hB.{g}"][9]["healed_from"] == f"hA.{g}"


@ec.isolated  # torchft's threads (and the wrapper's process group) stay out of the test process
def test_close_keeps_the_training_state() -> None:
    """After close(), step_count and elastic_state() are what they were just before it."""
    import torch

    from decent_dp.elastic import ElasticDataParallel

    server = ec.lighthouse()
    model = torch.nn.Linear(2, 1)
    edp = ElasticDataParallel(
        model,
        lambda named: torch.optim.SGD([p for _, p in named], lr=0.1, momentum=0.9),
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
        lighthouse=ec.loopback_address(server),
        replica_id="solo",
        timeout_s=5.0,
        quorum_every=2,
        host="127.0.0.1",
        log=lambda line: None,
    )
    try:
        for _ in range(3):
            edp(torch.ones(4, 2)).sum().backward()
        step, before = edp.step_count, edp.elastic_state()
        edp.close()
        after = edp.elastic_state()
    finally:
        edp.close()
        server.shutdown()
    assert step == 3 and edp.step_count == 3
    training = after["training"]
    assert training["step"] == 3 and training["optimizers"] and training["schedulers"]
    assert "momentum_buffer" in training["optimizers"][0]["state"][0]
    assert training["schedulers"][0]["last_epoch"] == 3
    assert repr(training) == repr(before["training"])
    assert repr(after["model"]) == repr(before["model"])


@pytest.mark.slow  # 4 processes through three changes of membership
def test_outer_rounds_fall_on_quorums_and_restart_at_each_change_4_3_4() -> None:
    """DiLoCo on the wrapper over 4 -> 3 -> 4: quorums every 2 steps, outer rounds every 4.

    r2 leaves after step 2 (the quorum of step 3 restarts the round from the 3
    members' mean), the outer round of step 5 steps the outer optimizer, r2
    rejoins at the quorum of step 7 (the round restarts again; r2 heals the outer
    momentum from its neighbour) and the round of step 9 steps with that momentum.
    """
    every, outer_every = 2, 4
    plans = _plans(10, every, leave_after=2, rejoin_when="rejoin", set_at={"joined": 2})
    for rid, plan in plans.items():
        plan["outer_every"] = outer_every
        if rid != "r2":
            plan["set_at"] = {"rejoin": 4}
            plan["wait_for"] = {"joined": 6}
    reports = ec.run(plans, {}, timeout=150, target=ew.replica)
    result = ec.replay(reports, "ring", every, outer_every=outer_every, identical_start=True)
    assert [len(result["members"][t]) for t in range(1, 11)] == [4] * 2 + [3] * 4 + [4] * 4
    assert result["steps"]["r2"][7]["healed_from"] in ("r1", "r3")


@pytest.mark.slow  # the survivors wait out timeout_s for the member that died
def test_a_member_that_dies_inside_a_quorum_is_dropped_and_the_others_go_on() -> None:
    """r2 joins the quorum of step 5 and dies before it takes part in it.

    The others wait for it on the quorum's store for timeout_s, then ask again:
    the lighthouse, no longer hearing r2, forms a quorum of three.
    """
    every = 4
    plans = _plans(8, every, die_in_quorum_at=4)
    for plan in plans.values():
        plan["timeout_s"] = 3.0
    reports = ec.run(plans, {}, timeout=150, target=ew.replica)
    assert reports["r2"][-1][0] == "died"
    reports["r2"] = [m for m in reports["r2"] if m[0] != "died"]
    result = ec.replay(reports, "ring", every, identical_start=True)
    assert [len(result["members"][t]) for t in range(1, 9)] == [4] * 4 + [3] * 4
