"""Bytes of the ``hierarchical`` topology's three phases, inside a host and between hosts,
counted from the tensors handed to each collective on real gloo groups (edges of 2 and 3
hosts, and a flat topology's groups inside and across hosts); the bytes the network
emulation is asked to time for a hierarchical step; and its bad arguments, refused on
every rank before any process group is made.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from tests.support.codecs import int8_payload
from tests.support.ddp_cases import make_model, make_optim, replay, train_steps
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.hier_cases import hier_cfg, hosts_of_two, spy_worker

__all__: list[str] = []

ATOL = 1e-9


@pytest.mark.parametrize(("hosts", "local"), [(4, 2), (2, 4), (2, 3)])
def test_bytes_per_collective_inside_and_between_hosts(hosts: int, local: int) -> None:
    cfg = hier_cfg(hosts, local, "ring", steps=4)
    world = hosts * local
    values = ok_values(run_distributed(spy_worker, world, cfg, timeout=300))
    for rank, (got, exp) in enumerate(zip(values, replay(cfg, world))):
        assert_close(got["params"], exp, rtol=0, atol=ATOL)
        steps = cfg["steps"]  # launches for steps 2..steps+1: whole periods of ring's 2 rounds
        assert got["intra"] / steps == pytest.approx(got["by_link"]["intra_host"], rel=1e-12)
        assert got["inter"] / steps == pytest.approx(got["by_link"]["inter_host"], rel=1e-12)
        assert got["total"] == pytest.approx(got["intra"] / steps + got["inter"] / steps, rel=1e-12)
        # a host's link carries one model per step, not L: each rank sends 1/L of it across
        size = 8  # float64
        chunks = sum(-(-n // local) for n in got["numels"])
        k = 2  # ring over 2 or 4 hosts pairs hosts
        assert got["by_link"]["inter_host"] == pytest.approx(2 * (k - 1) / k * chunks * size)
        assert got["kinds"] == [
            ("all_gather", local),
            ("all_reduce", 2),  # ring pairs the hosts: local rank l with its partner's
            ("reduce_scatter", local),
        ], rank
        assert got["peak"] >= got["total"]
        assert got["peak_by_link"]["inter_host"] >= got["by_link"]["inter_host"]


def _bad_worker(rank: int, world: int, kwargs: dict[str, Any]) -> str:
    try:
        DecentralizedDataParallel(
            make_model("mlp", seed=rank), make_optim({}), topology="hierarchical", **kwargs
        )
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"local_world_size": 3}, "local_world_size=3 must divide world_size=4; allowed: 1, 2, 4"),
        (
            {"topology_kwargs": {"inter": "star"}},
            "inter='star' is not a known topology; known: complete",
        ),
        ({"local_world_size": 2, "compression": "randk"}, "compression='randk'"),
    ],
)
def test_bad_arguments_raise_on_every_rank_before_any_group(
    kwargs: dict[str, Any], fragment: str
) -> None:
    for message in ok_values(run_distributed(_bad_worker, 4, kwargs, timeout=120)):
        assert fragment in message and "\n" not in message


def _split_matches_the_collectives(cfg: dict[str, Any], world: int) -> list[dict[str, Any]]:
    """Each rank's bytes inside / between hosts, as counted from the collectives it was handed,
    are what ``comm_bytes_by_link`` reports (mean of the period's steps)."""
    values = ok_values(run_distributed(spy_worker, world, cfg, timeout=300))
    steps = cfg["steps"]  # launches for steps 2..steps+1: whole periods
    for rank, (got, exp) in enumerate(zip(values, replay(cfg, world))):
        assert_close(got["params"], exp, rtol=0, atol=ATOL)
        assert got["by_link"] == pytest.approx(
            {"intra_host": got["intra"] / steps, "inter_host": got["inter"] / steps}, rel=1e-12
        ), rank
    return values


def test_an_edge_of_three_hosts_counts_its_chunk_all_reduce_over_three() -> None:
    # ring over 3 hosts: every round is one edge of the 3 hosts (k = 3), whose chunk all-reduce
    # sends 2 (k-1)/k of the chunk (4/3 of it), not the chunk once as a pair of hosts does
    hosts, local = 3, 2
    cfg = hier_cfg(hosts, local, "ring", steps=2)
    values = _split_matches_the_collectives(cfg, hosts * local)
    for got in values:
        assert got["kinds"] == [("all_gather", local), ("all_reduce", 3), ("reduce_scatter", local)]
        chunks = sum(-(-n // local) for n in got["numels"])
        assert got["by_link"]["inter_host"] == pytest.approx(2 * 2 / 3 * chunks * 8)


def test_groups_inside_one_host_count_inside() -> None:
    # ring on 2 hosts of 2, flat: round 0 pairs ranks of one host ({0, 1}, {2, 3}), round 1
    # pairs across the hosts ({0, 3}, {1, 2}); each carries half the steps' bytes (a host
    # told by r % L instead of r // L would put {0, 1} and {0, 3} both between hosts)
    cfg = {"topology": "ring", "local_world_size": 2, "bucket_mb": 0, "steps": 4}
    values = _split_matches_the_collectives(cfg, 4)
    for got in values:
        assert got["intra"] > 0 and got["intra"] == pytest.approx(got["inter"], rel=1e-12)


def _charged_worker(rank: int, world: int, compression: str | None) -> dict[str, Any]:
    """What the network emulation is asked to time at each launch of a hierarchical step."""
    ddp = hosts_of_two(rank, world, compression)
    charged: list[tuple[int, int, list[int]]] = []

    def delay(nbytes: int, group_size: int, ranks: list[int]) -> float:
        charged.append((nbytes, group_size, list(ranks)))
        return 0.0

    ddp.set_comm_delay(delay)
    train_steps(ddp, rank, {}, 1, 3)
    numels = [b["numel"] for b in ddp.buckets_info]
    ddp.close()
    return {"charged": charged, "numels": numels}


@pytest.mark.parametrize("compression", [None, "int8"])
def test_the_emulated_host_link_is_charged_this_ranks_chunk(compression: str | None) -> None:
    # 2 hosts of 2: local rank l carries chunk l (ceil(N / 2) elements) to local rank l of
    # the other host; that chunk (or its int8 payload), not the bucket, crosses the host link
    local, world = 2, 4
    values = ok_values(run_distributed(_charged_worker, world, compression, timeout=300))
    for rank, got in enumerate(values):
        chunks = [torch.zeros(-(-n // local), dtype=torch.float64) for n in got["numels"]]
        sizes = [
            int8_payload(c).numel() if compression else c.numel() * c.element_size() for c in chunks
        ]
        across = [rank % local, rank % local + local]
        # launches for steps 2, 3 and 4, each in bucket order
        assert got["charged"] == [(s, 2, across) for _ in range(3) for s in sizes], rank
