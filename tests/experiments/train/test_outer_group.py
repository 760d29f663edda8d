"""The ``outer`` config group: composing, its one-line errors, and a real torchrun DiLoCo job."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments.schema import ConfigError
from experiments.train.outer import outer_every, outer_kwargs
from experiments.train.run import validate
from tests.support.launch import QUIET, compose_config
from tests.support.train_jobs import read_metrics, read_summary, train_job


def test_diloco_on_local_sgd_takes_the_topology_period() -> None:
    cfg = compose_config("outer=diloco", "topology=local-sgd", "topology.kwargs.period=4")
    kwargs = outer_kwargs(cfg.outer, cfg.topology)
    assert kwargs["outer_every"] == 4
    opt = kwargs["outer_optim_fn"]([torch.zeros(3)])
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.SGD)
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.7, 0.9, True)


def test_fragments_and_compression_reach_the_wrapper() -> None:
    cfg = compose_config("outer=diloco", "topology=local-sgd", "topology.kwargs.period=8")
    assert outer_kwargs(cfg.outer, cfg.topology)["outer_fragments"] == 1
    cfg = compose_config(
        "outer=diloco", "topology=local-sgd", "topology.kwargs.period=8", "outer.fragments=4"
    )
    assert outer_kwargs(cfg.outer, cfg.topology)["outer_fragments"] == 4
    cfg = compose_config("outer=slowmo", "outer.compression=int8")
    kwargs = outer_kwargs(cfg.outer, cfg.topology)
    assert (kwargs["outer_compression"], kwargs["outer_fragments"]) == ("int8", 1)
    assert kwargs["outer_scale_by_inner_lr"] is False
    cfg = compose_config("outer=slowmo", "outer.scale_by_inner_lr=true")
    assert outer_kwargs(cfg.outer, cfg.topology)["outer_scale_by_inner_lr"] is True


def test_slowmo_and_none() -> None:
    cfg = compose_config("outer=slowmo", "topology=one-peer-exp")
    kwargs = outer_kwargs(cfg.outer, cfg.topology)
    group = kwargs["outer_optim_fn"]([torch.zeros(3)]).param_groups[0]
    assert kwargs["outer_every"] == 8
    assert (group["lr"], group["momentum"], group["nesterov"]) == (1.0, 0.5, False)
    default = compose_config()
    assert default.outer.name == "none" and outer_kwargs(default.outer, default.topology) == {}
    assert outer_every(None, default.topology) is None  # a config from before the group


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["outer=diloco", "topology=ring"], "outer.every=None is invalid"),
        (["outer=diloco", "topology=allreduce"], "outer.name=diloco is invalid"),
        (["outer=slowmo", "outer.every=0"], "outer.every=0 is invalid"),
        (["outer=slowmo", "outer.momentum=1.0"], "outer.momentum=1.0 is invalid"),
        (["outer=diloco", "topology=local-sgd", "outer.momentum=0"], "outer.nesterov=True"),
        (["outer=slowmo", "outer.lr=-1"], "outer.lr=-1"),
        (["outer=slowmo", "outer.fragments=3"], "outer.fragments=3 is invalid"),
        (["outer=slowmo", "outer.fragments=0"], "outer.fragments=0 is invalid"),
        (["outer.fragments=2"], "outer.fragments=2 is invalid; it must be 1 with outer=none"),
        (["outer=slowmo", "outer.compression=fp4"], "outer.compression=fp4 is invalid"),
        (["outer.compression=int8"], "outer.compression=int8 is invalid; it must be none with"),
        (["outer.scale_by_inner_lr=true"], "outer.scale_by_inner_lr=True is invalid; it must be"),
    ],
)
def test_bad_values_fail_validation_in_one_line(overrides: list[str], expected: str) -> None:
    cfg = compose_config(*overrides)
    with pytest.raises(ConfigError) as info:
        validate(cfg, 4)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_unknown_key_fails_at_compose_time() -> None:
    with pytest.raises(Exception, match="lrr"):
        compose_config("outer=diloco", "outer.lrr=0.1")


def test_resume_mid_period_in_process(tmp_path: Path, world_of_one: None) -> None:
    """A DiLoCo job stopped at step 6 (outer steps at 4, 8, ...) resumes bit for bit."""
    from experiments.train.checkpoint import latest_checkpoint, load_shard
    from experiments.train.run import run

    common = [
        *QUIET,
        "outer=diloco",
        "topology=local-sgd",
        "topology.kwargs.period=4",
        "train.batch_size=128",
        "scheduler=step",  # a schedule that does not depend on train.max_steps
        "scheduler.step_size_epochs=0.5",
        "log.every=2",  # train/loss is the mean since the last line: one ends at step 6
        "checkpoint.every_steps=3",
    ]
    # resumed at 6, between the outer rounds of steps 4 and 8
    straight = run(compose_config(*common, "train.max_steps=8"), run_dir=tmp_path / "a")
    run(compose_config(*common, "train.max_steps=6"), run_dir=tmp_path / "b")
    resumed = run(compose_config(*common, "train.max_steps=8"), run_dir=tmp_path / "b")
    assert resumed["resumed_from_step"] == 6 and resumed["outer"] == "diloco"
    for key in ("eval/acc", "eval/loss", "train/loss"):
        assert resumed[key] == straight[key], key
    shards = [load_shard(latest_checkpoint(tmp_path / d / "checkpoints"), 0) for d in "ab"]
    for key, value in shards[0]["model"].items():
        assert torch.equal(value, shards[1]["model"][key]), key


@pytest.mark.slow
def test_diloco_under_torchrun(tmp_path: Path) -> None:
    train_job(
        2,
        tmp_path,
        *QUIET,
        "outer=diloco",
        "topology=local-sgd",
        "topology.kwargs.period=4",
        "train.max_steps=16",
        "log.every=4",
        "log.consensus_every=0",
    )
    summary = read_summary(tmp_path)
    assert summary["outer"] == "diloco" and summary["outer_every"] == 4
    assert summary["eval/acc"] > 0.3  # 16 steps of digits learn something
    lines = read_metrics(tmp_path)
    norms = [line["outer/delta_norm"] for line in lines if "outer/delta_norm" in line]
    assert len(norms) == 4 and all(n > 0 for n in norms)
