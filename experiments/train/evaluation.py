"""Evaluation of the globally averaged and the local models, and consensus distance.

``eval/acc`` is the accuracy of the globally averaged model (the wrapper's
``averaged()``, which also averages floating-point buffers such as BatchNorm
statistics when ``topology.sync_buffer_in_global_avg`` is true);
``eval/acc_local`` is every worker's own model on its shard of the test set,
correct answers summed over workers, i.e. the workers' mean accuracy
estimated on disjoint shards. Under ``allreduce`` all workers hold the same
model and both numbers coincide. A language model's evaluation is the same with the
mean token loss in place of accuracy: ``eval/loss`` (averaged model),
``eval/loss_local`` and ``eval/ppl = exp(eval/loss)``; the task
(:mod:`experiments.train.task`) says which.

Consensus distance is ``(1/n) Σ_i ||x_i - x̄||²`` over all parameters: exact,
or estimated from a count sketch of ``sketch`` numbers per rank. Both are
collectives, so every rank computes them at the same steps. Under
``allreduce`` the workers agree exactly and both are 0.0 by construction.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from experiments.train.packed import PackedStep, packed_eval_sums
from experiments.train.step import TrainStep

__all__ = ["Evaluator"]


class Evaluator:
    """Evaluates the model that a :class:`~experiments.train.step.TrainStep` trains.

    Args:
        test: This rank's shard of the test set: batches of ``(inputs, labels)``; under
            ``engine=packed`` one such shard per worker.
        train_step: The step whose model is evaluated (its wrapper, bare module
            and autocast).

    Example::

        evaluator = Evaluator(data.test, train_step)
        result = evaluator.evaluate(step=100)  # eval/acc, eval/acc_local, eval/loss, ...
    """

    def __init__(self, test: Any, train_step: TrainStep | PackedStep) -> None:
        self.test = test
        self.train_step = train_step
        self.device = train_step.device
        self.last: dict[str, float] = {}  # the newest result, for the summary
        self.last_step = -1

    def consensus(self, sketch: int | None = None) -> float:
        """Consensus distance, exact or sketched (a collective); 0 under ``allreduce``."""
        step = self.train_step
        if not step.decentralized:
            return 0.0
        if isinstance(step, PackedStep):
            return step.consensus(sketch)
        return step.ddp.consensus_distance(sketch=sketch)

    def evaluate(self, step: int) -> dict[str, float]:
        """The task's metrics and ``consensus/distance``, on every rank.

        Images: ``eval/acc``, ``eval/acc_local``, ``eval/loss``; tokens: ``eval/loss``,
        ``eval/loss_local``, ``eval/ppl``.

        Args:
            step: The current step, remembered with the result.
        """
        task = self.train_step.task
        if isinstance(self.train_step, PackedStep):
            avg, own = packed_eval_sums(self.train_step, self.test)
        elif self.train_step.decentralized:
            with self.train_step.ddp.averaged():
                avg = self._local()
            own = self._local()
        else:
            # the bare module: test shards may differ in batch count, DDP's forward would not
            avg = own = self._local()
        totals = torch.tensor(task.eval_totals(avg, own), dtype=torch.float64, device=self.device)
        dist.all_reduce(totals)
        result = task.eval_metrics(totals.tolist())
        result["consensus/distance"] = self.consensus()
        self.last, self.last_step = result, step
        return result

    @torch.no_grad()
    def _local(self) -> list[float]:
        """The task's sums (e.g. correct, loss sum, count) on this rank's test shard."""
        module: Any = self.train_step.module
        task = self.train_step.task
        was_training = module.training
        module.eval()
        sums: torch.Tensor | None = None
        for x, y in self.test:
            x = self.train_step.prepare(x)
            with self.train_step.autocast():
                out = module(x)
            batch = task.eval_sums(out, y)
            sums = batch if sums is None else sums + batch
        module.train(was_training)
        if sums is None:  # no test windows on this rank
            return [0.0] * task.eval_width
        return sums.tolist()
