"""The outer copy is the same on every rank, whatever the ranks' parameters when buckets are built.

The outer optimizer's copy ``x_outer`` starts when the first backward pass
builds the buckets. The wrapper broadcasts rank 0's model when it is
constructed, but a script can change its parameters after that (a per-rank
initialisation, a load of another rank's file): then rank 0's parameters at
that point are the outer loop's start on every rank, as one optimizer over
the average model needs. Here every rank perturbs its own parameters after
wrapping, on 4 real gloo processes, and the outer copies must agree bit for
bit and match a float64 replay that starts ``x_outer`` from rank 0's
perturbed model; a resume from a checkpoint keeps the saved outer copies.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp.topo import LocalSGDTopology, TopologyReg, mixing_matrices
from tests.support.ddp_cases import (
    assert_same_runs,
    flat,
    local_steps,
    loss_of,
    make_model,
    make_optim,
    replay_workers,
    resume_worker,
    set_flat,
)
from tests.support.dist_harness import ok_values, run_distributed

WORLD = 4
ATOL = 1e-9
OUTER_FN = partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)
CASES = [
    pytest.param({"topology": "local-sgd", "every": 3, "steps": 9}, id="diloco"),
    pytest.param({"topology": "ring", "every": 4, "steps": 8}, id="slowmo-ring"),
]


def _topology(cfg: dict[str, Any], world: int) -> Any:
    if cfg["topology"] == "local-sgd":
        return LocalSGDTopology(world, world, period=cfg["every"])
    return TopologyReg.create(cfg["topology"], world, 1)


def perturbation(model: torch.nn.Module, rank: int) -> list[torch.Tensor]:
    """What rank ``rank`` adds to each parameter after wrapping: different on every rank."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype) for p in model.parameters()]


def wrap_and_perturb(model: torch.nn.Module, cfg: dict[str, Any]) -> DecentralizedDataParallel:
    """Wrap (rank 0's model is broadcast), then move this rank's parameters its own way."""
    ddp = DecentralizedDataParallel(
        model,
        optim_fn=make_optim(cfg),
        topology=_topology(cfg, dist.get_world_size()),
        bucket_size_in_mb=0,  # one bucket per parameter: several outer copies
        outer_optim_fn=OUTER_FN,
        outer_every=cfg["every"],
    )
    with torch.no_grad():
        for p, d in zip(ddp.module.parameters(), perturbation(ddp.module, dist.get_rank())):
            p.add_(d)
    return ddp


def outer_copy(ddp: DecentralizedDataParallel) -> torch.Tensor:
    """``x_outer`` flattened in the module's parameter order."""
    outer, buckets = ddp._engine.outer, ddp._buckets
    assert outer is not None and buckets is not None
    by_name: dict[str, torch.Tensor] = {}
    for b in buckets:
        copies = outer.copies[b.index]
        if b.flat is not None:  # one block, the parameters at their offsets
            for n, p, o in zip(b.names, b.params, b.offsets):
                by_name[n] = copies[0][o : o + p.numel()]
        else:
            by_name.update((n, x.reshape(-1)) for n, x in zip(b.names, copies))
    return torch.cat([by_name[n].clone() for n, _ in ddp.module.named_parameters()])


def _worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    ddp = wrap_and_perturb(make_model("mlp", seed=rank), cfg)
    for t in range(1, cfg["steps"] + 1):
        loss_of(ddp, rank, t).backward()
    out = {"params": flat(ddp.module), "outer": outer_copy(ddp)}
    ddp.close()
    return out


def replay(cfg: dict[str, Any], world: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Float64 replay from rank 0's model plus each worker's own perturbation.

    ``x_outer`` starts from rank 0's perturbed model. The models differ from
    the start, so step 1, which mixes nothing in, is not the topology's round.
    """
    _, start, models, optims = replay_workers(_topology(cfg, world), world, cfg)
    mats = mixing_matrices(_topology(cfg, world), world, 1)
    for i, m in enumerate(models):
        with torch.no_grad():
            for p, d in zip(m.parameters(), perturbation(start, i)):
                p.add_(d)
    x_outer = flat(models[0])
    outer_opt = OUTER_FN([x_outer])
    for t in range(1, cfg["steps"] + 1):
        old, new = local_steps(models, optims, t)
        stacked = torch.stack(old)
        if t == 1:  # no gossip precedes the first step (the buckets are built in its backward)
            mixed = old
        elif t % cfg["every"] == 0:
            x_outer.grad = x_outer - stacked.mean(0)
            outer_opt.step()
            mixed = [x_outer.detach().clone() for _ in range(world)]
        else:
            w = mats[(t - 1) % len(mats)]
            mixed = [(w[i].unsqueeze(1) * stacked).sum(0) for i in range(world)]
        for i, m in enumerate(models):
            set_flat(m, mixed[i] + (new[i] - old[i]))
    return [flat(m) for m in models], x_outer.detach()


@pytest.mark.parametrize("cfg", CASES)
def test_outer_copies_agree_after_per_rank_changes(cfg: dict[str, Any]) -> None:
    values = ok_values(run_distributed(_worker, WORLD, cfg))
    for rank, v in enumerate(values):
        assert torch.equal(v["outer"], values[0]["outer"]), f"rank {rank}'s outer copy differs"
    models, x_outer = replay(cfg, WORLD)
    assert_close(values[0]["outer"], x_outer, rtol=0, atol=ATOL)
    for rank, (v, exp) in enumerate(zip(values, models)):
        assert_close(v["params"], exp, rtol=0, atol=ATOL, msg=lambda m, r=rank: f"rank {r}: {m}")


def test_resume_keeps_the_saved_outer_copies(tmp_path) -> None:
    """The loaded outer state wins over the parameters the fresh wrapper starts from."""
    cfg = {"topology": "local-sgd", "every": 3, "steps": 8, "resume_at": 4}
    args = (cfg, str(tmp_path))
    straight = ok_values(run_distributed(resume_worker, WORLD, *args, "straight", wrap_and_perturb))
    ok_values(run_distributed(resume_worker, WORLD, *args, "first", wrap_and_perturb))
    resumed = ok_values(run_distributed(resume_worker, WORLD, *args, "second", wrap_and_perturb))
    assert_same_runs(straight, resumed, cfg["steps"])
