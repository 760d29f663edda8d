"""The checkpointing policy on real files and a real one-process group: save, resume, reshard."""

from __future__ import annotations

import copy
import json

import torch

from experiments.train import checkpoint as ckpt
from experiments.train.checkpointer import Checkpointer, load_rng_state, rng_state
from experiments.train.metrics import Metrics
from tests.experiments.train.conftest import batches, small_model
from tests.support.launch import compose_config

# the format: a checkpoint of an older version resumes as long as these stay
SHARD_KEYS = ["model", "training", "rng", "step", "epoch", "batch", "time_s", "window", "history"]
META_KEYS = {"step", "world_size", "topology", "config_hash"}


def _checkpointer(train_step, root, *overrides: str) -> Checkpointer:
    cfg = compose_config("checkpoint.every_steps=3", *overrides)
    metrics = Metrics(
        cfg.log, torch.device("cpu"), rank=0, world_size=1, batch_size=16, steps_per_epoch=5
    )
    metrics.window = train_step.window  # as the trainer shares it
    return Checkpointer(
        cfg.checkpoint,
        root,
        train_step,
        metrics,
        rank=0,
        world_size=1,
        config_hash="0123456789abcdef",
    )


def _train(train_step, first: int, last: int) -> None:
    for number in range(first, last + 1):
        train_step(*batches(1, seed=number)[0], number)


def test_saves_every_n_steps_and_at_the_end(make_step, tmp_path) -> None:
    saver = _checkpointer(make_step("topology=ring"), tmp_path)
    assert [s for s in range(1, 10) if saver.due(s, last=False)] == [3, 6, 9]
    assert saver.due(7, last=True)
    off = _checkpointer(make_step("topology=ring"), tmp_path, "checkpoint.every_steps=0")
    assert not any(off.due(s, last=s == 9) for s in range(1, 10))


def test_resume_continues_bit_for_bit(make_step, tmp_path) -> None:
    a = make_step("topology=ring", "optim=adamw")
    saver = _checkpointer(a, tmp_path)
    assert saver.resume() == 0 and saver.resumed_from is None  # nothing to resume yet
    _train(a, 1, 7)
    saver.metrics.history.skipped = 1
    saver.save(7)
    info = ckpt.latest_checkpoint(tmp_path)
    assert info is not None and info.step == 7
    index = json.loads((info.path / "index.json").read_text())
    assert set(index["meta"]) == META_KEYS and index["meta"]["topology"] == "ring"
    shard = ckpt.load_shard(info, 0)
    assert list(shard) == SHARD_KEYS and (shard["epoch"], shard["batch"]) == (1, 2)

    b = make_step("topology=ring", "optim=adamw", model=small_model(seed=3))
    resumer = _checkpointer(b, tmp_path)
    assert resumer.resume() == 7 and resumer.resumed_from == 7
    assert resumer.metrics.history.skipped == 1
    assert resumer.metrics.window.state() == saver.metrics.window.state()
    draws = torch.rand(3)  # the generators continue where the checkpoint left them
    load_rng_state(shard["rng"], torch.device("cpu"))
    assert torch.equal(draws, torch.rand(3))
    _train(a, 8, 9)
    _train(b, 8, 9)
    for pa, pb in zip(a.module.parameters(), b.module.parameters()):
        assert torch.equal(pa, pb)


def test_another_topology_restarts_from_the_average_and_retires_the_old_layout(
    make_step, tmp_path
) -> None:
    ring = make_step("topology=ring")
    _train(ring, 1, 3)
    _checkpointer(ring, tmp_path).save(3)
    weights = copy.deepcopy(ring.module.state_dict())

    complete = make_step("topology=complete", model=small_model(seed=3))
    resumer = _checkpointer(complete, tmp_path, "checkpoint.allow_reshard=true")
    assert resumer.resume() == 0 and resumer.resumed_from == 3
    for key, value in complete.module.state_dict().items():
        torch.testing.assert_close(value, weights[key])  # the average of one worker
    assert [info.step for info in ckpt.list_checkpoints(tmp_path)] == [0]
    assert (tmp_path / "before_reshard_step3_ws1" / "step_000000003").is_dir()


def test_rng_state_round_trip() -> None:
    state = rng_state(torch.device("cpu"))
    first = torch.rand(4)
    load_rng_state(state, torch.device("cpu"))
    assert torch.equal(first, torch.rand(4))
