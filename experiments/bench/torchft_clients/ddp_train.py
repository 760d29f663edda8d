"""torchft's ``DDP`` on this project's workload: one host of a fault-tolerant all-reduce job.

``python -m experiments.bench.torchft_clients.ddp_train --lighthouse URL --replica-id h0
--run-dir DIR [train.py overrides]`` trains the workload of ``train.py`` with those
overrides (:mod:`.common`) the way torchft's ``train_ddp.py`` does: a
:class:`torchft.Manager` (async quorum, the default), the model in
:class:`torchft.ddp.DistributedDataParallel` (gradients averaged over the replica
groups of each step's quorum), the optimizer in
:class:`torchft.optim.OptimizerWrapper` (``zero_grad`` starts the quorum, ``step``
commits only if the step's all-reduce held). A replica that starts late, or again
after a kill, heals from a live one: the model, optimizer, scheduler, the data
position and torchft's step. The scheduler steps with each committed step.

``--grad-sync allreduce`` leaves out torchft's DDP wrapper and averages the
gradients with ``Manager.allreduce`` of one flat buffer after the backward pass
(its work's ``wait`` reports a failure to the manager, and the step is then not
committed). torchft 0.2.0's wrapper does not survive a peer that dies during its
all-reduce: its communication hook asserts on the failed work's future
(``assert fut._fut`` in ``torchft/ddp.py``), and the backward pass raises.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from experiments.bench.torchft_clients.common import manager, now, parse_args, start


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv, __doc__.splitlines()[0])
    work, metrics = start(args)
    healed: list[int] = []

    def load_state_dict(state: dict[str, Any]) -> None:
        work.load_state_dict(state)
        healed.append(1)

    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper

    mgr = manager(args, load_state_dict, work.state_dict, use_async_quorum=True)
    wrapped = args.grad_sync == "ddp"
    model = DistributedDataParallel(mgr, work.model) if wrapped else work.model
    optimizer = OptimizerWrapper(mgr, work.optimizer)
    params = [p for p in work.model.parameters() if p.requires_grad]

    def average_grads() -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        mgr.allreduce(flat).wait()  # a failure is reported to the manager: no commit
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    noted = 0
    try:
        while mgr.current_step() < work.total:
            optimizer.zero_grad()
            loss = work.loss(model)
            loss.backward()
            if not wrapped:
                average_grads()
            before = mgr.current_step()
            optimizer.step()
            step = mgr.current_step()
            if len(healed) > noted:
                noted = len(healed)
                metrics.healed(step - 1)
            if step > before:  # committed: the optimizer stepped
                work.scheduler.step()
                metrics.log({"step": step, "time": now(), "train/loss": float(loss.detach())})
        steps = mgr.current_step()
        metrics.finish(work, {"replica_id": args.replica_id, "steps": steps, "healed": len(healed)})
    finally:
        metrics.close()
        mgr.shutdown(wait=False)


if __name__ == "__main__":
    main(sys.argv[1:])
