"""Fixtures of the trainer's collaborators: a one-process group and a small step to train."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from decent_dp.utils import initialize_dist
from experiments.train.metrics import TrainWindow
from experiments.train.optim import build_optim_fn, build_scheduler_fn
from experiments.train.step import TrainStep
from tests.support.launch import compose_config


@pytest.fixture
def group_of_one(world_of_one) -> Iterator[None]:
    """A real one-process gloo group, destroyed after the test."""
    initialize_dist(backend="gloo")
    yield


def small_model(seed: int = 0) -> nn.Module:
    """A 4 -> 3 classifier with one hidden layer, the same for the same seed."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def batches(count: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of 16 random inputs and labels."""
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(16, 4, generator=gen), torch.randint(0, 3, (16,), generator=gen))
        for _ in range(count)
    ]


@pytest.fixture
def make_step(group_of_one) -> Iterator[Callable[..., TrainStep]]:
    """Build a :class:`TrainStep` over :func:`small_model` from config overrides; closed after."""
    built: list[TrainStep] = []

    def make(*overrides: str, model: nn.Module | None = None, total_steps: int = 10) -> TrainStep:
        cfg = compose_config("scheduler=constant", *overrides)
        step = TrainStep(
            small_model() if model is None else model,
            cfg.train,
            cfg.topology,
            build_optim_fn(cfg.optim),
            build_scheduler_fn(cfg.scheduler, 5, total_steps),
            TrainWindow(torch.device("cpu")),
            rank=0,
            world_size=1,
        )
        built.append(step)
        return step

    yield make
    for step in built:
        step.close()
