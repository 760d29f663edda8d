"""Checkpoints of the sharded wrapper through torch.distributed.checkpoint, on real gloo.

A run of 2 replicas x 2 shards saved at step 3 and resumed in fresh processes
must end where the uninterrupted run ends; loaded into 4 replicas of 1 shard
(another shard and replica count), each new replica must hold saved replica
``r mod 2``'s parameters and optimizer states, and train on.
"""

from __future__ import annotations

from typing import Any

import torch

from decent_dp import load_sharded_checkpoint, save_sharded_checkpoint
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.sharded_cases import (
    full_flat,
    loss_at,
    make_tower,
    mesh_2d,
    shard_tower,
    wrap_sharded,
)

CFG = {"topology": "ring", "optim": "adamw", "bucket_mb": 25}


def _optim_flat(ddp: Any, model: torch.nn.Module) -> torch.Tensor:
    """Every parameter's ``exp_avg`` as the whole replica's (gathered over the shard ranks)."""
    from decent_dp.sharded.checkpoint import _as_dtensor, _optimizers_by_leaf, _sharded_params

    optims = _optimizers_by_leaf(ddp._engine)
    parts = []
    for _, param, leaf in _sharded_params(ddp):
        local = optims[id(leaf)].state[leaf]["exp_avg"]
        parts.append(_as_dtensor(local, param).full_tensor().reshape(-1))
    return torch.cat(parts)


def _worker(rank: int, world: int, shards: int, phase: str, path: str) -> dict[str, Any]:
    mesh = mesh_2d(world // shards, shards)
    model = shard_tower(make_tower(seed=rank // shards), mesh)
    ddp = wrap_sharded(model, mesh, CFG)
    out: dict[str, Any] = {}
    first = 1
    if phase == "straight":
        for t in range(1, 4):
            loss_at(ddp, rank, t).backward()
        save_sharded_checkpoint(ddp, path)
        out["saved"] = full_flat(model)
        out["saved_optim"] = _optim_flat(ddp, model)
        first = 4
    else:
        out["extras"] = load_sharded_checkpoint(ddp, path)
        out["loaded"] = full_flat(model)
        out["loaded_optim"] = _optim_flat(ddp, model)
        first = 4
    for t in range(first, 6):
        loss_at(ddp, rank, t).backward()
    out["final"] = full_flat(model)
    out["step"] = ddp.step_count
    ddp.close()
    return out


def test_a_resume_repeats_the_run_and_another_mesh_loads_it(tmp_path: Any) -> None:
    path = str(tmp_path / "ckpt")
    straight = ok_values(run_distributed(_worker, 4, 2, "straight", path, timeout=120))
    resumed = ok_values(run_distributed(_worker, 4, 2, "resume", path, timeout=120))
    for a, b in zip(straight, resumed):
        assert b["extras"]["step"] == 3 and b["step"] == 5
        torch.testing.assert_close(b["loaded"], a["saved"], rtol=0, atol=0)
        torch.testing.assert_close(b["final"], a["final"], rtol=0, atol=0)
    assert not torch.equal(straight[0]["saved"], straight[2]["saved"])  # the replicas differ
    # 4 replicas of 1 shard: replica r is saved replica r mod 2, states included
    wide = ok_values(run_distributed(_worker, 4, 1, "resume", path, timeout=120))
    for r, res in enumerate(wide):
        src = straight[(r % 2) * 2]
        torch.testing.assert_close(res["loaded"], src["saved"], rtol=0, atol=0)
        torch.testing.assert_close(res["loaded_optim"], src["saved_optim"], rtol=0, atol=0)
        assert res["extras"]["shards"] == 2 and res["step"] == 5


def _extras(path: Any, replica: int, step: int, replicas: int) -> None:
    import os

    where = os.path.join(path, f"replica-{replica}")
    os.makedirs(where, exist_ok=True)
    extras = {"step": step, "replicas": replicas, "shards": 1, "topology": "ring"}
    torch.save(dict(extras, scheduler=None), os.path.join(where, "extras.pt"))


def test_a_directory_saved_into_again_loads_only_the_latest_save(tmp_path: Any) -> None:
    """4 replicas saved at step 9, then 2 at step 5 into the same directory: replica-2 and
    replica-3 are the first save's. Every replica loads from the latest save's two."""
    import pytest

    from decent_dp.sharded.checkpoint import _saved_replica

    for r in range(4):
        _extras(tmp_path, r, 9, 4)
    for r in range(2):
        _extras(tmp_path, r, 5, 2)
    for replica in range(4):
        where, extras = _saved_replica(tmp_path, replica)
        assert where.endswith(f"replica-{replica % 2}") and extras["step"] == 5
    _extras(tmp_path, 1, 4, 2)  # replica-1 of yet another save (a save that failed half-way)
    with pytest.raises(ValueError, match=r"replica-1 holds step 4 of 2, replica-0 step 5 of 2"):
        _saved_replica(tmp_path, 0)
    with pytest.raises(ValueError, match=r"holds no sharded checkpoint"):
        _saved_replica(tmp_path / "nothing", 0)
