"""The training loop's hot path never waits on the host, and it closes what it opens.

A real in-process run (world size 1, gloo) counts every call of ``Tensor.item``,
``Tensor.__float__``, ``Tensor.__bool__`` and ``Tensor.tolist``: none may happen
between two metrics lines except in the host phases (logging, evaluation,
checkpoints), whatever the topology, clipping or ``nan_policy``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

from decent_dp.ddp import DecentralizedDataParallel
from experiments.train.run import run
from experiments.train.step import TrainStep
from experiments.train.trainer import Trainer
from tests.support.launch import compose_config

QUICK = ["logger=none", "log.progress=false", "log.every=4", "log.consensus_every=4"]
COUNTED = ("item", "__float__", "__bool__", "tolist")


def _cfg(*overrides: str):
    return compose_config(*QUICK, *overrides)


class _HostReads:
    """Counts host reads of tensors by phase: before the first metrics line, steps, host phases."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.phase = "setup"  # the first backward builds the buckets: not counted
        self.in_steps: list[str] = []
        self.in_host = 0
        self.steps = 0
        for name in COUNTED:
            monkeypatch.setattr(
                torch.Tensor, name, self._counting(getattr(torch.Tensor, name), name)
            )
        host_phase, train_step = Trainer._host_phase, TrainStep.__call__
        summary = Trainer._summary
        reads = self

        def counted_host_phase(trainer: Any, bar: Any, log_due: bool, *rest: Any) -> None:
            before, reads.phase = reads.phase, "host"
            try:
                host_phase(trainer, bar, log_due, *rest)
            finally:
                reads.phase = "steps" if log_due or before == "steps" else before

        def counted_train_step(step: Any, *args: Any) -> None:
            reads.steps += reads.phase == "steps"
            train_step(step, *args)

        def counted_summary(trainer: Any) -> Any:
            reads.phase = "done"
            return summary(trainer)

        monkeypatch.setattr(Trainer, "_host_phase", counted_host_phase)
        monkeypatch.setattr(TrainStep, "__call__", counted_train_step)
        monkeypatch.setattr(Trainer, "_summary", counted_summary)

    def _counting(self, original: Any, name: str) -> Any:
        reads = self

        def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if reads.phase == "steps":
                reads.in_steps.append(name)
            elif reads.phase == "host":
                reads.in_host += 1
            return original(tensor, *args, **kwargs)

        return counting


@pytest.mark.parametrize("topology", ["one-peer-exp", "allreduce"])
def test_no_host_reads_between_metrics_lines(topology, tmp_path, world_of_one, monkeypatch):
    reads = _HostReads(monkeypatch)
    # metrics lines at 4, 8, 12; a checkpoint at 6 is a host phase that is not a metrics line;
    # the global-norm clipping and the gradient hooks of nan_policy=skip run at every step
    cfg = _cfg(
        f"topology={topology}",
        "train.max_steps=12",
        "checkpoint.every_steps=6",
        "train.grad_clip_norm=1.0",
        "train.nan_policy=skip",
    )
    summary = run(cfg, run_dir=tmp_path)
    assert summary["train/steps"] == 12 and summary["train/skipped_steps"] == 0
    assert reads.steps == 8  # steps 5..12 were watched
    assert reads.in_steps == [], f"host reads inside training steps: {reads.in_steps}"
    assert reads.in_host > 0  # the counters do see the reads of the host phases


@pytest.mark.parametrize("topology", ["ring", "allreduce"])
def test_nan_policy_skip_zeroes_one_steps_gradient_on_the_device(
    topology, tmp_path, world_of_one, monkeypatch
):
    init = TrainStep.__init__

    def init_and_poison_step_6(step: TrainStep, *args: Any, **kwargs: Any) -> None:
        init(step, *args, **kwargs)
        criterion, calls = step.task.criterion, [0]

        def poisoned(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            calls[0] += 1  # a fresh run: the n-th call is step n
            # a NaN loss whose gradient is NaN for every parameter
            return criterion(out, y) * (math.nan if calls[0] == 6 else 1.0)

        step.task.criterion = poisoned

    monkeypatch.setattr(TrainStep, "__init__", init_and_poison_step_6)
    reads = _HostReads(monkeypatch)
    cfg = _cfg(f"topology={topology}", "train.max_steps=12", "train.nan_policy=skip")
    summary = run(cfg, run_dir=tmp_path)
    # the skip decision happens on the device; the count arrives at the next host phase
    assert summary["train/steps"] == 12 and summary["train/skipped_steps"] == 1
    assert reads.steps == 8 and reads.in_steps == []
    # the NaN never reached the parameters: every later loss is finite
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = {line["step"]: line.get("train/loss") for line in lines if "train/lr" in line}
    assert list(losses) == [4, 8, 12] and all(math.isfinite(v) for v in losses.values())
    assert summary["eval/acc"] > 0.2


def test_run_closes_the_wrapper_on_success_and_on_error(tmp_path, world_of_one, monkeypatch):
    closed: list[DecentralizedDataParallel] = []
    close = DecentralizedDataParallel.close

    def recording_close(self: DecentralizedDataParallel) -> None:
        closed.append(self)
        close(self)

    monkeypatch.setattr(DecentralizedDataParallel, "close", recording_close)
    run(_cfg("topology=ring", "train.max_steps=2"), run_dir=tmp_path / "ok")
    assert len(closed) == 1
    bad = _cfg("topology=ring", "train.max_steps=12", "scheduler=constant", "optim.lr=1e12")
    with pytest.raises(FloatingPointError, match="non-finite loss at step"):
        run(bad, run_dir=tmp_path / "nan")
    assert len(closed) == 2 and closed[0] is not closed[1]
