"""Evaluation of the averaged and the local models, on a real one-process group."""

from __future__ import annotations

import pytest
import torch

from experiments.train.evaluation import Evaluator
from tests.experiments.train.conftest import batches


def _accuracy_and_loss(model: torch.nn.Module, test: list) -> tuple[float, float]:
    with torch.no_grad():
        out = torch.cat([model(x) for x, _ in test])
    y = torch.cat([y for _, y in test])
    loss = torch.nn.functional.cross_entropy(out, y).item()
    return (out.argmax(dim=1) == y).double().mean().item(), loss


@pytest.mark.parametrize("topology", ["allreduce", "complete"])
def test_one_worker_scores_its_own_model_twice(make_step, topology) -> None:
    step = make_step(f"topology={topology}")
    for number, (x, y) in enumerate(batches(2), start=1):
        step(x, y, number)
    test = batches(3, seed=7)
    evaluator = Evaluator(test, step)
    result = evaluator.evaluate(step=2)
    acc, loss = _accuracy_and_loss(step.module, test)
    assert (
        result["eval/acc"] == pytest.approx(acc) and result["eval/acc_local"] == result["eval/acc"]
    )
    assert result["eval/loss"] == pytest.approx(loss)
    # one worker is always in consensus; under allreduce it is 0 by construction
    assert result["consensus/distance"] == pytest.approx(0.0, abs=1e-12)
    assert evaluator.consensus(sketch=64) == pytest.approx(0.0, abs=1e-12)
    assert evaluator.last == result and evaluator.last_step == 2
    assert step.module.training  # evaluation leaves the mode as it found it
