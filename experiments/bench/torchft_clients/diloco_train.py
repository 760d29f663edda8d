"""torchft's ``DiLoCo`` on this project's workload: one host of a fault-tolerant DiLoCo job.

``python -m experiments.bench.torchft_clients.diloco_train --lighthouse URL --replica-id h0
--run-dir DIR --sync-every 10 [train.py overrides]`` trains the workload of ``train.py``
(:mod:`.common`) with :class:`torchft.local_sgd.DiLoCo`, as torchft's DiLoCo tests
drive it: a :class:`torchft.Manager` with a synchronous quorum (DiLoCo requires
it), the project's optimizer and scheduler as the inner ones, every
``--sync-every`` inner steps a quorum and an all-reduce of the pseudo-gradients,
and the outer optimizer the project's ``outer=diloco`` uses (Nesterov SGD, lr
0.7, momentum 0.9, ``conf/outer/diloco.yaml``). A replica that starts late, or
again after a kill, trains its first round alone, then heals at the next quorum
from a live one: the model, the inner optimizer and scheduler, the data position
and the inner step (DiLoCo adds its outer optimizer and its copy of the global
model).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from experiments.bench.torchft_clients.common import compose, manager, now, parse_args, start


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv, __doc__.splitlines()[0])
    if args.sync_every < 1:
        raise SystemExit(f"--sync-every={args.sync_every}: must be at least 1")
    work, metrics = start(args)
    inner = {"step": 0}
    healed: list[int] = []

    def state_dict() -> dict[str, Any]:
        return {**work.state_dict(), "step": inner["step"]}

    def load_state_dict(state: dict[str, Any]) -> None:
        work.load_state_dict(state)
        inner["step"] = int(state["step"])
        healed.append(inner["step"])

    from torchft.local_sgd import DiLoCo

    outer_cfg = compose(["outer=diloco"]).outer
    mgr = manager(args, load_state_dict, state_dict, use_async_quorum=False)
    outer = torch.optim.SGD(
        work.model.parameters(),
        lr=float(outer_cfg.lr),
        momentum=float(outer_cfg.momentum),
        nesterov=bool(outer_cfg.nesterov),
    )
    noted = 0
    try:
        with DiLoCo(
            mgr,
            [work.model],
            work.optimizer,
            outer,
            sync_every=args.sync_every,
            backup_device=torch.device("cpu"),
            pin_memory=False,
        ):
            while inner["step"] < work.total:
                work.optimizer.zero_grad()
                loss = work.loss(work.model)
                loss.backward()
                work.optimizer.step()  # every sync_every steps: the quorum and the outer step
                if len(healed) > noted:
                    noted = len(healed)
                    metrics.healed(healed[-1])
                work.scheduler.step()
                inner["step"] += 1
                line = {"step": inner["step"], "time": now(), "train/loss": float(loss.detach())}
                metrics.log({**line, "outer/step": mgr.current_step()})
        summary = {"replica_id": args.replica_id, "steps": inner["step"]}
        metrics.finish(work, {**summary, "outer_steps": mgr.current_step(), "healed": len(healed)})
    finally:
        metrics.close()
        mgr.shutdown(wait=False)


if __name__ == "__main__":
    main(sys.argv[1:])
