"""``train.shard_size``: its one-line config errors, and a 2 x 2 torchrun of a tiny GPT.

The torchrun run shards each replica's GPT over 2 ranks with FSDP2 and gossips
between the 2 replicas (``ring``), and the same with ``topology=allreduce``
(torch's HSDP): both must train (the evaluation loss falls) and report the
wrapper's bytes per shard rank.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.train.run import ConfigError, validate
from tests.experiments.train.lm_corpus import lm_overrides, write_corpus
from tests.support.launch import compose_config, torchrun

QUICK = ["logger=none", "log.progress=false", "log.every=2", "log.consensus_every=0"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            ["train.shard_size=3"],
            "train.shard_size=3 is invalid; it must be an integer >= 1 dividing the world size 4",
        ),
        (["train.shard_size=0"], "train.shard_size=0 is invalid"),
        (
            ["train.shard_size=2", "train.nan_policy=skip"],
            "train.nan_policy=skip is invalid; it must be error with train.shard_size > 1",
        ),
        (
            ["train.shard_size=2", "checkpoint.every_steps=5", "topology=allreduce"],
            "checkpoint.every_steps=5 is invalid; it must be 0 with train.shard_size > 1 "
            "and topology=allreduce",
        ),
        (
            ["train.shard_size=2", "topology=one-peer-exp", "+topology.kwargs.bogus=1"],
            "topology=one-peer-exp with world size 2",
        ),
    ],
)
def test_bad_shard_size_fails_in_one_line(
    corpus: Path, overrides: list[str], needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cfg = compose_config(*QUICK, *lm_overrides(corpus), *overrides)
    with pytest.raises(ConfigError) as info:
        validate(cfg, 4)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_shard_size_dividing_the_world_passes(
    corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    validate(compose_config(*QUICK, *lm_overrides(corpus), "train.shard_size=2"), 4)


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["ring", "allreduce"])
def test_two_replicas_of_two_shards_train_a_gpt_under_torchrun(
    corpus: Path, tmp_path: Path, topology: str
) -> None:
    run_dir = tmp_path / "run"
    proc = torchrun(
        4,
        *QUICK,
        *lm_overrides(corpus),
        "model.n_layer=2",
        f"topology={topology}",
        "train.shard_size=2",
        "train.max_steps=8",
        "train.grad_clip_norm=1.0",
        # HSDP's replicas are not saved, so no stop can save them
        f"checkpoint.on_signal={topology != 'allreduce'}".lower(),
        f"hydra.run.dir={run_dir}",
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "eval/loss" in line
    ]
    assert summary["world_size"] == 4 and summary["train/steps"] == 8
    assert math.isfinite(summary["eval/loss"]) and evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    if topology == "ring":
        assert summary["comm/bytes_per_step"] > 0  # one shard's gossip per rank
