"""A training script written against decent-dp 0.2.x, kept exactly in that style.

It must run unchanged: ``torchrun --standalone --nproc_per_node=2 tests/decent_dp/legacy_02x_script.py``.
Rank 0 prints one ``RESULT {...}`` JSON line that tests/test_compat.py reads.
"""

import json
from typing import List

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from decent_dp.ddp import LR_SCHEDULER_FN_TYPE, OPTIM_FN_TYPE, DecentralizedDataParallel
from decent_dp.optim import AccumAdamW, lr_scheduler_fn_cosine_with_warmup
from decent_dp.topo import Edge, Topology, TopologyReg
from decent_dp.utils import initialize_dist


@TopologyReg.register("legacy-pairs-then-nodes")
class LegacyTopology(Topology):
    """Pairs in even rounds; in odd rounds each node's ranks, or everyone on a single node."""

    def _get_topo_edges(self) -> List[List[Edge]]:
        pairs = [Edge(ranks=[i, i + 1], weight=0.5) for i in range(0, self._world_size - 1, 2)]
        if self._world_size % 2:
            pairs.append(Edge(ranks=[self._world_size - 1], weight=1.0))
        nodes = [
            Edge(
                ranks=list(range(n * self._local_world_size, (n + 1) * self._local_world_size)),
                weight=1.0 / self._local_world_size,
            )
            for n in range(self._n_nodes)
        ]
        return [pairs, nodes]


def get_optim_fn(lr: float, weight_decay: float) -> OPTIM_FN_TYPE:
    def optim_fn(params):
        no_decay = [v for n, v in params if "bn" in n or "bias" in n]
        decay = [v for n, v in params if not ("bn" in n or "bias" in n)]
        return AccumAdamW(
            [
                {"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=lr,
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=weight_decay,
            accum_iter=1,
        )

    return optim_fn


def get_lr_scheduler_fn(total: int, warmup: int) -> LR_SCHEDULER_FN_TYPE:
    def lr_scheduler_fn(optimizer):
        return lr_scheduler_fn_cosine_with_warmup(optimizer, t_max=total, t_warmup=warmup)

    return lr_scheduler_fn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        x = F.adaptive_avg_pool2d(x, 4)
        return self.fc(torch.flatten(x, 1))


def main():
    rank, world_size = initialize_dist()
    torch.manual_seed(rank)
    steps = 30
    model = DecentralizedDataParallel(
        Net(),
        optim_fn=get_optim_fn(lr=0.01, weight_decay=0.05),
        lr_scheduler_fn=get_lr_scheduler_fn(steps, 5),
        topology="legacy-pairs-then-nodes",
        sync_buffer_in_global_avg=True,
    )
    model.set_adaptive_factor(0.5)
    g = torch.Generator().manual_seed(1234 + rank)
    xs = torch.randn(64, 1, 8, 8, generator=g)
    ys = (xs.mean(dim=(1, 2, 3)) > 0).long() + 2 * (xs[:, :, :4].mean(dim=(1, 2, 3)) > 0).long()
    losses = []
    model.train()
    for step in range(steps):
        idx = torch.arange(16) + (step * 16) % 48
        loss = F.cross_entropy(model(xs[idx]), ys[idx])
        loss.backward()
        losses.append(loss.item())
    lr = model.get_lr()
    before = [p.detach().clone() for p in model.parameters()]
    d2c = model.global_avg(will_revert=True, return_d2c=True)
    averaged = [p.detach().clone() for p in model.parameters()]
    model.revert_global_avg()
    restored = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    gathered = [None] * world_size
    dist.all_gather_object(gathered, [a.sum().item() for a in averaged])
    if rank == 0:
        result = {
            "world_size": world_size,
            "first_loss": sum(losses[:5]) / 5,
            "last_loss": sum(losses[-5:]) / 5,
            "lr": lr,
            "d2c": d2c,
            "restored": restored,
            "averages_agree": all(g == gathered[0] for g in gathered),
            "keys": sorted(model.state_dict().keys()),
        }
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
