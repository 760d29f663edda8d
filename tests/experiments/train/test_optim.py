"""The ``optim`` and ``scheduler`` config groups build the factories they name."""

from __future__ import annotations

import pytest
import torch

from experiments.train.optim import (
    OPTIM_FNS,
    SCHEDULER_FNS,
    build_optim_fn,
    build_scheduler_fn,
    optim_hyper,
)
from tests.support.launch import CONF, compose_config


def test_every_config_of_the_groups_is_registered() -> None:
    assert {p.stem for p in (CONF / "optim").glob("*.yaml")} == set(OPTIM_FNS)
    assert {p.stem for p in (CONF / "scheduler").glob("*.yaml")} == set(SCHEDULER_FNS)


def test_optim_fn_gets_the_sections_hyper_parameters() -> None:
    optim_cfg = compose_config("optim=adamw", "optim.lr=0.02", "optim.betas=[0.8,0.9]").optim
    hyper = optim_hyper(optim_cfg)
    assert "name" not in hyper and hyper["betas"] == (0.8, 0.9) and hyper["lr"] == 0.02
    model = torch.nn.Linear(3, 2)
    optimizer = build_optim_fn(optim_cfg)(list(model.named_parameters()))
    assert isinstance(optimizer, torch.optim.AdamW)
    assert all(g["lr"] == 0.02 and g["betas"] == (0.8, 0.9) for g in optimizer.param_groups)


def _lrs(scheduler_overrides: list[str], steps_per_epoch: int, total: int) -> list[float]:
    cfg = compose_config("optim=sgd", "optim.lr=1.0", *scheduler_overrides)
    model = torch.nn.Linear(3, 2)
    optimizer = build_optim_fn(cfg.optim)(list(model.named_parameters()))
    scheduler = build_scheduler_fn(cfg.scheduler, steps_per_epoch, total)(optimizer)
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_step_schedule_counts_epochs_in_steps() -> None:
    # step_size_epochs=0.5 of 4 steps per epoch: the LR falls every 2 steps
    lrs = _lrs(["scheduler=step", "scheduler.step_size_epochs=0.5", "scheduler.gamma=0.5"], 4, 6)
    assert lrs == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.25, 0.25])


def test_cosine_warmup_rises_for_the_warmup_epochs_then_decays() -> None:
    overrides = ["scheduler=cosine_warmup", "scheduler.warmup_epochs=1", "scheduler.eta_min=0"]
    lrs = _lrs(overrides, 4, 12)
    peak = lrs.index(max(lrs))
    assert 3 <= peak <= 4
    assert all(a < b for a, b in zip(lrs[:peak], lrs[1 : peak + 1]))
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :]))
