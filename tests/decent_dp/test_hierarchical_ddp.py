"""The ``hierarchical`` topology's three-phase gossip on real gloo groups of 6 and 8 ranks.

Every run is compared with the single-process float64 replay of
``x(t) = W(t) x(t-1) + d(t)`` with ``W(t) = W_inter(t) ⊗ J_L / L``
(:func:`tests.support.ddp_cases.replay`, the matrices from the same topology
instance), and the bytes handed to each collective are counted inside a host
and between hosts.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from tests.decent_dp.test_outer import check as check_outer
from tests.decent_dp.test_outer_stream import NESTEROV, check_runs
from tests.support.ddp_cases import (
    assert_same_runs,
    make_model,
    replay,
    resume_worker,
    train_steps,
    wrap,
)
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.hier_cases import hier_cfg, runs_worker

__all__: list[str] = []

ATOL = 1e-9


def consensus(models: list[torch.Tensor]) -> float:
    stacked = torch.stack(models)
    return float(((stacked - stacked.mean(0)) ** 2).sum(1).mean())


def check_replays(cfgs: list[dict[str, Any]], world: int) -> list[list[dict[str, Any]]]:
    results = ok_values(run_distributed(runs_worker, world, cfgs, timeout=300))
    for c, cfg in enumerate(cfgs):
        expected = replay(cfg, world)
        for rank, exp in enumerate(expected):
            got = results[rank][c]
            assert got["step"] == cfg["steps"]
            assert_close(
                got["params"],
                exp,
                rtol=0,
                atol=ATOL,
                msg=lambda m, r=rank, c=cfg: f"{c} rank {r}: {m}",
            )
        if cfg.get("consensus"):
            assert results[0][c]["consensus"] == pytest.approx(consensus(expected), rel=1e-9)
        # hosts that never meet in one step do drift apart: the run is not trivially consensual
        assert (results[0][c]["params"] - results[-1][c]["params"]).abs().max() > 1e-6
    return results


def test_replay_4_hosts_of_2() -> None:
    check_replays(
        [
            hier_cfg(4, 2, steps=6, consensus=64),
            hier_cfg(4, 2, "ring", steps=5, optim="adamw", sched=True),
            hier_cfg(4, 2, "local-sgd", ik={"period": 3}, steps=7, optim="subclass_wd"),
        ],
        8,
    )


def test_replay_2_hosts_of_4() -> None:
    check_replays(
        [
            hier_cfg(2, 4, steps=5, consensus=64, optim="adam"),
            hier_cfg(2, 4, "complete", steps=4, stable=True, alpha=0.5),
        ],
        8,
    )


def test_replay_pads_buckets_that_hosts_of_3_do_not_divide() -> None:
    """Buckets of 32-element multiples (float64, 256-byte aligned): L=3 pads every chunk."""
    results = check_replays(
        [hier_cfg(2, 3, "ring", steps=5), hier_cfg(2, 3, steps=4, bucket_mb=1)], 6
    )
    assert results[0][0]["step"] == 5


def test_resume_replays_bit_for_bit(tmp_path: Any) -> None:
    cfg = hier_cfg(4, 2, "ring", steps=6, resume_at=3, optim="adamw", sched=True)
    straight = ok_values(run_distributed(resume_worker, 8, cfg, str(tmp_path), "straight"))
    ok_values(run_distributed(resume_worker, 8, cfg, str(tmp_path), "first"))
    resumed = ok_values(run_distributed(resume_worker, 8, cfg, str(tmp_path), "second"))
    assert_same_runs(straight, resumed, 6)


def test_outer_optimizer_replays() -> None:
    cfg = hier_cfg(4, 2, steps=7, every=3, **NESTEROV, outer="sgd")
    check_outer(cfg, world=8)


def test_outer_fragments_replay() -> None:
    """Fragments mix kinds of rounds in one step: three-phase and outer rounds on gloo."""
    base = {"fragments": 2, "every": 6, "steps": 14, **NESTEROV}
    check_runs(
        [
            {**hier_cfg(4, 2), **base, "plain": False},
            {**hier_cfg(2, 4, "local-sgd", ik={"period": 2}), **base, "plain": False},
        ],
        world=8,
    )


def unwaited_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """After the last backward, poll the in-flight exchanges without waiting for any."""
    ddp = wrap(make_model("mlp", seed=rank), cfg)
    train_steps(ddp, rank, cfg, 1, cfg["steps"])
    assert ddp._engine.buckets is not None
    works = [b.work for b in ddp._engine.buckets if b.work is not None]
    deadline = time.monotonic() + 30.0
    while not all(w.is_completed() for w in works) and time.monotonic() < deadline:
        time.sleep(0.005)
    done = all(w.is_completed() for w in works)
    ddp.close()
    return {"in_flight": len(works), "done": done}


def test_exchange_between_hosts_completes_without_a_wait() -> None:
    """Off NCCL, phases 2 and 3 start when phase 1 completes, not when the result is waited
    for: the exchange between hosts overlaps the computation instead of following it."""
    cfgs = [hier_cfg(2, 2, steps=2), hier_cfg(2, 2, "ring", steps=3)]
    for cfg in cfgs:
        for got in ok_values(run_distributed(unwaited_worker, 4, cfg, timeout=120)):
            assert got["in_flight"] > 1
            assert got["done"]


def delay_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """The calls a delay function with and without a ``ranks`` parameter gets."""
    out: dict[str, Any] = {}
    for name, topo_cfg in (("hier", cfg), ("ring", {**cfg, "topology": "ring"})):
        three: list[tuple[int, int, list[int]]] = []
        two: list[tuple[int, int]] = []
        for calls in (three, two):
            ddp = wrap(make_model("mlp", seed=rank), topo_cfg)
            if calls is three:
                ddp.set_comm_delay(lambda n, k, ranks, c=calls: c.append((n, k, ranks)) or 0.0)
            else:  # a default argument is no ranks parameter
                ddp.set_comm_delay(lambda n, k, c=calls: c.append((n, k)) or 0.0)
            train_steps(ddp, rank, topo_cfg, 1, 2)
            ddp.close()
        out[name] = {"three": three, "two": two}
    return out


def test_a_delay_function_with_a_ranks_parameter_gets_the_groups_ranks() -> None:
    """An emulated network can tell a host's loopback from its link: the ranks of the group."""
    cfg = hier_cfg(2, 2, steps=2)
    for rank, got in enumerate(ok_values(run_distributed(delay_worker, 4, cfg, timeout=120))):
        hier, ring = got["hier"], got["ring"]
        assert hier["three"] and ring["three"]
        # phase 2 of each bucket: this rank's local rank on both hosts
        assert {tuple(r) for _, _, r in hier["three"]} == {(rank % 2, rank % 2 + 2)}
        for _, k, ranks in ring["three"]:
            assert k == len(ranks) == 2 and rank in ranks and ranks == sorted(ranks)
        # the two-argument form gets the same sizes, without the ranks
        for name in ("hier", "ring"):
            assert [c[:2] for c in got[name]["three"]] == [tuple(c) for c in got[name]["two"]]
