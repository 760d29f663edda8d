"""Checkpoints of sharded replicas (``train.shard_size > 1``) on real 4- and 2-rank gloo groups.

Each worker builds what the trainer builds (the ``("replicate", "shard")`` mesh, FSDP2
over its shard dimension, the framework's :class:`TrainStep` and :class:`Checkpointer`)
around a tiny float64 model, and trains on batches that are a pure function of its rank
and the step. A run saved at step 3 and resumed in fresh processes must end bit for bit
where the uninterrupted run ends, on every rank; a checkpoint resumes into another shard
or replica count with ``checkpoint.allow_reshard=true`` and is refused in one line
without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from experiments.train import checkpoint as ckpt
from experiments.train.checkpointer import Checkpointer
from experiments.train.metrics import Metrics, TrainWindow
from experiments.train.optim import build_optim_fn, build_scheduler_fn
from experiments.train.run import ConfigError, validate
from experiments.train.sharding import SHARDED_DIR, build_mesh, check_sharded_resume, shard_model
from experiments.train.step import TrainStep
from tests.experiments.train.conftest import small_model
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.launch import compose_config

TOTAL = 6
SAVE_AT = 3
BASE = (
    "optim=adamw",
    "scheduler=cosine_warmup",
    "topology=ring",
    "checkpoint.every_steps=3",
    "checkpoint.keep=2",
)


def _build(rank: int, world: int, shards: int, root: Path, cfg: Any) -> Checkpointer:
    mesh = build_mesh(shards, world, "cpu")
    # the shard ranks of a replica start alike (FSDP needs it); replicas differ
    model = shard_model(small_model(seed=rank // shards).double(), mesh)
    window = TrainWindow(torch.device("cpu"))
    step = TrainStep(
        model,
        cfg.train,
        cfg.topology,
        build_optim_fn(cfg.optim),
        build_scheduler_fn(cfg.scheduler, 4, TOTAL),
        window,
        rank=rank,
        world_size=world,
        device_mesh=mesh,
    )
    metrics = Metrics(
        cfg.log, torch.device("cpu"), rank=rank, world_size=world, batch_size=8, steps_per_epoch=4
    )
    metrics.window = window
    return Checkpointer(
        cfg.checkpoint,
        root,
        step,
        metrics,
        rank=rank,
        world_size=world,
        config_hash="0123456789abcdef",
    )


def _batch(rank: int, number: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + number)
    return torch.randn(8, 4, generator=gen, dtype=torch.float64), torch.randint(
        0, 3, (8,), generator=gen
    )


def _full(saver: Checkpointer) -> list[torch.Tensor]:
    return [p.full_tensor().detach().clone() for p in saver.train_step.module.parameters()]


def _worker(rank: int, world: int, plan: dict[str, Any]) -> dict[str, Any]:
    saver = _build(rank, world, plan["shards"], Path(plan["root"]), plan["cfg"])
    try:
        start = saver.resume() if plan.get("resume") else 0
        loaded = _full(saver)
        for number in range(start + 1, plan["last"] + 1):
            saver.train_step(*_batch(rank, number), number)
            if saver.due(number, last=number == TOTAL):
                saver.save(number)
        return {"start": start, "loaded": loaded, "params": _full(saver)}
    finally:
        saver.train_step.close()


def _composed(plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` with its config, composed here once instead of by every rank."""
    cfg = compose_config(*BASE, f"train.shard_size={plan['shards']}", *plan.get("overrides", ()))
    return {**plan, "cfg": cfg}


def _run(world: int, **plan: Any) -> list[dict[str, Any]]:
    results = run_distributed(_worker, world, _composed(plan), timeout=120)
    return ok_values(results)


def test_a_resumed_sharded_run_repeats_the_uninterrupted_one(tmp_path: Path) -> None:
    straight = _run(4, shards=2, root=str(tmp_path / "straight"), last=TOTAL)
    root = tmp_path / "cut"
    _run(4, shards=2, root=str(root), last=SAVE_AT)  # "killed" right after the save at 3
    info = ckpt.latest_checkpoint(root)
    assert info is not None and info.step == SAVE_AT
    assert info.meta["sharded"] == {"replicas": 2, "shards": 2, "dir": SHARDED_DIR}
    resumed = _run(4, shards=2, root=str(root), last=TOTAL, resume=True)
    for clean, again in zip(straight, resumed, strict=True):
        assert again["start"] == SAVE_AT
        for a, b in zip(clean["params"], again["params"], strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
    # the two replicas differ (gossip mixes, it does not average them away)
    assert not torch.equal(straight[0]["params"][0], straight[2]["params"][0])


def test_a_save_without_its_replicas_is_not_complete(tmp_path: Path) -> None:
    _run(4, shards=2, root=str(tmp_path), last=SAVE_AT)
    step_dir = ckpt.checkpoint_dir(tmp_path, SAVE_AT)
    (step_dir / SHARDED_DIR / "replica-1" / ".metadata").unlink()
    assert ckpt.latest_checkpoint(tmp_path) is None


def test_a_sharded_checkpoint_reshards_into_another_shard_count(tmp_path: Path) -> None:
    saved = _run(4, shards=2, root=str(tmp_path), last=SAVE_AT)
    refused = run_distributed(
        _worker, 4, _composed({"shards": 4, "root": str(tmp_path), "last": SAVE_AT, "resume": True})
    )
    message = refused[0][1].splitlines()[0]
    assert "was written by 2 replicas x 2 shards topology=ring; this run has 1 x 4" in message
    assert "checkpoint.allow_reshard=true" in message
    allowed = ["checkpoint.allow_reshard=true", "topology=complete"]
    plan = {"root": str(tmp_path), "last": SAVE_AT + 1, "resume": True, "overrides": allowed}
    resharded = _run(4, shards=4, **plan)
    # and on 2 ranks, one replica of 2 shards: another replica count
    fewer = _run(2, shards=2, **plan)
    for out in resharded + fewer:  # one replica: saved replica 0
        assert out["start"] == SAVE_AT
        for a, b in zip(saved[0]["params"], out["loaded"], strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
        assert not torch.equal(out["params"][0], out["loaded"][0])  # and it trains on


def test_checkpoints_of_sharded_replicas_pass_validation_and_what_cannot_is_one_line() -> None:
    base = ["logger=none", "train.shard_size=2", "checkpoint.every_steps=5"]
    validate(compose_config(*base, "topology=ring"), 4)
    with pytest.raises(ConfigError) as info:
        validate(compose_config(*base, "topology=allreduce"), 4)
    text = str(info.value)
    assert "checkpoint.every_steps=5 is invalid" in text and "topology=allreduce" in text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("saved", "here", "needle"),
    [
        (None, {"replicas": 2, "shards": 2}, "holds whole models per rank"),
        ({"replicas": 2, "shards": 2, "dir": "dcp"}, None, "holds sharded replicas"),
    ],
)
def test_one_format_into_the_other_is_refused_in_one_line(
    saved: dict[str, Any] | None, here: dict[str, Any] | None, needle: str
) -> None:
    with pytest.raises(ValueError) as info:
        check_sharded_resume(saved, here, Path("ckpt/step_000000003"), allow_reshard=True)
    assert needle in str(info.value) and "allowed:" in str(info.value)
    assert "\n" not in str(info.value)
