"""Replica groups of several processes (one torchrun per host) in elastic membership.

2 replica groups x 2 processes, each a spawned process with its own torchft
``Manager`` of its group rank, on an in-process lighthouse on loopback.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchft")

from decent_dp.elastic._quorum import Membership  # noqa: E402
from tests.support import elastic_group_cases as gc  # noqa: E402

PROCS = [(rid, g) for rid in ("hostA", "hostB") for g in range(gc.GROUP)]


# slow: the elastic wrapper's fast test of hosts of two processes (hierarchical) runs this path
@pytest.mark.slow
def test_two_groups_of_two_processes_share_quorums_a_flat_group_and_heal_per_rank() -> None:
    reports = gc.run()
    errors = {k: r["error"] for k, r in reports.items() if "error" in r}
    assert not errors, errors
    views = {k: reports[k]["view"][0] for k in PROCS}
    # every process of every member reads the same quorum, its own ranks
    first = views[PROCS[0]]
    for (rid, g), v in views.items():
        assert v["members"] == ["hostA", "hostB"], v
        assert v["steps"] == [gc.STEPS["hostA"], gc.STEPS["hostB"]]
        assert v["quorum_id"] == first["quorum_id"]
        assert v["rank"] == v["members"].index(rid)
        assert (v["group_rank"], v["group_world_size"]) == (g, gc.GROUP)
        assert v["process_addresses"] == first["process_addresses"]
        assert v["addresses"] == [row[0] for row in v["process_addresses"]]
    # each process has its own checkpoint server, on its group's address
    addresses = [a for row in first["process_addresses"] for a in row]
    assert len(set(addresses)) == 2 * gc.GROUP
    for r, rid in enumerate(first["members"]):
        assert all(f"//{gc.HOSTS[rid]}:" in a for a in first["process_addresses"][r])
    # torchft's store of group rank g's group is member g's group store, on the address that
    # member advertises (not the rendezvous stores' 127.0.0.1): one store per group rank, so
    # world_store must pick one for all of them
    stores = {k: reports[k]["view"][1] for k in PROCS}
    for g in range(gc.GROUP):
        (store,) = {s for (_, h), s in stores.items() if h == g}
        assert store.endswith(f"/torchft/{first['quorum_id']}/{g}"), stores
        assert store.split(":")[0] == gc.HOSTS[first["members"][g]], stores
    # the flat group of 4 from world_store: ranks rank * 2 + group_rank, an exact sum
    flats = {k: reports[k]["sums"][0] for k in PROCS}
    assert sorted(flats.values()) == [0, 1, 2, 3]
    for (rid, g), flat in flats.items():
        assert flat == views[(rid, g)]["rank"] * gc.GROUP + g
    expected = sum(gc.flat_values(f) for f in range(4))
    for k in PROCS:
        assert torch.equal(torch.tensor(reports[k]["sums"][1], dtype=torch.float64), expected)
        # the quorum's group: the flat ranks of this group rank, one per member
        g = k[1]
        assert reports[k]["sums"][2] == sum(r * gc.GROUP + g for r in range(2))
    # group rank g of hostB fetched what group rank g of hostA staged
    for g in range(gc.GROUP):
        got = torch.tensor(reports[("hostB", g)]["fetched"][0], dtype=torch.float64)
        assert torch.equal(got, gc.staged_state("hostA", g))
        assert not torch.equal(got, gc.staged_state("hostA", 1 - g))
    # hostB left: hostA's processes see one member and a flat group of 2
    for g in range(gc.GROUP):
        v = reports[("hostA", g)]["view2"][0]
        assert (v["members"], v["steps"], v["rank"], v["group_rank"]) == (
            ["hostA"],
            [gc.STEPS["hostA"] + 1],
            0,
            g,
        )
        assert v["quorum_id"] != first["quorum_id"]
        assert len(v["process_addresses"]) == 1
        flat, total = reports[("hostA", g)]["sums2"]
        assert flat == g
        assert torch.equal(torch.tensor(total), gc.flat_values(0) + gc.flat_values(1))


@pytest.mark.slow  # hostA's group rank 1 fails only at the quorum's timeout
def test_groups_of_different_sizes_are_refused() -> None:
    reports = gc.run({"hostA": 2, "hostB": 1})
    assert set(reports) == {("hostA", 0), ("hostA", 1), ("hostB", 0)}
    # each member's group rank 0 names the sizes in one line
    for rid, mine in (("hostA", 2), ("hostB", 1)):
        (line,) = reports[(rid, 0)]["error"]
        assert line.startswith(f"ValueError: group_world_size={mine} differs between the members")
        assert "([1, 2])" in line and "\n" not in line
    # hostA's group rank 1 has no peer of its group rank: torchft's gloo group of the quorum
    # cannot form, and the quorum fails
    assert "error" in reports[("hostA", 1)]


@pytest.mark.slow  # two torchruns of two processes each
def test_two_torchruns_form_one_quorum_through_torchruns_stores() -> None:
    import json
    import os
    import sys
    from pathlib import Path

    from tests.support import elastic_cases as ec

    root = str(Path(__file__).resolve().parents[2])
    done = ec.host_torchruns(
        lambda rid, url: (
            [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            + ["--nproc_per_node", "2", "-m", "tests.support.elastic_group_torchrun", rid, url]
        ),
        ("hostA", "hostB"),
        cwd=root,
        env=dict(os.environ, PYTHONPATH=root),
        timeout=90,
    )
    outs = [out for _, out in done]
    assert all(code == 0 for code, _ in done), outs
    lines = [
        json.loads(line.split("RESULT ", 1)[1])
        for out in outs
        for line in out.splitlines()
        if "RESULT " in line
    ]
    assert sorted((x["rid"], x["g"], x["flat"]) for x in lines) == [
        ("hostA", 0, 0),
        ("hostA", 1, 1),
        ("hostB", 0, 2),
        ("hostB", 1, 3),
    ]
    assert all(x["members"] == ["hostA", "hostB"] and x["sum"] == 15.0 for x in lines)


@pytest.mark.parametrize(
    ("group_rank", "group_world_size", "match"),
    [
        (2, 2, r"group_rank=2 is invalid; it must be in \[0, group_world_size=2\)"),
        (-1, 2, r"group_rank=-1 is invalid"),
        (0, 0, r"group_world_size=0 is invalid; it must be >= 1"),
    ],
)
def test_a_bad_group_rank_is_one_line(group_rank: int, group_world_size: int, match: str) -> None:
    # raised before the lighthouse is asked or torchft is started (nothing listens there)
    with pytest.raises(ValueError, match=match) as e:
        Membership(
            "http://127.0.0.1:9",
            "r",
            1,
            1.0,
            group_rank=group_rank,
            group_world_size=group_world_size,
        )
    assert "\n" not in str(e.value)


def test_a_group_without_a_rendezvous_store_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ValueError, match=r"group_store=None with group_world_size=2 needs") as e:
        Membership("http://127.0.0.1:9", "r", 1, 1.0, group_rank=1, group_world_size=2)
    assert "\n" not in str(e.value)
