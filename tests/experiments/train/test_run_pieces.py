"""The pieces of experiments/train/run.py and its logger, without a training run.

``validate`` and its one-line refusals, ``config_hash``, SLURM's variables, run names
and the metrics sinks. The runs themselves (in-process and under torchrun) are in
``test_run.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.train.config import state_sync_arg
from experiments.train.logger import MetricsLogger, json_safe, run_name_from_overrides
from experiments.train.run import (
    ConfigError,
    _first_host,
    config_hash,
    slurm_env,
    validate,
)
from tests.support.launch import compose_config

QUICK = ["logger=none", "log.progress=false", "log.every=4", "log.consensus_every=4"]


def _cfg(*overrides: str):
    return compose_config(*QUICK, *overrides)


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# a single bad value: the message names it as it was given
@pytest.mark.parametrize(
    "override",
    [
        *("train.batch_size=0", "train.max_steps=0", "train.label_smoothing=1.0", "log.every=0"),
        *("log.consensus_sketch=-1", "checkpoint.keep=0", "dist.timeout_s=0", "dist.backend=mpi"),
        "checkpoint.signal_check_every=0",
    ],
)
def test_validate_names_the_bad_value(override, monkeypatch):
    _assert_rejected([override], 1, override, monkeypatch)


@pytest.mark.parametrize(
    ("overrides", "world_size", "needle"),
    [
        (["optim.lr=-0.1"], 1, "optim=sgd"),
        (["optim=accum_adam", "optim.accum_iter=0"], 1, "accum_iter"),
        (["scheduler=step", "scheduler.gamma=0"], 1, "scheduler.gamma"),
        (["topology=one-peer-exp"], 3, "power-of-two"),
        (["topology=alternating-exp-ring"], 4, "nodes"),
        (["topology=random-matching", "+topology.kwargs.colour=1"], 2, "colour"),
        (["network=custom", "network.bandwidth_gbps=0"], 2, "bandwidth"),
        (["network=custom", "network.procs_per_host=3"], 4, "network.procs_per_host=3"),
        (["network=custom", "network.procs_per_host=0"], 4, "dividing the world size 4"),
        (["dataset.partition=dirichlet", "dataset.alpha=0"], 2, "dataset.alpha"),
        (
            ["topology=allreduce", "optim.state_sync.momentum_buffer=1"],
            2,
            "with topology=allreduce",
        ),
        (["topology=ring", "optim.state_sync.momentum_buffer=-1"], 2, "the period must be an int"),
        (
            ["topology=local-sgd", "outer=diloco", "optim.state_sync.momentum_buffer=2"],
            2,
            "empty with an outer optimizer",
        ),
    ],
)
def test_validate_rejects_with_one_line(overrides, world_size, needle, monkeypatch):
    _assert_rejected(overrides, world_size, needle, monkeypatch)


def _assert_rejected(overrides, world_size, needle, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError) as info:
        validate(_cfg(*overrides), world_size)
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_state_sync_names_the_periods_set() -> None:
    cfg = _cfg("topology=ring", "optim.state_sync.momentum_buffer=4")
    assert state_sync_arg(cfg.optim.state_sync) == {"momentum_buffer": 4}
    assert state_sync_arg(_cfg().optim.state_sync) == {}
    validate(cfg, 2)


@pytest.mark.parametrize(
    "topology", ["complete", "ring", "one-peer-exp", "random-matching", "allreduce"]
)
def test_validate_accepts_defaults(topology, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for world_size in (1, 2, 4, 8):
        validate(_cfg(f"topology={topology}"), world_size)


def test_config_hash_sees_values_not_hydra():
    a, b = _cfg(), _cfg("train.seed=1")
    assert config_hash(a) == config_hash(_cfg()) != config_hash(b)
    assert len(config_hash(a)) == 16


def test_slurm_env():
    assert slurm_env({"WORLD_SIZE": "4", "SLURM_PROCID": "1"}) == {}
    assert slurm_env({"PATH": "/bin"}) == {}
    env = {
        "SLURM_PROCID": "9",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS_PER_NODE": "8(x2)",
        "SLURM_JOB_NODELIST": "gpu[007-008]",
        "SLURM_JOB_ID": "12345",
    }
    assert slurm_env(env) == {
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "gpu007",
        "MASTER_PORT": str(20000 + 12345 % 20000),
    }


def test_slurm_env_in_a_submitit_job_is_submitits(monkeypatch) -> None:
    from submitit.helpers import TorchDistributedEnvironment

    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    job = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu[3-4]",
        "SLURM_JOB_ID": "4242",
    }
    for key, value in job.items():
        monkeypatch.setenv(key, value)
    env = slurm_env()
    ours = {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    assert ours == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert env["MASTER_ADDR"] == "gpu3"
    assert env["MASTER_PORT"] == str(TorchDistributedEnvironment().master_port)  # its draw
    # a given environment is read as SLURM's (submitit reads only os.environ)
    assert slurm_env(job)["MASTER_PORT"] == str(20000 + 4242)


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("node1", "node1"), ("a,b", "a"), ("gpu[003-010,012],cpu1", "gpu003"), ("n[5,7]-ib", "n5-ib")],
)
def test_first_host(nodelist, first):
    assert _first_host(nodelist) == first


def test_run_name_and_json_safe():
    assert (
        run_name_from_overrides(["topology=ring", "hydra.run.dir=x", "train.seed=1"])
        == "topology=ring,train.seed=1"
    )
    assert run_name_from_overrides([]) == "default"
    assert json_safe({"a": float("nan"), "b": [1.0, float("inf")], "c": torch.tensor(2.5)}) == {
        "a": None,
        "b": [1.0, None],
        "c": 2.5,
    }


def test_metrics_logger_writes_jsonl(tmp_path):
    with MetricsLogger(tmp_path / "run") as logger:
        logger.log({"step": 1, "epoch": 0.1, "time_s": 0.5, "train/loss": float("nan")})
        logger.log({"step": 2, "epoch": 0.2, "time_s": 1.0, "train/loss": 0.25})
    lines = _lines(tmp_path / "run")
    assert lines == [
        {"step": 1, "epoch": 0.1, "time_s": 0.5, "train/loss": None},
        {"step": 2, "epoch": 0.2, "time_s": 1.0, "train/loss": 0.25},
    ]
    MetricsLogger(tmp_path / "other", enabled=False).log({"step": 1})
    assert not (tmp_path / "other").exists()


def test_metrics_logger_wandb_offline_in_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb_cfg = {"name": "wandb", "mode": "offline", "project": "p", "tags": ["t"]}
    logger = MetricsLogger(
        tmp_path, wandb_cfg=wandb_cfg, config={"a": 1}, run_name="topology=ring", group="sweep_1"
    )
    try:
        run_obj = logger._run
        assert run_obj.group == "sweep_1" and run_obj.name == "topology=ring"
        assert run_obj.project == "p" and tuple(run_obj.tags) == ("t",)
        assert Path(logger.wandb_dir).is_relative_to(tmp_path / "wandb")
        logger.log({"step": 1, "train/loss": 0.5, "data/class_histogram": [[1, 2]]})
    finally:
        logger.close()
    assert _lines(tmp_path)[0]["train/loss"] == 0.5
