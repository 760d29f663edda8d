"""Bytes of the ``hierarchical`` topology's three phases, inside a host and between hosts,
counted from the tensors handed to each collective on real gloo groups; and its bad
arguments, refused on every rank before any process group is made.
"""

from __future__ import annotations

from typing import Any

import pytest
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from tests.support.ddp_cases import make_model, make_optim, replay
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.hier_cases import hier_cfg, spy_worker

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
