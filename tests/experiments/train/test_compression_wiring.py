"""The ``compression`` group: composing, validation, and ``comm/bytes_per_step`` (and
``comm/peak_bytes_per_step``) in real runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from decent_dp._engine.bucket import aligned_offsets
from experiments.train.config import compression_arg
from experiments.train.run import ConfigError, run, validate
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.launch import compose_config

QUICK = ["logger=none", "log.progress=false", "log.every=4", "log.consensus_every=0"]


@pytest.mark.parametrize(
    ("option", "arg"),
    [("none", None), ("bf16", "bf16"), ("int8", "int8"), ("randk", "randk:0.1")],
)
def test_every_compression_composes_to_a_wrapper_argument(option: str, arg: str | None) -> None:
    cfg = compose_config(f"compression={option}")
    assert cfg.compression.name == option
    assert compression_arg(cfg.compression) == arg


def test_default_is_none_and_randk_takes_its_ratio() -> None:
    assert compose_config().compression.name == "none"
    cfg = compose_config("compression=randk", "compression.ratio=0.25")
    assert compression_arg(cfg.compression) == "randk:0.25"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["compression=randk", "compression.ratio=0"], "compression.ratio=0"),
        (["compression=randk", "compression.ratio=1.5"], "compression.ratio=1.5"),
        (["compression=int8", "topology=allreduce"], "compression.name=int8"),
    ],
)
def test_validate_rejects_bad_compression_in_one_line(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match="is invalid") as info:
        validate(compose_config(*overrides), world_size=2)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_unknown_compression_fails_at_compose() -> None:
    with pytest.raises(Exception, match="compression"):
        compose_config("compression=int4")


def _runs(rank: int, world: int, root: str) -> dict[str, Any]:
    """Short real runs on 2 gloo ranks: ring with int8 gossip, and allreduce.

    Uncompressed gossip's bytes are tested in tests/decent_dp/test_compression.py.
    """
    out = {}
    diloco = ["topology=local-sgd", "topology.kwargs.period=4", "outer=diloco"]
    diloco += ["topology.bucket_size_in_mb=1e-6"]  # 1 byte: one bucket per parameter
    for name, extra in [
        ("int8", ["topology=ring", "compression=int8"]),
        ("allreduce", ["topology=allreduce"]),
        ("diloco", diloco),
        ("stream", [*diloco, "outer.fragments=2"]),
    ]:
        cfg = compose_config(*QUICK, "train.max_steps=8", *extra)
        summary = run(cfg, run_dir=Path(root) / name)
        out[name] = summary["comm/bytes_per_step"]
        out[f"{name}/peak"] = summary["comm/peak_bytes_per_step"]
    return out


def test_bytes_per_step_is_logged_and_follows_the_formula(tmp_path: Path) -> None:
    got = ok_values(run_distributed(_runs, 2, str(tmp_path), timeout=300))[0]
    from experiments.models import build_model

    model = build_model(compose_config().model, num_classes=10, in_channels=1, image_size=8)
    params = list(model.parameters())  # the digits default: 8x8 grey images, 10 classes
    numel = sum(p.numel() for p in params)
    padded = aligned_offsets(params, 4)[1]  # one bucket: the small CNN is far under 25 MB
    # ring pairs: one payload per exchange, whichever algorithm the backend uses
    assert got["int8"] == 4 * math.ceil(padded / 1024) + math.ceil(padded / 4) * 4
    assert got["int8"] / (4 * padded) < 0.26  # against the fp32 payload of exact gossip
    assert got["allreduce"] == 2 * (2 - 1) / 2 * 4 * numel  # torch DDP: ring all-reduce of grads
    # every step of ring and allreduce sends the same; DiLoCo all of it every 4th step, and
    # with two fragments half of it (about) every 2nd step: the same mean, a lower peak
    assert got["int8/peak"] == got["int8"] and got["allreduce/peak"] == got["allreduce"]
    assert got["diloco/peak"] == 4 * got["diloco"] == 2 * (2 - 1) / 2 * 4 * padded_per_param()
    assert got["stream"] == pytest.approx(got["diloco"], rel=1e-12)
    assert got["stream/peak"] < 0.75 * got["diloco/peak"]
    for name in ("int8", "allreduce", "diloco", "stream"):
        value, peak = got[name], got[f"{name}/peak"]
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["comm/bytes_per_step"] == value
        assert summary["comm/peak_bytes_per_step"] == peak
        assert summary["compression"] == ("int8" if name == "int8" else "none")
        assert summary["outer_fragments"] == (2 if name == "stream" else 1)
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        train = [json.loads(x) for x in lines if "train/loss" in x]
        assert train and all(line["comm/bytes_per_step"] == value for line in train)
        assert all(line["comm/peak_bytes_per_step"] == peak for line in train)


def padded_per_param() -> int:
    """Elements of the digits CNN as one float32 bucket per parameter, each 256-byte aligned."""
    from experiments.models import build_model

    model = build_model(compose_config().model, num_classes=10, in_channels=1, image_size=8)
    return sum(-(-p.numel() // 64) * 64 for p in model.parameters())


def _resume_runs(rank: int, world: int, root: str) -> dict[str, Any]:
    # a schedule that does not depend on max_steps, so the interrupted run is a prefix
    common = [*QUICK, "topology=ring", "compression=int8", "checkpoint.every_steps=3"]
    common += ["scheduler=step", "scheduler.step_size_epochs=0.5"]
    straight = run(compose_config(*common, "train.max_steps=12"), run_dir=Path(root) / "a")
    run(compose_config(*common, "train.max_steps=7"), run_dir=Path(root) / "b")
    resumed = run(compose_config(*common, "train.max_steps=12"), run_dir=Path(root) / "b")
    return {"straight": straight, "resumed": resumed}


@pytest.mark.slow
def test_resume_with_compression_through_checkpoints_is_exact(tmp_path: Path) -> None:
    got = ok_values(run_distributed(_resume_runs, 2, str(tmp_path), timeout=400))[0]
    straight, resumed = got["straight"], got["resumed"]
    assert resumed["resumed_from_step"] == 7 and resumed["train/steps"] == 12
    for key in ("eval/acc", "eval/acc_local", "eval/loss", "train/loss", "comm/bytes_per_step"):
        assert resumed[key] == straight[key], key
