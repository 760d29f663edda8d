"""Shared pieces of the wrapper tests: models, data, worker bodies and the single-process replay.

The replay re-derives ``x_i(t) = sum_j W_ij(t) x_j(t-1) + d_i(t)`` in one
process: every worker's local update ``d_i(t)`` is an ordinary optimizer step
taken from ``x_i(t-1)``, and the mixing uses the topology's matrices.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from decent_dp import DecentralizedDataParallel
from decent_dp.optim import AccumAdam, AccumAdamW, LaggedVAdamW
from decent_dp.topo import Edge, Topology, mixing_matrices

D_IN, BATCH = 4, 8


class _Bomb(torch.autograd.Function):
    """Identity forward; its backward raises (a failure in the middle of backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("bomb: backward failed on purpose")


class Net(nn.Module):
    """An MLP with optional features that stress the wrapper's bookkeeping."""

    def __init__(self, kind: str = "mlp"):
        super().__init__()
        self.kind = kind
        if kind == "lsq":
            self.head = nn.Linear(D_IN, 1)
            return
        self.l1 = nn.Linear(D_IN, 6)
        self.l2 = nn.Linear(6, 6)
        self.head = nn.Linear(6, 1)
        if kind in ("unused", "late", "late_on_one"):
            self.branch = nn.Linear(D_IN, 1)
        if kind == "conv":
            self.conv = nn.Conv2d(2, 3, kernel_size=(2, 1))
            self.head = nn.Linear(3, 1)
        if kind == "frozen":
            self.l2.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor, step: int = 1, rank: int = 0) -> torch.Tensor:
        if self.kind == "lsq":
            return self.head(x)
        if self.kind == "conv":
            img = x.view(-1, 2, 2, 1).contiguous(memory_format=torch.channels_last)
            return self.head(torch.tanh(self.conv(img)).flatten(1))
        h = torch.tanh(self.l1(x))
        if getattr(self, "bomb", False):
            h = _Bomb.apply(h)
        h = torch.tanh(self.l2(h))
        if self.kind == "ckpt":
            # the head's gradients, the first of the backward, come from a nested backward
            return checkpoint(self.head, h, use_reentrant=True)
        if self.kind == "tied":
            h = torch.tanh(self.l2(h))  # the same weights used twice in one pass
        out = self.head(h)
        if self.kind == "unused" and (step + rank) % 3 != 0:
            out = out + self.branch(x)
        if self.kind == "late" and step >= 3:
            out = out + self.branch(x)
        if self.kind == "late_on_one" and step >= 1 + 2 * rank:  # rank 1 from step 3 on
            out = out + self.branch(x)
        return out


def make_model(kind: str, seed: int) -> Net:
    torch.manual_seed(seed)
    model = Net(kind).double()
    if kind == "conv":
        model = model.to(memory_format=torch.channels_last)
    return model


def batch(rank: int, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct data per rank, step and micro-batch."""
    g = torch.Generator().manual_seed(10_000 * rank + 100 * step + micro)
    a = torch.randn(BATCH, D_IN, generator=g, dtype=torch.float64)
    b = torch.randn(BATCH, 1, generator=g, dtype=torch.float64) + rank
    return a, b


class SubclassedSGD(torch.optim.SGD):
    """An SGD the wrapper knows nothing about (it could read its parameters in any way)."""


def _decay_groups(pairs: Any, wd: float) -> list[dict[str, Any]]:
    """Weights decay, biases do not: two groups, as in most training scripts."""
    weights = [p for p, n in pairs if not n.endswith("bias")]
    biases = [p for p, n in pairs if n.endswith("bias")]
    groups = [{"params": weights, "weight_decay": wd}, {"params": biases, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


# optimizers whose update reads the parameters through weight decay (coupled or decoupled)
DECAY_OPTIMS = {
    "sgd_wd": lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.9, nesterov=True),
    "sgd_wd_maximize": lambda g: torch.optim.SGD(g, lr=0.01, momentum=0.5, maximize=True),
    "sgd_wd_loop": lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.9, foreach=False),
    "adam_wd": lambda g: torch.optim.Adam(g, lr=0.01),
    "adamw": lambda g: torch.optim.AdamW(g, lr=0.01),
    "nadam_decoupled": lambda g: torch.optim.NAdam(g, lr=0.01, decoupled_weight_decay=True),
    "radam_wd": lambda g: torch.optim.RAdam(g, lr=0.01),
    "rmsprop_wd": lambda g: torch.optim.RMSprop(g, lr=0.01, momentum=0.5),
    "adagrad_wd": lambda g: torch.optim.Adagrad(g, lr=0.05),
    "adadelta_wd": lambda g: torch.optim.Adadelta(g, lr=0.5),
    "adamax_wd": lambda g: torch.optim.Adamax(g, lr=0.01),
    "accum_adamw": lambda g: AccumAdamW(g, lr=0.01, accum_iter=2),
    "lagged_v_adamw": lambda g: LaggedVAdamW(g, lr=0.01),
    "accum_adam_wd": lambda g: AccumAdam(g, lr=0.01, accum_iter=2),
    "subclass_wd": lambda g: SubclassedSGD(g, lr=0.05, momentum=0.9),
}


def make_optim(cfg: dict[str, Any]):
    def optim_fn(pairs):
        params = [p for p, _ in pairs]
        name = cfg.get("optim", "sgd")
        if name in DECAY_OPTIMS:
            return DECAY_OPTIMS[name](_decay_groups(pairs, cfg.get("wd", 0.1)))
        if name == "adam":
            return torch.optim.Adam(params, lr=cfg.get("lr", 0.01))
        return torch.optim.SGD(params, lr=cfg.get("lr", 0.05), momentum=cfg.get("momentum", 0.9))

    return optim_fn


class LopsidedPairs(Topology):
    """Pairs that keep 0.7 of their own value (W_ii != W_ij), alternating partners."""

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self._world_size
        first = [Edge([i, i + 1], 0.7) for i in range(0, n - 1, 2)]
        second = [Edge([i, (i + 1) % n], 0.7) for i in range(1, n, 2)]
        return [first, second]


class Triples(Topology):
    """Groups of three beside one rank alone, each member keeping half of its own value."""

    def _get_topo_edges(self) -> list[list[Edge]]:
        n = self._world_size
        assert n == 4, "a test topology for 4 ranks"
        return [[Edge([0, 1, 2], 0.5), Edge([3], 1.0)], [Edge([1, 2, 3], 0.5), Edge([0], 1.0)]]


# test-only topologies, passed as classes so that the registry stays the package's own
LOCAL_TOPOLOGIES: dict[str, type[Topology]] = {"lopsided-pairs": LopsidedPairs, "triples": Triples}


def topology_of(cfg: dict[str, Any]) -> Any:
    """The cfg's topology: a registered name, or an instance of a test-only topology.

    Called inside a worker: the instance takes the world size from torch.distributed.
    """
    name = cfg["topology"]
    if name not in LOCAL_TOPOLOGIES:
        return name
    return LOCAL_TOPOLOGIES[name](None, cfg.get("local_world_size") or 1)


def make_sched(cfg: dict[str, Any]):
    if not cfg.get("sched"):
        return None
    return lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def set_flat(model: nn.Module, vec: torch.Tensor) -> None:
    off = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(vec[off : off + p.numel()].view_as(p))
            off += p.numel()


def replay_workers(
    topo: Any, world: int, cfg: dict[str, Any]
) -> tuple[list[torch.Tensor], nn.Module, list[nn.Module], list[Any]]:
    """A replay's start: the mixing matrices, rank 0's model, and every worker from it.

    Returns:
        ``(mats, start, models, optims)``: one mixing matrix per round of ``topo``, the
        initial model (rank 0's, broadcast, of ``cfg["kind"]``), the workers' copies of it
        and their optimizers.
    """
    mats = mixing_matrices(topo, world, 1)
    kind = cfg.get("kind", "mlp")
    start = make_model(kind, seed=0)
    models = [make_model(kind, seed=0) for _ in range(world)]
    for m in models:
        set_flat(m, flat(start))
    optims = [make_optim(cfg)([(p, n) for n, p in m.named_parameters()]) for m in models]
    return mats, start, models, optims


def loss_of(
    model: nn.Module, rank: int, step: int, micro: int = 0, kind: str = "mlp"
) -> torch.Tensor:
    a, b = batch(rank, step, micro)
    out = model(a, step, rank) if kind != "lsq" else model(a)
    return ((out - b) ** 2).mean()


def local_steps(
    models: list[nn.Module], optims: list[Any], t: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every worker's optimizer step ``t`` on its own data: the flat models before and after."""
    old = [flat(m) for m in models]
    for i, (m, opt) in enumerate(zip(models, optims)):
        opt.zero_grad(set_to_none=True)
        loss_of(m, i, t).backward()
        opt.step()
    return old, [flat(m) for m in models]


def wrap(model: nn.Module, cfg: dict[str, Any], scaler: Any = None) -> DecentralizedDataParallel:
    return DecentralizedDataParallel(
        model,
        scaler=scaler,
        optim_fn=make_optim(cfg),
        lr_scheduler_fn=make_sched(cfg),
        topology=topology_of(cfg),
        grad_clip_norm=cfg.get("clip", 0.0),
        param_as_bucket_view=cfg.get("view", True),
        bucket_size_in_mb=cfg.get("bucket_mb", 0),
        local_world_size=cfg.get("local_world_size"),
        stable_param_storage=cfg.get("stable", False),
    )


def train_steps(
    ddp: DecentralizedDataParallel,
    rank: int,
    cfg: dict[str, Any],
    first: int,
    last: int,
    scaler: Any = None,
) -> None:
    kind = cfg.get("kind", "mlp")
    for t in range(first, last + 1):
        for m in range(cfg.get("accum", 1) - 1):
            with ddp.no_sync():
                a, b = batch(rank, t, m + 1)
                out = ddp(a, t, rank) if kind != "lsq" else ddp(a)
                ((out - b) ** 2).mean().backward()
        a, b = batch(rank, t)
        failing = cfg.get("fail_at") == (t, rank)
        ddp.module.bomb = failing
        out = ddp(a, t, rank) if kind != "lsq" else ddp(a)
        ddp.module.bomb = False
        loss = ((out - b) ** 2).mean()
        if cfg.get("inf_at") == (t, rank):
            loss = loss * float("inf")
        if scaler is not None:
            loss = scaler.scale(loss)
        if failing:
            try:
                loss.backward()
            except RuntimeError as exc:
                assert "bomb" in str(exc)
            else:
                raise AssertionError("the failing backward did not fail")
            continue
        loss.backward()
        if cfg.get("global_avg_at") == t:
            ddp.global_avg()


def compile_mode(model: nn.Module, cfg: dict[str, Any]) -> nn.Module:
    """Compile the way users do: the module's forward, or the module itself, before wrapping."""
    how = cfg.get("compile")
    backend = cfg.get("compile_backend", "aot_eager")
    if how == "forward":
        model.forward = torch.compile(model.forward, backend=backend)  # type: ignore[method-assign]
    elif how == "module":
        model = torch.compile(model, backend=backend)  # type: ignore[assignment]
    return model


def train_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train ``cfg['steps']`` steps; rank r starts from seed r, so the broadcast matters."""
    model = compile_mode(make_model(cfg.get("kind", "mlp"), seed=rank), cfg)
    ddp = wrap(model, cfg)
    if cfg.get("alpha") is not None:
        ddp.set_adaptive_factor(cfg["alpha"])
    if cfg.get("compile") == "wrapper":
        ddp = torch.compile(ddp, backend=cfg.get("compile_backend", "aot_eager"))
    train_steps(ddp, rank, cfg, 1, cfg["steps"])
    out: dict[str, Any] = {"params": flat(ddp.module), "step": ddp.step_count}
    out["keys"] = sorted(ddp.state_dict())
    if cfg.get("consensus"):
        out["consensus"] = ddp.consensus_distance()
        out["sketch"] = ddp.consensus_distance(sketch=cfg["consensus"])
    return out


def resume_worker(
    rank: int,
    world: int,
    cfg: dict[str, Any],
    ckpt_dir: str,
    phase: str,
    wrapper: Callable[[nn.Module, dict[str, Any]], Any] | None = None,
) -> dict[str, Any]:
    """Train in phases, each in fresh processes.

    'straight': train 1..steps; 'first': train 1..k and save; 'second': load
    and train k+1..steps. ``cfg["drop_train_keys"]`` are removed from the
    saved training state before it loads (a state from before a feature).
    ``wrapper(model, cfg)`` builds the wrapper (:func:`wrap` by default).
    """
    model = compile_mode(make_model(cfg.get("kind", "mlp"), seed=rank), cfg)
    ddp = plain = (wrapper or wrap)(model, cfg)
    if cfg.get("compile") == "wrapper":  # checkpoints go through the wrapper object itself
        ddp = torch.compile(plain, backend=cfg.get("compile_backend", "aot_eager"))
    k = cfg.get("resume_at", 0)
    path = os.path.join(ckpt_dir, f"rank{rank}.pt")
    if phase == "straight":
        train_steps(ddp, rank, cfg, 1, cfg["steps"])
    elif phase == "first":
        train_steps(ddp, rank, cfg, 1, k)
        torch.save({"model": ddp.state_dict(), "train": plain.training_state_dict()}, path)
    else:
        state = torch.load(path, weights_only=True)
        plain.load_state_dict(state["model"])
        for key in cfg.get("drop_train_keys", ()):
            del state["train"][key]
        plain.load_training_state_dict(state["train"])
        train_steps(ddp, rank, cfg, k + 1, cfg["steps"])
    return {"params": flat(ddp.module), "step": ddp.step_count}


def assert_same_runs(straight: list[Any], resumed: list[Any], steps: int) -> None:
    """Every rank of the resumed run took ``steps`` steps and ends bit for bit where the straight one does."""
    for a, b in zip(straight, resumed):
        assert b["step"] == steps
        assert torch.equal(a["params"], b["params"])


def replay(cfg: dict[str, Any], world: int) -> list[torch.Tensor]:
    """Single-process float64 replay of the decentralized recursion."""
    kind = cfg.get("kind", "mlp")
    mats = mixing_matrices(
        LOCAL_TOPOLOGIES.get(cfg["topology"], cfg["topology"]),
        world,
        cfg.get("local_world_size") or 1,
    )
    start = make_model(kind, seed=0)  # rank 0's initial model is broadcast
    models = [make_model(kind, seed=0) for _ in range(world)]
    for m in models:
        set_flat(m, flat(start))
    optims = [make_optim(cfg)([(p, n) for n, p in m.named_parameters()]) for m in models]
    make = make_sched(cfg)
    scheds = [make(o) if make else None for o in optims]
    for t in range(1, cfg["steps"] + 1):
        old = [flat(m) for m in models]
        for i, (m, opt) in enumerate(zip(models, optims)):
            opt.zero_grad(set_to_none=True)
            for micro in range(1, cfg.get("accum", 1)):
                loss_of(m, i, t, micro, kind).backward()
            loss_of(m, i, t, 0, kind).backward()
            if cfg.get("clip"):
                torch.nn.utils.clip_grad_norm_(m.parameters(), cfg["clip"])
            if cfg.get("fail_at") == (t, i):
                # the backward stopped before l1: its buckets take no step this iteration
                m.l1.weight.grad = m.l1.bias.grad = None
            if cfg.get("inf_at", (None,))[0] != t:  # an inf anywhere skips every worker's update
                opt.step()
            if scheds[i] is not None and cfg.get("inf_at", (None,))[0] != t:
                scheds[i].step()
        new = [flat(m) for m in models]
        w = mats[(t - 1) % len(mats)]
        stacked = torch.stack(old)
        alpha = cfg.get("alpha", 1.0)
        for i, m in enumerate(models):
            mixed = (w[i].unsqueeze(1) * stacked).sum(0)
            set_flat(m, old[i] + alpha * (mixed - old[i]) + (new[i] - old[i]))
        if cfg.get("global_avg_at") == t:
            mean = torch.stack([flat(m) for m in models]).mean(0)
            for m in models:
                set_flat(m, mean)
    return [flat(m) for m in models]
