"""``optim`` and ``scheduler`` by ``_target_``: the built-in factories' groups and steps."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from experiments.schema import ConfigError
from experiments.train.optim import build_optim_fn, build_scheduler_fn
from tests.experiments.train.conftest import small_model

SGD = {"_target_": "torch.optim.SGD", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}


def _named(model: torch.nn.Module) -> list[tuple[torch.Tensor, str]]:
    return [(p, n) for n, p in model.named_parameters()]


def _groups(optimizer: torch.optim.Optimizer) -> list[tuple[float, list[int]]]:
    return [(g.get("weight_decay"), [id(p) for p in g["params"]]) for g in optimizer.param_groups]


def test_an_optimizer_class_steps_as_the_builtin_factory() -> None:
    own_model, ref_model = small_model(), small_model()
    own = build_optim_fn(SGD)(_named(own_model))
    builtin = OmegaConf.create({"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4})
    ref = build_optim_fn(builtin)(
        list(ref_model.named_parameters())  # (name, tensor) pairs: either order is taken
    )
    assert type(own) is torch.optim.SGD
    assert [d for d, _ in _groups(own)] == [d for d, _ in _groups(ref)] == [5e-4, 0.0]
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randn(8, 4, generator=gen)
        for model, opt in ((own_model, own), (ref_model, ref)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for a, b in zip(own_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_weight_decay_defaults_to_the_class_and_stays_off_biases() -> None:
    model = small_model()
    adamw = build_optim_fn({"_target_": "torch.optim.AdamW", "lr": 1e-3})(_named(model))
    matrices = {id(p) for p in model.parameters() if p.ndim >= 2}
    (decay, decayed), (zero, rest) = _groups(adamw)
    assert (decay, zero) == (1e-2, 0.0) and set(decayed) == matrices and not set(rest) & matrices
    rprop = build_optim_fn({"_target_": "torch.optim.Rprop", "lr": 1e-3})(_named(model))
    assert all("weight_decay" not in g for g in rprop.param_groups)  # it takes none


def test_a_scheduler_class_or_function_of_the_optimizer() -> None:
    def lrs(section: dict) -> list[float]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
        sched = build_scheduler_fn(section, steps_per_epoch=3, total_steps=9)(opt)
        out = []
        for _ in range(6):
            opt.step()
            sched.step()
            out.append(opt.param_groups[0]["lr"])
        return out

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    ref = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6, eta_min=0.1)
    expected = []
    for _ in range(6):
        opt.step()
        ref.step()
        expected.append(opt.param_groups[0]["lr"])
    cosine = {"_target_": "torch.optim.lr_scheduler.CosineAnnealingLR", "T_max": 6, "eta_min": 0.1}
    assert lrs(cosine) == expected
    own = {"_target_": "tests.support.own_targets.constant_schedule", "factor": 0.5}
    assert lrs(own) == [0.5] * 6


@pytest.mark.parametrize(
    ("group", "section", "needles"),
    [
        (
            "optim",
            {**SGD, "momentm": 0.9},
            ("optim.momentm=0.9 is not an argument of torch.optim.SGD",),
        ),
        (
            "optim",
            {**SGD, "lr": -1.0},
            ("optim._target_=torch.optim.SGD raised ValueError: Invalid learning rate: -1.0",),
        ),
        (
            "optim",
            {"_target_": "builtins.list"},
            ("returned an object of type list", "torch.optim.Optimizer"),
        ),
        (
            "scheduler",
            {"_target_": "torch.optim.lr_scheduler.StepLR"},
            ("needs the argument step_size", "set scheduler.step_size"),
        ),
        (
            "scheduler",
            {"_target_": "builtins.id"},
            ("returned an object of type int", "LR scheduler"),
        ),
    ],
)
def test_a_bad_optimizer_or_scheduler_is_one_line(
    group: str, section: dict, needles: tuple
) -> None:
    with pytest.raises(ConfigError) as info:
        if group == "optim":
            build_optim_fn(section)(_named(small_model()))
        else:
            opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
            build_scheduler_fn(section, 1, 1)(opt)
    text = str(info.value)
    assert "\n" not in text and all(n in text for n in needles), text
