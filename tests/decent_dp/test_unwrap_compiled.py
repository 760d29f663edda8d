"""``decent_dp.utils.unwrap_compiled``: the module behind ``torch.compile``, shared by the
wrapper and the framework's allreduce baseline."""

from __future__ import annotations

import torch
from torch import nn

import decent_dp.ddp
from decent_dp.utils import unwrap_compiled
from experiments.train import step


def test_unwrap_compiled_finds_the_module_behind_compile() -> None:
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    compiled = torch.compile(net, backend="eager")
    assert compiled is not net
    assert unwrap_compiled(compiled) is net
    assert unwrap_compiled(net) is net
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    assert list(unwrap_compiled(compiled).state_dict()) == list(net.state_dict())


def test_an_attribute_that_is_no_module_is_not_unwrapped() -> None:
    net = nn.Linear(2, 2)
    net._orig_mod = "not a module"  # type: ignore[assignment]
    assert unwrap_compiled(net) is net


def test_the_wrapper_and_the_baseline_share_it() -> None:
    assert decent_dp.ddp._unwrap_compiled is unwrap_compiled
    assert step.unwrap_compiled is unwrap_compiled
    assert "unwrap_compiled" in decent_dp.utils.__all__
