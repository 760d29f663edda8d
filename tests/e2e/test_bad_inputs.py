"""Every bad input fails fast, with one line that names the bad value and what is allowed.

Each case of :data:`CASES` runs the real code path it guards: Hydra ``compose``
for names and typed values, ``run(cfg)`` in this process (world size 1) for
values checked by the loop, the data and the checkpoints, real gloo ranks
(:func:`dist_harness.run_distributed`) when ranks must disagree, and one
``torchrun`` of three workers for the world-size rules. A case passes when the
expected exception (or a non-zero exit) comes within its time limit and the
message is one line holding both the bad value and what is allowed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn

from decent_dp.ddp import DecentralizedDataParallel
from decent_dp.optim import optim_fn_sgd
from decent_dp.topo import Edge, Topology, TopologyReg
from experiments.train.checkpoint import latest_checkpoint, list_checkpoints
from experiments.train.config import compose_error_line
from experiments.train.run import run
from tests.support.dist_harness import run_distributed
from tests.support.launch import QUIET, compose_config, launch, torchrun

QUICK = [*QUIET, "log.every=2", "log.consensus_every=0"]
# a dead or missing peer would surface as an error after this many seconds instead of a hang
FAST_TIMEOUT = ["dist.timeout_s=30"]


@dataclass(frozen=True)
class Outcome:
    """What a bad input produced: the error's type name (``exit N`` for a process) and text."""

    error: str
    message: str
    seconds: float


@dataclass(frozen=True)
class Case:
    """One bad input.

    Attributes:
        attempt: Runs the input; gets the test's ``tmp_path`` and pytest ``request``.
        error: Expected exception type name, or ``"exit"`` for a non-zero exit status.
        value: Substrings that name the bad value.
        allowed: Substrings that say what is allowed (or what to do instead).
        limit_s: The outcome must arrive within this many seconds.
    """

    attempt: Callable[[Path, pytest.FixtureRequest], Outcome]
    error: str
    value: tuple[str, ...]
    allowed: tuple[str, ...]
    limit_s: float = 60.0


# ----------------------------------------------------------------- running one attempt


def _compose(*overrides: str) -> DictConfig:
    return compose_config(*QUICK, *FAST_TIMEOUT, *overrides)


def _timed(fn: Callable[[], Any]) -> Outcome:
    """Call ``fn``, which must raise; return the exception's type name and message."""
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # the outcome under test
        return Outcome(type(exc).__name__, str(exc), time.monotonic() - start)
    raise AssertionError("the bad input was accepted")


def _run_in_process(tmp_path: Path, *overrides: str) -> Outcome:
    cfg = _compose(*overrides)
    return _timed(lambda: run(cfg, run_dir=tmp_path / "run"))


def _compose_error(*overrides: str) -> Callable[[Path, pytest.FixtureRequest], Outcome]:
    def attempt(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
        start = time.monotonic()
        try:
            _compose(*overrides)
        except Exception as exc:
            # train.py prints exactly this line for a composition error
            return Outcome(type(exc).__name__, compose_error_line(exc), time.monotonic() - start)
        raise AssertionError(f"{overrides} composed without an error")

    return attempt


def _run_error(*overrides: str) -> Callable[[Path, pytest.FixtureRequest], Outcome]:
    def attempt(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
        request.getfixturevalue("world_of_one")
        return _run_in_process(tmp_path, *overrides)

    return attempt


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("train.py: error")]


# ----------------------------------------------------------------- custom topologies


class _RankTwice(Topology):
    def _get_topo_edges(self) -> list[list[Edge]]:
        return [[Edge([0, 1], 0.5), Edge([1, 2], 0.5), Edge([3], 1.0)]]


class _RankMissing(Topology):
    def _get_topo_edges(self) -> list[list[Edge]]:
        return [[Edge([0, 1], 0.5), Edge([2], 1.0)]]


class _WeightAboveOne(Topology):
    def _get_topo_edges(self) -> list[list[Edge]]:
        return [[Edge([0, 1], 1.5), Edge([2, 3], 0.5)]]


def _custom_topology(klass: type[Topology]) -> Callable[[Path, pytest.FixtureRequest], Outcome]:
    def attempt(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
        return _timed(lambda: TopologyReg.create(klass, world_size=4, local_world_size=4))

    return attempt


# ----------------------------------------------------------------- data


def _missing_dataset_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
    request.getfixturevalue("world_of_one")
    return _run_in_process(tmp_path, "dataset=imagenet", f"dataset.root={tmp_path / 'absent'}")


def _empty_dataset_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
    request.getfixturevalue("world_of_one")
    (tmp_path / "cifar").mkdir()
    return _run_in_process(tmp_path, "dataset=cifar10", f"dataset.root={tmp_path / 'cifar'}")


def _empty_image_folders(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
    request.getfixturevalue("world_of_one")
    for split in ("train", "val"):
        (tmp_path / "imagenet" / split).mkdir(parents=True)
    return _run_in_process(
        tmp_path, "dataset=imagenet", f"dataset.root={tmp_path / 'imagenet'}", "train.batch_size=2"
    )


# ----------------------------------------------------------------- _target_ sections

TARGET_CONF = Path(__file__).resolve().parents[1] / "fixtures" / "target_conf"


def _target_error(*overrides: str) -> Callable[[Path, pytest.FixtureRequest], Outcome]:
    """``run(cfg)`` of a config with ``_target_`` sections; no process group may come up."""

    def attempt(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
        request.getfixturevalue("world_of_one")
        outcome = _run_in_process(tmp_path, f"hydra.searchpath=[file://{TARGET_CONF}]", *overrides)
        assert not dist.is_initialized()  # it stopped before the rendezvous
        return outcome

    return attempt


# ----------------------------------------------------------------- checkpoints and numerics

CKPT = ["topology=ring", "train.max_steps=2", "checkpoint.every_steps=2"]


def _corrupt_checkpoint(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
    request.getfixturevalue("world_of_one")
    run(_compose(*CKPT), run_dir=tmp_path / "run")
    info = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert info is not None
    shard = info.path / "rank_00000.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))
    return _run_in_process(tmp_path, *CKPT[:1], "train.max_steps=4", "checkpoint.every_steps=2")


def _train_on_rank(rank: int, world_size: int, overrides: list[str], run_dir: str) -> dict:
    torch.set_num_threads(1)
    return run(_compose(*overrides), run_dir=run_dir)


def _other_world_size(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
    results = run_distributed(
        _train_on_rank, 2, CKPT, str(tmp_path / "run"), timeout=120, init=False
    )
    assert [status for status, _ in results] == ["ok", "ok"], results
    request.getfixturevalue("world_of_one")
    return _run_in_process(tmp_path, *CKPT)


def _nan_loss(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
    request.getfixturevalue("world_of_one")
    outcome = _run_in_process(
        tmp_path,
        "scheduler=constant",
        "optim.lr=1e12",
        "optim.momentum=0",
        "train.max_steps=40",
        "checkpoint.every_steps=1",
    )
    # the last checkpoint before the failing step is complete and was kept
    step = int(outcome.message.split("at step ")[1].split()[0])
    saved = [info.step for info in list_checkpoints(tmp_path / "run" / "checkpoints")]
    assert saved and saved[-1] == step - 1, (saved, step)
    return outcome


# ----------------------------------------------------------------- several ranks


def _build_and_wrap(rank: int, world_size: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 2 + rank))  # rank 1 builds another output size
    DecentralizedDataParallel(model, optim_fn_sgd, topology="complete")


def _shape_mismatch(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
    start = time.monotonic()
    results = run_distributed(_build_and_wrap, 2, timeout=60)
    seconds = time.monotonic() - start
    assert [status for status, _ in results] == ["error", "error"], results  # no rank hangs
    first_lines = [str(value).splitlines()[0] for _, value in results]
    assert first_lines[0] == first_lines[1]  # every rank stops with the same message
    name, _, message = first_lines[0].partition(": ")
    return Outcome(name, message, seconds)


def _config_mismatch(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
    start = time.monotonic()
    results = run_distributed(_seed_is_rank, 2, str(tmp_path / "run"), timeout=60, init=False)
    seconds = time.monotonic() - start
    assert [status for status, _ in results] == ["error", "error"], results
    first_lines = [str(value).splitlines()[0] for _, value in results]
    assert first_lines[0] == first_lines[1]
    name, _, message = first_lines[0].partition(": ")
    return Outcome(name, message, seconds)


def _seed_is_rank(rank: int, world_size: int, run_dir: str) -> dict:
    torch.set_num_threads(1)
    return run(_compose("topology=ring", f"train.seed={rank}"), run_dir=run_dir)


@pytest.fixture(scope="module")
def three_ranks_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, float]:
    """One torchrun of 3 workers on one node, sweeping two topologies that cannot run there."""
    sweep = tmp_path_factory.mktemp("ws3")
    start = time.monotonic()
    proc = torchrun(
        3,
        "-m",
        "topology=one-peer-exp,alternating-exp-ring",
        *QUICK,
        *FAST_TIMEOUT,
        "train.max_steps=2",
        f"hydra.sweep.dir={sweep}",
        timeout=180,
    )
    return proc, time.monotonic() - start


def _torchrun_job(topology: str) -> Callable[[Path, pytest.FixtureRequest], Outcome]:
    def attempt(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
        proc, seconds = request.getfixturevalue("three_ranks_sweep")
        assert proc.returncode == 1, proc.stderr[-3000:]
        lines = _error_lines(proc.stderr)
        # every rank rejects both jobs before communicating; rank 0 alone reports them
        assert len(lines) == 2 and all("on rank 0" in line for line in lines), lines
        mine = [line for line in lines if f"topology={topology} " in line]
        assert len(mine) == 1, lines
        return Outcome(f"exit {proc.returncode}", mine[0], seconds)

    return attempt


def _cli_unknown_topology(tmp_path: Path, request: pytest.FixtureRequest) -> Outcome:
    start = time.monotonic()
    proc = launch([sys.executable, "train.py", "topology=hypercube", f"hydra.run.dir={tmp_path}"])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr  # nothing but the one line
    return Outcome(f"exit {proc.returncode}", lines[0], time.monotonic() - start)


# ----------------------------------------------------------------- the table

CASES: dict[str, Case] = {
    "unknown-topology": Case(
        _compose_error("topology=hypercube"),
        "MissingConfigException",
        ("topology/hypercube",),
        ("one-peer-exp", "ring", "allreduce"),
    ),
    "unknown-optimizer": Case(
        _compose_error("optim=lamb"), "MissingConfigException", ("optim/lamb",), ("adamw", "sgd")
    ),
    "unknown-scheduler": Case(
        _compose_error("scheduler=cyclic"),
        "MissingConfigException",
        ("scheduler/cyclic",),
        ("cosine_warmup", "constant", "step"),
    ),
    "unknown-dataset": Case(
        _compose_error("dataset=mnist"),
        "MissingConfigException",
        ("dataset/mnist",),
        ("digits", "cifar10", "imagenet"),
    ),
    "unknown-topology-cli": Case(
        _cli_unknown_topology, "exit", ("topology/hypercube",), ("one-peer-exp", "ring")
    ),
    "amp-fp8": Case(
        _compose_error("train.amp=fp8"),
        "ConfigCompositionException",
        ("train.amp=fp8",),
        ("bf16, fp16, off",),
    ),
    "nan-policy-ignore": Case(
        _compose_error("train.nan_policy=ignore"),
        "ConfigCompositionException",
        ("train.nan_policy=ignore",),
        ("error, skip",),
    ),
    "world-size-3-one-peer-exp": Case(
        _torchrun_job("one-peer-exp"),
        "exit",
        ("one-peer-exp", "world size 3", "n=3"),
        ("power-of-two", "ring"),
        limit_s=180,
    ),
    "one-node-alternating-exp-ring": Case(
        _torchrun_job("alternating-exp-ring"),
        "exit",
        ("alternating-exp-ring", "1 node"),
        ("at least 2 nodes", "local_world_size"),
        limit_s=180,
    ),
    "custom-topology-rank-twice": Case(
        _custom_topology(_RankTwice), "ValueError", ("rank 1",), ("exactly one edge",)
    ),
    "custom-topology-rank-missing": Case(
        _custom_topology(_RankMissing), "ValueError", ("rank 3 is in no edge",), ("every rank",)
    ),
    "custom-topology-weight-1.5": Case(
        _custom_topology(_WeightAboveOne), "ValueError", ("weight 1.5",), ("[0, 1]",)
    ),
    "dataset-dir-missing": Case(
        _missing_dataset_dir,
        "FileNotFoundError",
        ("absent/train", "not found"),
        ("root/train/<class>/*.JPEG",),
    ),
    "dataset-dir-empty": Case(
        _empty_dataset_dir,
        "FileNotFoundError",
        ("cifar/cifar-10-batches-py", "not found"),
        ("dataset.download=true",),
    ),
    "dataset-image-folders-empty": Case(
        _empty_image_folders,
        "ValueError",
        ("no images found", "imagenet/train"),
        ("root/train/<class>/*.JPEG",),
    ),
    "target-does-not-import": Case(
        _target_error("model=small_cnn_target", "model._target_=experiments.models.vision.CNN"),
        "ConfigError",
        ("model._target_=experiments.models.vision.CNN", "has no attribute 'CNN'"),
        ("importable module",),
    ),
    "target-unknown-key": Case(
        _target_error("model=small_cnn_target", "+model.norme=batch"),
        "ConfigError",
        ("model.norme=batch",),
        ("it must be one of num_classes, in_channels, norm",),
    ),
    "target-constructor-raises": Case(
        _target_error("model=small_cnn_target", "+model.norm=layer"),
        "ConfigError",
        ("model._target_=experiments.models.vision.SmallCNN raised", "model.norm=layer"),
        ("one of group, batch",),
    ),
    "target-dataset-not-pairs": Case(
        _target_error(
            "dataset=digits_target", "dataset._target_=tests.support.own_targets.Unpaired"
        ),
        "ConfigError",
        ("dataset._target_=tests.support.own_targets.Unpaired", "is of type Tensor"),
        ("map-style torch.utils.data.Dataset", "(input, target) pairs"),
    ),
    "batch-size-0": Case(
        _run_error("train.batch_size=0"), "ConfigError", ("train.batch_size=0",), ("> 0",)
    ),
    "negative-lr": Case(_run_error("optim.lr=-0.1"), "ConfigError", ("-0.1",), (">= 0",)),
    "negative-grad-clip-norm": Case(
        _run_error("train.grad_clip_norm=-1"),
        "ConfigError",
        ("train.grad_clip_norm=-1",),
        (">= 0",),
    ),
    "zero-timeout": Case(
        _run_error("dist.timeout_s=0"), "ConfigError", ("dist.timeout_s=0",), ("> 0",)
    ),
    "corrupt-checkpoint": Case(
        _corrupt_checkpoint,
        "ValueError",
        ("rank_00000.pt", "corrupt"),
        ("delete", "older checkpoint"),
    ),
    "checkpoint-from-other-world-size": Case(
        _other_world_size,
        "ValueError",
        ("world_size=2", "this run has world_size=1"),
        ("checkpoint.allow_reshard=true",),
    ),
    "parameter-shapes-differ-across-ranks": Case(
        _shape_mismatch,
        "ValueError",
        ("(2, 4)", "(3, 4)", "rank 1"),
        ("every rank must build the same model",),
    ),
    "config-differs-across-ranks": Case(
        _config_mismatch,
        "ConfigError",
        ("rank(s) [1]",),
        ("same command line and config files",),
    ),
    "nan-loss": Case(
        _nan_loss,
        "FloatingPointError",
        ("non-finite loss", "at step", "on rank 0"),
        ("train.nan_policy=skip", "are kept"),
    ),
}


def test_the_table_covers_at_least_15_inputs() -> None:
    assert len(CASES) >= 15


# the two cases of a real 3-rank torchrun sweep take about 20 s on 2 cores: the slow suite
_SLOW_CASES = {"world-size-3-one-peer-exp", "one-node-alternating-exp-ring"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_CASES else n for n in CASES],
)
def test_bad_input_fails_fast_with_one_line(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    case = CASES[name]
    outcome = case.attempt(tmp_path, request)
    if case.error == "exit":
        assert outcome.error.startswith("exit ") and outcome.error != "exit 0", outcome
    else:
        assert outcome.error == case.error, outcome
    assert "\n" not in outcome.message and outcome.message.strip(), outcome
    for needle in (*case.value, *case.allowed):
        assert needle in outcome.message, f"{needle!r} not in {outcome.message!r}"
    assert outcome.seconds < case.limit_s, outcome
