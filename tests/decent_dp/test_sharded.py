"""The wrapper over a 2-D mesh (FSDP2 shards in a replica, gossip between replicas) on real gloo.

Each replica's gathered full parameters must equal a flat float64 replay in
which replica ``r`` is one worker whose gradient is the mean over its shard
ranks' batches (:mod:`tests.support.sharded_cases`). Bytes are read from the
tensors handed to ``all_reduce`` on the gossip groups, and the bad inputs must
fail in one line on every rank, before any gossip group exists.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from decent_dp import DecentralizedDataParallel
from decent_dp._engine.bucket import aligned_offsets
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.sharded_cases import (
    loss_at,
    make_tower,
    mesh_2d,
    optim_of,
    replay_compressed,
    replay_sharded,
    shard_tower,
    sharded_worker,
)


def _check(cfg: dict[str, Any], world: int) -> list[dict[str, Any]]:
    results = ok_values(run_distributed(sharded_worker, world, cfg, timeout=120))
    ref = replay_sharded(cfg, world)
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["flat"], ref[rank // cfg["shards"]], rtol=0, atol=1e-10)
    return results


@pytest.mark.parametrize("topology", ["ring", "one-peer-exp"])
@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_two_replicas_of_two_shards_match_the_flat_replay(topology: str, optim: str) -> None:
    results = _check({"shards": 2, "topology": topology, "steps": 4, "optim": optim}, 4)
    assert all(r["closed_unchanged"] and r["closed_grads"] for r in results)
    # the replicas moved apart and back together: the gossip did something
    assert not torch.equal(results[0]["flat"], results[2]["flat"])


@pytest.mark.slow  # 8 ranks; the fast tier has 8-rank runs below (int8, DiLoCo, consensus)
@pytest.mark.parametrize("topology", ["ring", "one-peer-exp"])
def test_four_replicas_of_two_shards_match_the_flat_replay(topology: str) -> None:
    cfg = {"shards": 2, "topology": topology, "steps": 5, "optim": "adamw", "bucket_mb": 25}
    _check(cfg, 8)


def test_global_norm_clipping_is_over_the_whole_replica() -> None:
    cfg = {"shards": 2, "topology": "ring", "steps": 3, "clip": 0.05, "bucket_mb": 25}
    _check(cfg, 4)
    # the bound binds: without it the replay ends elsewhere
    unclipped = replay_sharded({**cfg, "clip": 0.0}, 4)
    assert (unclipped[0] - replay_sharded(cfg, 4)[0]).abs().max() > 1e-3


def test_gradient_accumulation_sums_the_micro_batches() -> None:
    cfg = {"shards": 2, "topology": "ring", "steps": 3, "accum": 2, "optim": "adamw"}
    _check(cfg, 4)


def test_diloco_outer_rounds_average_the_replicas() -> None:
    cfg = {"shards": 2, "topology": "one-peer-exp", "steps": 5, "outer": 2, "bucket_mb": 25}
    _check(cfg, 8)
    plain = replay_sharded({**cfg, "outer": None}, 8)
    assert (plain[0] - replay_sharded(cfg, 8)[0]).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("world", "topology", "bucket_mb"), [(4, "ring", 25), (8, "one-peer-exp", 0)]
)
def test_int8_between_replicas_matches_the_compressed_replay(
    world: int, topology: str, bucket_mb: float
) -> None:
    cfg = {
        "shards": 2,
        "topology": topology,
        "steps": 5,
        "compression": "int8",
        "bucket_mb": bucket_mb,
    }
    results = ok_values(run_distributed(sharded_worker, world, cfg, timeout=120))
    ref = replay_compressed(cfg, world, results[0]["layout"])
    exact = replay_sharded(cfg, world)
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["flat"], ref[rank // 2], rtol=0, atol=1e-12)
    # the compression shows: the exact gossip ends elsewhere
    assert (ref[0] - exact[0]).abs().max() > 1e-4


def test_consensus_distance_and_averaged_are_over_the_replicas() -> None:
    cfg = {"shards": 2, "topology": "one-peer-exp", "steps": 3, "consensus": True}
    results = _check(cfg, 8)
    ref = replay_sharded(cfg, 8)
    mean = torch.stack(ref).mean(0)
    distance = float(sum(((x - mean) ** 2).sum() for x in ref)) / len(ref)
    assert distance > 0
    for res in results:
        assert res["consensus"] == pytest.approx(distance, rel=1e-9)
        torch.testing.assert_close(res["averaged"], mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(res["after"], res["flat"], rtol=0, atol=0)


def _bytes_worker(rank: int, world: int, shards: int) -> dict[str, Any]:
    mesh = mesh_2d(world // shards, shards)
    model = shard_tower(make_tower(seed=0), mesh)
    ddp = DecentralizedDataParallel(
        model, optim_fn=optim_of({}), topology="ring", device_mesh=mesh, bucket_size_in_mb=25
    )
    column = sorted(dist.get_process_group_ranks(mesh["replicate"].get_group()))
    seen: list[tuple[int, int]] = []
    real = dist.all_reduce

    def recording(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group")
        ranks = dist.get_process_group_ranks(group) if group is not None else []
        # the gossip's collectives: those of this shard index across the replicas
        if set(ranks) <= set(column) and len(ranks) > 1:
            seen.append((tensor.numel() * tensor.element_size(), len(ranks)))
        return real(tensor, *args, **kwargs)

    steps = 4
    dist.all_reduce = recording  # type: ignore[assignment]
    try:
        for t in range(1, steps + 1):
            loss_at(ddp, rank, t).backward()
    finally:
        dist.all_reduce = real  # type: ignore[assignment]
    locals_ = [p.to_local() for p in model.parameters()]
    out = {
        "seen": seen,
        "steps": steps,
        "reported": ddp.comm_bytes_per_step(),
        "shard_numel": sum(t.numel() for t in locals_),
        "aligned_numel": aligned_offsets(locals_, 8)[1],
        "model_numel": sum(p.numel() for p in model.parameters()),
    }
    ddp.close()
    return out


def test_a_shard_rank_sends_its_shard_only() -> None:
    shards = 2
    results = ok_values(run_distributed(_bytes_worker, 4, shards, timeout=120))
    model_numel = results[0]["model_numel"]
    # the shards of one replica partition the model
    assert sum(r["shard_numel"] for r in results[:shards]) == model_numel
    for res in results:
        # one exchange per step (one bucket), launched after each step, of the shard's block
        assert len(res["seen"]) == res["steps"]
        assert {nbytes for nbytes, _ in res["seen"]} == {res["aligned_numel"] * 8}
        assert (
            res["shard_numel"] <= -(-model_numel // shards) + 8
        )  # 1/S, up to the rounding of rows
        k = res["seen"][0][1]
        assert res["reported"] == 2 * (k - 1) / k * res["aligned_numel"] * 8  # a ring all-reduce


def _bad_worker(rank: int, world: int, case: str) -> str:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = mesh_2d(2, 2)
    model: Any = make_tower(seed=0)
    kwargs: dict[str, Any] = {"topology": "ring"}
    if case == "mesh_names":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        fully_shard(model, mesh=mesh["tp"])
    elif case == "mesh_1d":
        mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("shard",))
        fully_shard(model, mesh=mesh)
    elif case == "plain_model":
        pass
    elif case == "wrong_shard_mesh":
        fully_shard(model, mesh=init_device_mesh("cpu", (4,)))
    else:
        shard_tower(model, mesh)
    if case == "topology_size":
        from decent_dp.topo import TopologyReg

        kwargs["topology"] = TopologyReg.create("ring", 4, 1)
    elif case == "state_sync":
        kwargs["state_sync"] = {"exp_avg_sq": 1}
    elif case == "outer_compression":
        from functools import partial

        kwargs.update(
            outer_optim_fn=partial(torch.optim.SGD, lr=0.5),
            outer_every=2,
            outer_compression="int8",
        )
    elif case == "outer_fragments":
        from functools import partial

        kwargs.update(
            outer_optim_fn=partial(torch.optim.SGD, lr=0.5), outer_every=2, outer_fragments=2
        )
    elif case == "hierarchical":
        kwargs.update(topology="hierarchical", local_world_size=4)
    elif case == "scaler":
        kwargs["scaler"] = torch.amp.GradScaler("cpu")
    try:
        DecentralizedDataParallel(model, optim_fn=optim_of({}), device_mesh=mesh, **kwargs)
    except ValueError as exc:
        return str(exc)
    return "no error"


BAD = {
    "mesh_names": "dimensions ('dp', 'tp'); it must have exactly ('replicate', 'shard')",
    "mesh_1d": "it must be a 2-D DeviceMesh",
    "plain_model": "parameter 'l1.weight' is a plain Parameter, not sharded over device_mesh['shard']",
    "wrong_shard_mesh": "is sharded over ranks [0, 1, 2, 3], not over device_mesh['shard']",
    "topology_size": "built for world_size=4, but device_mesh has 2 replicas",
    "state_sync": "state_sync={'exp_avg_sq': 1} with device_mesh",
    "outer_compression": "outer_compression='int8' with device_mesh",
    "hierarchical": "topology='hierarchical' with device_mesh",
    "outer_fragments": "outer_fragments=2 with device_mesh: streaming outer rounds",
    "scaler": "with device_mesh: loss scaling is not supported",
}


def _bad_cases(rank: int, world: int, cases: list[str]) -> dict[str, str]:
    # one process group for every case: each fails before any collective of the wrapper,
    # so the next case starts with every rank in step
    return {case: _bad_worker(rank, world, case) for case in cases}


def test_bad_input_fails_in_one_line_on_every_rank() -> None:
    cases = sorted(BAD)
    for messages in ok_values(run_distributed(_bad_cases, 4, cases, timeout=120)):
        for case in cases:
            assert BAD[case] in messages[case], (case, messages[case])
            assert "\n" not in messages[case]


def _overlap_worker(rank: int, world: int) -> dict[str, Any]:
    mesh = mesh_2d(2, 2)
    model = shard_tower(make_tower(seed=0), mesh)
    ddp = DecentralizedDataParallel(
        model, optim_fn=optim_of({}), topology="ring", device_mesh=mesh, bucket_size_in_mb=0
    )
    loss_at(ddp, rank, 1).backward()  # the first backward records the order, then buckets
    ddp._engine.drain()  # step 1's gossip has arrived: no bucket of step 2 waits for it
    seen: list[list[str]] = []

    def when_l1_is_ready(_: torch.Tensor) -> None:
        # registered after the wrapper's own hook: runs once l1.weight's gradient is handed over
        seen.append([n for b in ddp._buckets or [] if b.stepped for n in b.names])

    handle = model.l1.weight.register_post_accumulate_grad_hook(when_l1_is_ready)
    loss_at(ddp, rank, 2).backward()
    handle.remove()
    ddp.close()
    return {"stepped_before_l1": seen[0]}


def test_buckets_step_inside_the_backward_pass_as_fsdp_hands_their_gradients_over() -> None:
    for res in ok_values(run_distributed(_overlap_worker, 4, timeout=120)):
        # the head's and l2's buckets stepped (and launched their gossip) before the
        # backward reached l1: the step overlaps the rest of the backward pass
        assert {"head.weight", "head.bias", "l2.weight", "l2.bias"} <= set(res["stepped_before_l1"])
        assert "l1.bias" not in res["stepped_before_l1"]
