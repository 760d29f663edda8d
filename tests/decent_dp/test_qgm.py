"""Quasi-global momentum (:class:`decent_dp.optim.QGMSGD`).

Three levels: a two-worker sequence computed by hand, the hook and no-hook
paths against each other and against a direct transcription of the update
rule, and real gloo workers under the wrapper against a single-process
float64 replay of ``x(t) = W x(t-1) + d(t)`` with the buffer update after the mix.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp.optim import QGMSGD, optim_fn_qgm_sgd
from decent_dp.topo import mixing_matrices
from tests.support.ddp_cases import flat, loss_of, make_model, set_flat
from tests.support.dist_harness import ok_values, run_distributed

__all__: list[str] = []


def _two_workers(steps: int, hook: bool, **kw: Any) -> list[tuple[list[float], list[float]]]:
    """Two scalar workers, f_i(x) = (x - c_i)^2 / 2 with c = (2, 0), averaged every step."""
    xs = [torch.zeros(1, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    opts = [QGMSGD([x], **kw) for x in xs]
    targets = (2.0, 0.0)
    out = []
    for _ in range(steps):
        old = [x.detach().clone() for x in xs]
        for x, c, opt in zip(xs, targets, opts):
            x.grad = (x.detach() - c).clone()
            opt.step()
        mean = (old[0] + old[1]) / 2
        with torch.no_grad():
            for x, o in zip(xs, old):
                x.copy_(mean + (x - o))  # x_i(t) = sum_j W_ij x_j(t-1) + d_i(t)
        if hook:
            for opt in opts:
                opt.post_average_hook()
        # mhat as the hook leaves it; on the no-hook path fold it here for the comparison only
        mhat = []
        for x, opt in zip(xs, opts):
            state = opt.state[x]
            buf = state["momentum_buffer"].clone()
            if state["pending"]:
                mu = opt.param_groups[0]["mu"] or opt.param_groups[0]["momentum"]
                buf = mu * buf + (1 - mu) * (state["prev"] - x.detach()) / state["prev_lr"]
            mhat.append(float(buf))
        out.append(([float(x.detach()) for x in xs], mhat))
    return out


def test_two_workers_by_hand() -> None:
    # lr=0.1, beta=mu=0.5, W = [[.5, .5], [.5, .5]], x(0) = (0, 0), g_i = x_i - c_i, c = (2, 0)
    # t=1: g=(-2, 0)   m=(-2, 0)          d=(0.2, 0)         Wx=(0, 0)         x=(0.2, 0)
    #      mhat = .5*0 + .5*((0, 0) - (0.2, 0))/0.1 = (-1, 0)
    # t=2: g=(-1.8, 0) m=g+.5*mhat=(-2.3, 0) d=(0.23, 0)      Wx=(0.1, 0.1)     x=(0.33, 0.1)
    #      mhat = .5*(-1, 0) + .5*((0.2, 0) - (0.33, 0.1))/0.1 = (-1.15, -0.5)
    # t=3: g=(-1.67, 0.1) m=(-2.245, -0.15) d=(0.2245, 0.015) Wx=(0.215, 0.215) x=(0.4395, 0.23)
    #      mhat = .5*(-1.15, -0.5) + .5*((0.33, 0.1) - (0.4395, 0.23))/0.1 = (-1.1225, -0.9)
    # worker 1 has a zero local gradient at t=1 and t=2, yet its buffer follows the global pull
    expected = [
        ([0.2, 0.0], [-1.0, 0.0]),
        ([0.33, 0.1], [-1.15, -0.5]),
        ([0.4395, 0.23], [-1.1225, -0.9]),
    ]
    for hook in (True, False):
        got = _two_workers(3, hook, lr=0.1, momentum=0.5)
        for (gx, gm), (ex, em) in zip(got, expected):
            assert gx == pytest.approx(ex, abs=1e-12)
            assert gm == pytest.approx(em, abs=1e-12)


def _reference(
    x0: torch.Tensor,
    grads: list[torch.Tensor],
    mixes: list[torch.Tensor],
    lr: float,
    beta: float,
    mu: float,
    wd: float,
    nesterov: bool,
) -> torch.Tensor:
    """The docstring's rule, for one worker whose neighbours' mix adds ``mixes[t]`` each step."""
    x, mhat = x0.clone(), torch.zeros_like(x0)
    for g, shift in zip(grads, mixes):
        g = g + wd * x
        m = g + beta * mhat
        d = -lr * (g + beta * m if nesterov else m)
        new = x + shift + d
        mhat = mu * mhat + (1 - mu) * (x - new) / lr
        x = new
    return x


@pytest.mark.parametrize("hook", [True, False])
@pytest.mark.parametrize(
    "kw",
    [
        {"lr": 0.05, "momentum": 0.9},
        {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
        {"lr": 0.2, "momentum": 0.5, "mu": 0.8},
    ],
    ids=["plain", "nesterov-wd", "mu"],
)
def test_matches_rule(kw: dict[str, Any], hook: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 2, generator=g, dtype=torch.float64)
    grads = [torch.randn(3, 2, generator=g, dtype=torch.float64) for _ in range(6)]
    mixes = [0.1 * torch.randn(3, 2, generator=g, dtype=torch.float64) for _ in range(6)]
    p = x0.clone().requires_grad_(True)
    opt = QGMSGD([p], **kw)
    for grad, shift in zip(grads, mixes):
        p.grad = grad.clone()
        opt.step()
        with torch.no_grad():
            p.add_(shift)  # the neighbours' contribution, added after the local step
        if hook:
            opt.post_average_hook()
            opt.post_average_hook()  # a second call without a step changes nothing
    beta = kw["momentum"]
    expected = _reference(
        x0,
        grads,
        mixes,
        kw["lr"],
        beta,
        kw.get("mu", beta),
        kw.get("weight_decay", 0.0),
        kw.get("nesterov", False),
    )
    assert_close(p.detach(), expected, rtol=0, atol=1e-12)


def test_without_gossip_is_double_smoothed_heavy_ball() -> None:
    # no mixing: mhat = mu*mhat + (1-mu)*m, so with mu=0 QGM is heavy-ball SGD with buffer m
    p = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)
    q = p.detach().clone().requires_grad_(True)
    qgm = QGMSGD([p], lr=0.1, momentum=0.9, mu=0.0)
    sgd = torch.optim.SGD([q], lr=0.1, momentum=0.9)
    for _ in range(5):
        for t in (p, q):
            t.grad = (t.detach() ** 3).clone()
        qgm.step()
        sgd.step()
    assert_close(p.detach(), q.detach(), rtol=0, atol=1e-12)


def test_zero_lr_keeps_buffer() -> None:
    p = torch.ones(2, dtype=torch.float64, requires_grad=True)
    opt = QGMSGD([p], lr=0.0, momentum=0.9)
    p.grad = torch.ones(2, dtype=torch.float64)
    opt.step()
    opt.post_average_hook()
    assert torch.equal(opt.state[p]["momentum_buffer"], torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize(
    ("kw", "word"),
    [
        ({"lr": -1.0}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"momentum": -0.1}, "momentum"),
        ({"mu": 1.5}, "mu"),
        ({"momentum": 0.0, "nesterov": True}, "nesterov"),
        ({"weight_decay": -1.0}, "weight_decay"),
    ],
)
def test_bad_arguments(kw: dict[str, Any], word: str) -> None:
    p = torch.zeros(2, requires_grad=True)
    for build in (lambda: QGMSGD([p], **kw), lambda: optim_fn_qgm_sgd([(p, "w")], **kw)):
        with pytest.raises(ValueError, match=word):
            build()


def test_factory_groups_pair_orders_and_state_dict(tmp_path) -> None:
    w = torch.randn(3, 2, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    opt = optim_fn_qgm_sgd([("w", w), (b, "b")], lr=0.1, weight_decay=0.01)
    assert [g["names"] for g in opt.param_groups] == [["w"], ["b"]]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    for t in (w, b):
        t.grad = torch.ones_like(t)
    opt.step()
    torch.save(opt.state_dict(), tmp_path / "s.pt")
    again = optim_fn_qgm_sgd([(w, "w"), (b, "b")], lr=0.1, weight_decay=0.01)
    again.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert again.state[w]["pending"] is True
    assert torch.equal(again.state[w]["prev"], opt.state[w]["prev"])


# ---------------------------------------------------------------- under the wrapper

QGM = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}


def _qgm_fn(pairs: list) -> QGMSGD:
    return optim_fn_qgm_sgd(pairs, **QGM)


def qgm_worker(rank: int, world: int, topology: Any, steps: int) -> dict[str, Any]:
    model = make_model("mlp", seed=rank)
    ddp = DecentralizedDataParallel(model, optim_fn=_qgm_fn, topology=topology, bucket_size_in_mb=0)
    for t in range(1, steps + 1):
        loss_of(ddp, rank, t).backward()
    return {"params": flat(ddp.module)}


def qgm_replay(topology: Any, world: int, steps: int) -> list[torch.Tensor]:
    mats = mixing_matrices(topology, world)
    start = flat(make_model("mlp", seed=0))
    models = [make_model("mlp", seed=0) for _ in range(world)]
    for m in models:
        set_flat(m, start)
    opts = [_qgm_fn([(p, n) for n, p in m.named_parameters()]) for m in models]
    for t in range(1, steps + 1):
        old = [flat(m) for m in models]
        for i, (m, opt) in enumerate(zip(models, opts)):
            opt.zero_grad(set_to_none=True)
            loss_of(m, i, t).backward()
            opt.step()
        w = mats[(t - 1) % len(mats)]
        stacked = torch.stack(old)
        for i, (m, opt) in enumerate(zip(models, opts)):
            set_flat(m, (w[i].unsqueeze(1) * stacked).sum(0) + (flat(m) - old[i]))
            opt.post_average_hook()
    return [flat(m) for m in models]


@pytest.mark.parametrize(("topology", "world"), [("ring", 4), ("one-peer-exp", 2)])
def test_qgm_under_wrapper_matches_replay(topology: str, world: int) -> None:
    steps = 6
    values = ok_values(run_distributed(qgm_worker, world, topology, steps))
    expected = qgm_replay(topology, world, steps)
    for rank, (got, exp) in enumerate(zip(values, expected)):
        assert_close(got["params"], exp, rtol=0, atol=1e-9, msg=lambda m, r=rank: f"rank {r}: {m}")
    # the data differ per rank, so the workers really hold different models
    assert (values[0]["params"] - values[1]["params"]).abs().max() > 1e-4
