"""Evaluation of the globally averaged and the local models, and consensus distance.

``eval/acc`` is the accuracy of the globally averaged model (the wrapper's
``averaged()``, which also averages floating-point buffers such as BatchNorm
statistics when ``topology.sync_buffer_in_global_avg`` is true);
``eval/acc_local`` is every worker's own model on its shard of the test set,
correct answers summed over workers, i.e. the workers' mean accuracy
estimated on disjoint shards. Under ``allreduce`` all workers hold the same
model and both numbers coincide.

Consensus distance is ``(1/n) Σ_i ||x_i - x̄||²`` over all parameters: exact,
or estimated from a count sketch of ``sketch`` numbers per rank. Both are
collectives, so every rank computes them at the same steps. Under
``allreduce`` the workers agree exactly and both are 0.0 by construction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from experiments.train.step import TrainStep

__all__ = ["Evaluator"]


class Evaluator:
    """Evaluates the model that a :class:`~experiments.train.step.TrainStep` trains.

    Args:
        test: This rank's shard of the test set: batches of ``(inputs, labels)``.
        train_step: The step whose model is evaluated (its wrapper, bare module
            and autocast).

    Example::

        evaluator = Evaluator(data.test, train_step)
        result = evaluator.evaluate(step=100)  # eval/acc, eval/acc_local, eval/loss, ...
    """

    def __init__(
        self, test: Iterable[tuple[torch.Tensor, torch.Tensor]], train_step: TrainStep
    ) -> None:
        self.test = test
        self.train_step = train_step
        self.device = train_step.device
        self.last: dict[str, float] = {}  # the newest result, for the summary
        self.last_step = -1

    def consensus(self, sketch: int | None = None) -> float:
        """Consensus distance, exact or sketched (a collective); 0 under ``allreduce``."""
        if not self.train_step.decentralized:
            return 0.0
        return self.train_step.ddp.consensus_distance(sketch=sketch)

    def evaluate(self, step: int) -> dict[str, float]:
        """``eval/acc``, ``eval/acc_local``, ``eval/loss`` and ``consensus/distance``, on every rank.

        Args:
            step: The current step, remembered with the result.
        """
        if self.train_step.decentralized:
            with self.train_step.ddp.averaged():
                avg = self._local()
            own = self._local()
        else:
            # the bare module: test shards may differ in batch count, DDP's forward would not
            avg = own = self._local()
        totals = torch.tensor(
            [avg[0], avg[1], avg[2], own[0]], dtype=torch.float64, device=self.device
        )
        dist.all_reduce(totals)
        c_avg, l_avg, n, c_own = totals.tolist()
        n = max(n, 1.0)
        result = {"eval/acc": c_avg / n, "eval/acc_local": c_own / n, "eval/loss": l_avg / n}
        result["consensus/distance"] = self.consensus()
        self.last, self.last_step = result, step
        return result

    @torch.no_grad()
    def _local(self) -> list[float]:
        """(correct, loss sum, count) of the current parameters on this rank's test shard."""
        module: Any = self.train_step.module
        was_training = module.training
        module.eval()
        correct = torch.zeros((), dtype=torch.float64, device=self.device)
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        count = 0
        for x, y in self.test:
            x = self.train_step.prepare(x)
            with self.train_step.autocast():
                out = module(x)
            loss += nn.functional.cross_entropy(out.float(), y, reduction="sum").double()
            correct += (out.argmax(dim=1) == y).sum()
            count += y.numel()
        module.train(was_training)
        return [float(correct), float(loss), float(count)]
