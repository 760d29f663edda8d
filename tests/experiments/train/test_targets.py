"""``_target_`` sections through the trainer: typed, checked before any group, trained exactly.

The exact test trains on two real gloo ranks twice: once with the built-in ``small_cnn``,
``digits``, ``sgd``, ``constant`` and ``ring``, once with the same classes and values named
by ``_target_`` (``tests/fixtures/target_conf``). Same data order, same initial model, same
updates: the two runs must end with the same parameters on every rank, and a run resumed
from a ``_target_`` run's checkpoint must end where the uninterrupted one does.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from omegaconf import open_dict

from decent_dp.mixing import period_contraction
from experiments.data import build_data, builtin_values
from experiments.schema import ConfigError
from experiments.train.checkpoint import list_checkpoints, load_shard
from experiments.train.run import run, validate
from experiments.train.targets import build_topology, resolve_targets
from tests.support.dist_harness import run_distributed
from tests.support.launch import ROOT, compose_config

EXAMPLE = ROOT / "examples" / "own_model" / "conf"
FIXTURE = ROOT / "tests" / "fixtures" / "target_conf"
QUICK = ["logger=none", "log.progress=false", "log.every=3", "log.consensus_every=3"]
BUILTIN = ["model=small_cnn", "dataset=digits", "optim=sgd", "scheduler=constant", "topology=ring"]
TARGETS = [
    "model=small_cnn_target",
    "dataset=digits_target",
    "optim=sgd_target",
    "scheduler=constant_target",
    "topology=ring_target",
]


@pytest.fixture
def example_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``examples/`` on ``sys.path``, as ``PYTHONPATH=examples`` puts it."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))


def _compose(conf: Path, *overrides: str):
    return compose_config(f"hydra.searchpath=[file://{conf}]", *QUICK, *overrides)


def test_the_example_composes_and_every_target_builds_without_a_process_group(
    example_on_path: None,
) -> None:
    cfg = resolve_targets(_compose(EXAMPLE, "experiment=own_model"))
    assert cfg.model.name == "own_model.models.TinyMLP" and dict(cfg.model.kwargs) == {"hidden": 64}
    assert cfg.dataset.partition == "iid" and cfg.dataset.kwargs.noise == 1.0
    assert cfg.scheduler.kwargs.T_max == cfg.train.max_steps  # the interpolation resolved
    assert cfg.topology.bucket_size_in_mb == 25.0 and dict(cfg.topology.kwargs)["hub"] == 0
    validate(cfg, 2)  # imports and builds the dataset, the model, the optimizer, the topology
    assert not dist.is_initialized()
    hub = build_topology(cfg.topology, 4)
    assert type(hub).__name__ == "Hub" and hub.period == 3 and hub.name == "own-hub"
    for w in hub.mixing_matrices():
        torch.testing.assert_close(w.sum(0), torch.ones(4, dtype=torch.float64))
        torch.testing.assert_close(w.sum(1), torch.ones(4, dtype=torch.float64))
    assert period_contraction(hub.mixing_matrices()) < 1  # a period mixes every worker


def test_builtin_names_and_targets_mix_in_one_sweep(example_on_path: None) -> None:
    # what -m model=small_cnn,tiny_mlp dataset=digits,stripes composes, job by job
    for model in ("small_cnn", "tiny_mlp"):
        for dataset in ("digits", "stripes"):
            cfg = _compose(EXAMPLE, f"model={model}", f"dataset={dataset}", "topology=ring")
            validate(cfg, 2)
    with pytest.raises(ConfigError) as info:
        validate(_compose(EXAMPLE, "experiment=own_model", "model.hidden=0"), 2)
    assert str(info.value) == (
        "model._target_=own_model.models.TinyMLP raised ValueError: hidden=0 is invalid; "
        "it must be >= 1"
    )


def test_a_builtin_vision_model_needs_images_from_a_target_dataset() -> None:
    cfg = compose_config(*QUICK)
    cfg.dataset = {"_target_": "tests.support.own_targets.Drawn"}
    with pytest.raises(ConfigError) as info:
        validate(cfg, 1)
    text = str(info.value)
    assert "model=small_cnn with dataset._target_=tests.support.own_targets.Drawn" in text
    assert "(inputs of shape (4,))" in text and "square (channels, side, side) images" in text


def _final_models(run_dir: Path, world_size: int) -> list[dict]:
    last = list_checkpoints(run_dir / "checkpoints")[-1]
    return [load_shard(last, r)["model"] for r in range(world_size)]


def _train_both(rank: int, world_size: int, root: str) -> dict:
    torch.set_num_threads(1)
    out = {}
    steps = ["train.max_steps=6", "checkpoint.every_steps=3", "train.batch_size=16"]
    for label, groups in (("builtin", BUILTIN), ("targets", TARGETS)):
        cfg = _compose(FIXTURE, *groups, *steps)
        out[label] = run(cfg, run_dir=Path(root) / label)
    # the _target_ run again, from its step-3 checkpoint
    again = Path(root) / "again"
    if rank == 0:
        shutil.copytree(Path(root) / "targets", again)
        shutil.rmtree(list_checkpoints(again / "checkpoints")[-1].path)
    dist.barrier()
    out["again"] = run(_compose(FIXTURE, *TARGETS, *steps), run_dir=again)
    return out


def test_targets_train_exactly_as_the_builtins_and_resume(tmp_path: Path) -> None:
    results = run_distributed(_train_both, 2, str(tmp_path), timeout=240, init=False)
    assert [status for status, _ in results] == ["ok", "ok"], results
    summaries = results[0][1]
    builtin, targets, again = summaries["builtin"], summaries["targets"], summaries["again"]
    assert targets["model"] == "experiments.models.vision.SmallCNN"
    assert targets["topology"] == "decent_dp.topo.RingTopology"
    assert again["resumed_from_step"] == 3 and again["train/steps"] == 6
    for key in ("train/loss", "eval/acc", "eval/acc_local", "consensus/distance"):
        assert targets[key] == builtin[key], key
    # evaluation batches differ in size (the sums' order), the predictions do not
    assert targets["eval/loss"] == pytest.approx(builtin["eval/loss"], rel=1e-6)
    reference = _final_models(tmp_path / "builtin", 2)
    for label in ("targets", "again"):
        for ours, theirs in zip(_final_models(tmp_path / label, 2), reference):
            assert ours.keys() == theirs.keys()
            for key in ours:
                torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0)


def test_a_language_model_of_ones_own_on_token_windows_of_ones_own(
    tmp_path: Path, world_of_one: None
) -> None:
    cfg = compose_config(
        *QUICK, "train.max_steps=4", "train.batch_size=8", "optim=adamw", "scheduler=constant"
    )
    with open_dict(cfg):
        cfg.dataset = {"_target_": "tests.support.own_targets.Tokens", "task": "language_model"}
        cfg.model = {"_target_": "tests.support.own_targets.TokenModel"}  # called as model(x)
    summary = run(cfg, run_dir=tmp_path / "run")
    assert summary["eval/acc"] is None and summary["tokens"] == 4 * 8 * 8
    assert summary["eval/ppl"] == pytest.approx(math.exp(summary["eval/loss"]))
    assert summary["eval/loss"] < math.log(16) + 1.0  # 16 ids


@pytest.mark.parametrize(
    "section",
    [
        {"name": "digits"},
        {"name": "synthetic", "num_samples": 64, "image_size": 6, "in_channels": 2},
    ],
)
def test_builtin_values_are_those_of_the_built_data(section: dict) -> None:
    data = build_data(
        section, rank=0, world_size=1, batch_size=8, seed=0, device=torch.device("cpu")
    )
    values = builtin_values(section)
    assert (values["num_classes"], values["in_channels"], values["image_size"]) == (
        data.num_classes,
        data.in_channels,
        data.image_size,
    )
    x, _ = next(iter(data.train))
    assert tuple(x.shape[1:]) == (data.in_channels, data.image_size, data.image_size)
