"""Packed workers against the real thing: the multi-process wrapper on gloo, and torch's DDP.

Every case starts from the same model, gives rank ``i`` and packed worker
``i`` the same batches (:func:`tests.support.ddp_cases.batch`), trains 20
steps in float64 and compares every worker's parameters, at most 1e-9
apart. One spawn of 4 and one of 8 real gloo processes run all their cases,
so the processes start once per world size.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from decent_dp import DecentralizedDataParallel
from decent_dp.metrics import consensus_distance_exact
from decent_dp.packed import PackedWorkers
from decent_dp.topo import Topology, TopologyReg
from tests.support import ddp_cases as dc
from tests.support.dist_harness import ok_values, run_distributed

STEPS = 20
# DiLoCo: local SGD with an average every H steps, an outer Nesterov step on x_outer - xbar
DILOCO_EVERY = 5


def _outer_fn(xs: list[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.SGD(xs, lr=0.7, momentum=0.9, nesterov=True)


def _cases(world: int) -> list[dict[str, Any]]:
    topos = ["ring", "one-peer-exp", "alternating-exp-ring", "complete"]
    cases: list[dict[str, Any]] = [
        # alternating-exp-ring needs nodes: 2 ranks per node
        {"topology": t, "optim": o, "local_world_size": 2 if t == "alternating-exp-ring" else 1}
        for t in topos
        for o in ("adamw", "sgd")
    ]
    cases.append({"topology": "allreduce", "optim": "adamw", "clip": 0.5, "sched": True})
    cases.append({"topology": "local-sgd", "optim": "adamw", "outer": True, "sched": True})
    # SlowMo over gossip, its scaled update under a schedule
    cases.append({"topology": "ring", "optim": "sgd", "outer": "slowmo", "sched": True})
    if world == 8:  # the 8-rank spawn keeps to the cases that differ most from 4 ranks
        cases = [c for c in cases if c["topology"] in ("one-peer-exp", "alternating-exp-ring")]
        cases += [{"topology": "ring", "optim": "sgd", "clip": 0.3}]
    for c in cases:
        c["steps"] = STEPS
    return cases


def _feed(model: Any, rank: int, step: int) -> torch.Tensor:
    a, b = dc.batch(rank, step)
    return ((model(a) - b) ** 2).mean()


def _real(rank: int, world: int, cases: list[dict[str, Any]]) -> list[torch.Tensor]:
    """Each case on the real stack: the wrapper over gloo, or DDP + one optimizer for allreduce."""
    torch.set_default_dtype(torch.float64)
    out = []
    for cfg in cases:
        model = dc.make_model("mlp", seed=rank)  # rank 0's model is broadcast
        if cfg["topology"] == "allreduce":
            ddp = DistributedDataParallel(model)  # broadcasts rank 0's model
            opt = dc.make_optim(cfg)([(p, n) for n, p in model.named_parameters()])
            sched = dc.make_sched(cfg)(opt)
            for t in range(1, STEPS + 1):
                _feed(ddp, rank, t).backward()
                nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
            out.append(dc.flat(model))
            continue
        outer = _outer_args(cfg)
        topology: Any = _local_sgd(world) if cfg.get("outer") is True else cfg["topology"]
        with DecentralizedDataParallel(
            model,
            optim_fn=dc.make_optim(cfg),
            lr_scheduler_fn=dc.make_sched(cfg),
            topology=topology,
            grad_clip_norm=cfg.get("clip", 0.0),
            bucket_size_in_mb=0,
            local_world_size=cfg.get("local_world_size", 1),
            **outer,
        ) as ddp:
            for t in range(1, STEPS + 1):
                _feed(ddp, rank, t).backward()
            out.append(dc.flat(ddp.module))
    return out


def _outer_args(cfg: dict[str, Any]) -> dict[str, Any]:
    """DiLoCo (``outer: True``) or SlowMo's scaled update (``outer: "slowmo"``), or none."""
    if not cfg.get("outer"):
        return {}
    args: dict[str, Any] = {"outer_optim_fn": _outer_fn, "outer_every": DILOCO_EVERY}
    if cfg["outer"] == "slowmo":
        args["outer_scale_by_inner_lr"] = True
    return args


def _local_sgd(world: int) -> Topology:
    return TopologyReg.create("local-sgd", world, 1, period=DILOCO_EVERY)


def _packed(cfg: dict[str, Any], world: int, steps: int = STEPS) -> PackedWorkers:
    torch.set_default_dtype(torch.float64)
    topology: Any = _local_sgd(world) if cfg.get("outer") is True else cfg["topology"]
    packed = PackedWorkers(
        dc.make_model("mlp", seed=0),
        world,
        dc.make_optim(cfg),
        dc.make_sched(cfg),
        topology,
        grad_clip_norm=cfg.get("clip", 0.0),
        local_world_size=cfg.get("local_world_size"),
        **_outer_args(cfg),
    )
    _train(packed, world, 1, steps)
    return packed


def _train(packed: PackedWorkers, world: int, first: int, last: int) -> None:
    for t in range(first, last + 1):
        xs, ys = zip(*(dc.batch(r, t) for r in range(world)))
        losses = ((packed(torch.stack(xs)) - torch.stack(ys)) ** 2).mean(dim=(1, 2))
        losses.sum().backward()
        packed.step()


def _workers(packed: PackedWorkers) -> list[torch.Tensor]:
    return [torch.cat([p[i].reshape(-1) for p in packed.params]) for i in range(packed.workers)]


@pytest.mark.parametrize("world", [4, 8])
def test_packed_matches_the_real_wrapper_and_ddp(world: int) -> None:
    cases = _cases(world)
    real = ok_values(run_distributed(_real, world, cases, timeout=240))
    try:
        for c, cfg in enumerate(cases):
            packed = _workers(_packed(cfg, world))
            for rank in range(world):
                torch.testing.assert_close(
                    packed[rank],
                    real[rank][c],
                    atol=1e-9,
                    rtol=0,
                    msg=lambda m, cfg=cfg, rank=rank: f"{cfg} rank {rank}: {m}",
                )
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize(
    ("topology", "world", "local"),
    [
        ("hierarchical", 8, 2),
        ("base-k", 6, 1),
        ("random-matching", 8, 1),
        ("local-sgd", 4, 1),
        ("lopsided-pairs", 4, 1),
        ("triples", 4, 1),
    ],
)
def test_every_other_topology_follows_its_mixing_matrices(
    topology: str, world: int, local: int
) -> None:
    """The single-process replay of ``x(t) = W(t) x(t-1) + d(t)`` (tests.support.ddp_cases)."""
    cfg = {"topology": topology, "optim": "adamw", "steps": 12, "local_world_size": local}
    try:
        reference = dc.replay(cfg, world)
        topo = (
            dc.LOCAL_TOPOLOGIES[topology](world, local)
            if topology in dc.LOCAL_TOPOLOGIES
            else topology
        )
        packed = PackedWorkers(
            dc.make_model("mlp", seed=0),
            world,
            dc.make_optim(cfg),
            None,
            topo,
            local_world_size=local,
        )
        _train(packed, world, 1, cfg["steps"])
        for a, b in zip(_workers(packed), reference):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    finally:
        torch.set_default_dtype(torch.float32)


def test_resume_is_exact_and_metrics_are_the_workers() -> None:
    cfg = {"topology": "one-peer-exp", "optim": "adamw", "sched": True, "outer": True}
    try:
        straight = _packed(cfg, 4)
        first = _packed(cfg, 4, steps=7)
        state = first.state_dict()
        resumed = _packed(cfg, 4, steps=0)
        resumed.load_state_dict(state)
        _train(resumed, 4, 8, STEPS)
        for a, b in zip(_workers(straight), _workers(resumed)):
            assert torch.equal(a, b)
        assert resumed.step_count == STEPS
        workers = [[p[i] for p in straight.params] for i in range(4)]
        assert straight.consensus_distance().item() == pytest.approx(
            consensus_distance_exact(workers), rel=1e-12
        )
        mean = straight.averaged_state_dict()
        torch.testing.assert_close(mean["l1.weight"], straight.params[0].mean(0))
        assert torch.equal(straight.worker_state_dict(2)["head.bias"], straight.params[-1][2])
    finally:
        torch.set_default_dtype(torch.float32)


def test_bytes_per_step_follow_the_schedule() -> None:
    # 100 + 10 float32 elements, each parameter padded to 256 bytes as in the wrapper's blocks
    model = nn.Linear(10, 10)
    sgd = partial(torch.optim.SGD, lr=0.1)

    def per_step(topology: str, **kw: Any) -> float:
        return PackedWorkers(
            model, 8, lambda ps: sgd([p for p, _ in ps]), None, topology, **kw
        ).comm_bytes_per_step()

    assert per_step("ring") == 768.0  # a pair sends its model once
    assert per_step("one-peer-exp") == 768.0
    assert per_step("complete") == pytest.approx(2 * 7 / 8 * 768)
    assert per_step("allreduce") == pytest.approx(2 * 7 / 8 * 440)  # DDP's unpadded gradients
    # local-sgd of period 4: one all-reduce in four steps
    assert per_step("local-sgd", topology_kwargs={"period": 4}) == pytest.approx(
        2 * 7 / 8 * 768 / 4
    )


def test_buffers_frozen_and_shared_parameters_stay_per_worker() -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(5, 3)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Linear(3, 5))
    model[2].weight = emb.weight  # a parameter from outside the model
    model[0].bias.requires_grad_(False)
    reference = [_clone(model) for _ in range(3)]
    opts = [
        torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1) for m in reference
    ]
    packed = PackedWorkers(
        model,
        3,
        lambda ps: torch.optim.SGD([p for p, _ in ps], lr=0.1),
        None,
        "local-sgd",
        topology_kwargs={"period": 100},
    )
    x = torch.randn(3, 4, 3)
    packed(x).sum(dim=(1, 2)).sum().backward()
    packed.step()
    for i, (m, opt) in enumerate(zip(reference, opts)):
        m(x[i]).sum().backward()
        opt.step()
        for name, value in m.state_dict().items():
            torch.testing.assert_close(packed.worker_state_dict(i)[name], value, msg=name)


class _TiedLM(nn.Module):
    """An embedding and a head that share one weight, as a GPT's do, and a BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(x)))


def test_tied_weights_and_own_buffers_in_the_average_and_the_workers() -> None:
    torch.manual_seed(0)
    packed = PackedWorkers(
        _TiedLM(),
        3,
        lambda ps: torch.optim.SGD([p for p, _ in ps], lr=0.5),
        None,
        "local-sgd",
        topology_kwargs={"period": 100},  # no mixing: the workers stay apart
    )
    x = torch.randint(0, 7, (3, 5))
    packed(x).square().sum().backward()
    packed.step()
    (weight,) = [p for n, p in zip(packed.names, packed.params) if n == "emb.weight"]
    mean = weight.detach().mean(0)
    assert not torch.allclose(weight[0], weight[1])
    model = copy.deepcopy(packed.module)
    model.load_state_dict(packed.averaged_state_dict())
    # both names of the tied weight hold the average (the head's must not keep the start)
    torch.testing.assert_close(model.emb.weight, mean)
    torch.testing.assert_close(model.head.weight, mean)
    for i in range(3):
        state = packed.worker_state_dict(i)
        torch.testing.assert_close(state["head.weight"], weight[i].detach())
        own = packed.averaged_state_dict(buffers_of=i)
        torch.testing.assert_close(own["head.weight"], mean)
        torch.testing.assert_close(own["norm.running_mean"], packed.buffers["norm.running_mean"][i])
    averaged = packed.averaged_state_dict()["norm.running_mean"]
    torch.testing.assert_close(averaged, packed.buffers["norm.running_mean"].mean(0))
    with pytest.raises(ValueError, match=r"buffers_of=3 is out of range; it must be in 0\.\.2"):
        packed.averaged_state_dict(buffers_of=3)


def _clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers=0 is invalid"),
        ({"topology": "no-such"}, "unknown topology 'no-such'"),
        ({"optim_fn": lambda ps: torch.optim.RMSprop([p for p, _ in ps])}, "built RMSprop"),
        ({"grad_clip_norm": -1.0}, "grad_clip_norm=-1.0 is invalid"),
        ({"topology": "allreduce", "outer_optim_fn": _outer_fn, "outer_every": 4}, "allreduce"),
        ({"outer_every": 4}, "give both"),
        ({"topology": dc.Triples(4, 1), "workers": 8}, "built for world_size=4"),
    ],
)
def test_bad_arguments_fail_in_one_line(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "model": nn.Linear(2, 2),
        "workers": 4,
        "optim_fn": lambda ps: torch.optim.SGD([p for p, _ in ps], lr=0.1),
        "topology": "ring",
        **kwargs,
    }
    with pytest.raises(ValueError, match=message) as info:
        PackedWorkers(**args)
    assert "\n" not in str(info.value)


@pytest.mark.gpu
def test_packed_on_cuda_follows_the_replay() -> None:
    """The same float64 recursion with every stacked tensor, and each round's mix, on the GPU."""
    cfg = {"topology": "one-peer-exp", "optim": "adamw", "steps": 12, "sched": True, "clip": 0.5}
    try:
        reference = dc.replay(cfg, 8)
        packed = PackedWorkers(
            dc.make_model("mlp", seed=0).cuda(),
            8,
            dc.make_optim(cfg),
            dc.make_sched(cfg),
            "one-peer-exp",
            grad_clip_norm=0.5,
        )
        for t in range(1, cfg["steps"] + 1):
            xs, ys = zip(*(dc.batch(r, t) for r in range(8)))
            out = packed(torch.stack(xs).cuda())
            ((out - torch.stack(ys).cuda()) ** 2).mean(dim=(1, 2)).sum().backward()
            packed.step()
        assert packed.params[0].is_cuda and packed.consensus_distance().is_cuda
        for a, b in zip(_workers(packed), reference):
            torch.testing.assert_close(a.cpu(), b, atol=1e-9, rtol=0)
    finally:
        torch.set_default_dtype(torch.float32)
