"""One training step on a real one-process group: both parallelisms, the NaN policy, AMP."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from experiments.train.metrics import TrainWindow
from experiments.train.step import NanPolicy, amp_setup
from tests.experiments.train.conftest import batches, small_model

CPU = torch.device("cpu")


def test_amp_is_off_on_the_cpu() -> None:
    assert amp_setup("off", CPU) == (None, None)
    assert amp_setup("bf16", CPU) == (None, None)  # with a warning: training in float32
    assert amp_setup("fp16", CPU) == (None, None)


def test_allreduce_step_is_an_ordinary_optimizer_step(make_step) -> None:
    step = make_step(
        "topology=allreduce",
        "optim=sgd",
        "optim.lr=0.1",
        "optim.momentum=0",
        "optim.weight_decay=0",
    )
    reference = small_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for number, (x, y) in enumerate(batches(3), start=1):
        step(x, y, number)
        optimizer.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    for mine, theirs in zip(step.module.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs)
    # the window summed three finite batches of 16
    loss_sum, steps, _, samples = step.window.sums().tolist()
    assert steps == 3 and samples == 48 and loss_sum > 0
    assert step.current_lr() == pytest.approx(0.1) and step.pop_timers() == {}


def test_wrapper_step_trains_and_reports_its_timers(make_step) -> None:
    step = make_step("topology=complete", "optim=adamw", "optim.lr=0.01")
    before = [p.detach().clone() for p in step.module.parameters()]
    for number, (x, y) in enumerate(batches(3), start=1):
        step(x, y, number)
    assert any(not torch.equal(a, p) for a, p in zip(before, step.module.parameters()))
    assert set(step.pop_timers()) >= {"comm/wait_s"}
    assert step.current_lr() == pytest.approx(0.01)


@pytest.mark.parametrize("topology", ["allreduce", "ring"])
def test_training_state_round_trip(make_step, topology) -> None:
    a = make_step(f"topology={topology}", "optim=adamw")
    for number, (x, y) in enumerate(batches(2), start=1):
        a(x, y, number)
    b = make_step(f"topology={topology}", "optim=adamw", model=small_model(seed=5))
    b(*batches(1, seed=9)[0], 1)  # the wrapper builds its buckets in the first backward
    b.load_model(a.module.state_dict())
    # a copy, as a checkpoint file would give: optimizers load state tensors without copying
    b.load_training_state(copy.deepcopy(a.training_state()))
    x, y = batches(1, seed=3)[0]
    a(x, y, 3)
    b(x, y, 2)
    for pa, pb in zip(a.module.parameters(), b.module.parameters()):
        torch.testing.assert_close(pa, pb)


def test_skip_masks_the_gradients_of_a_non_finite_step() -> None:
    nan = NanPolicy("skip", rank=0, world_size=1, device=CPU)
    weight = nn.Parameter(torch.ones(3))
    handles = nan.mask_gradients([weight])
    nan.loss_finite = torch.tensor(False)
    (weight * math.nan).sum().backward()
    assert torch.equal(weight.grad, torch.zeros(3))
    nan.loss_finite = torch.tensor(True)
    weight.grad = None
    (weight * 2).sum().backward()
    assert torch.equal(weight.grad, torch.full((3,), 2.0))
    for handle in handles:
        handle.remove()
    assert NanPolicy("error", rank=0, world_size=1, device=CPU).mask_gradients([weight]) == []


def _window_with_a_nan_at(step: int) -> TrainWindow:
    window = TrainWindow(CPU)
    for n in range(1, 5):
        loss = torch.tensor(math.nan if n == step else 1.0)
        window.add(loss, torch.tensor(1), 4, step=n)
    return window


def test_skip_counts_and_error_stops(group_of_one, tmp_path) -> None:
    skip = NanPolicy("skip", rank=0, world_size=1, device=CPU)
    assert skip.check(_window_with_a_nan_at(3), 4, tmp_path) == 1
    error = NanPolicy("error", rank=0, world_size=1, device=CPU)
    assert error.check(_window_with_a_nan_at(0), 4, tmp_path) == 0
    message = f"non-finite loss at step 3 on rank 0; checkpoints in {tmp_path} are kept"
    with pytest.raises(FloatingPointError, match=message):
        error.check(_window_with_a_nan_at(3), 4, tmp_path)
