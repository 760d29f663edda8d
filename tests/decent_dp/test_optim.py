"""Tests for decent_dp.optim: factories, AccumAdam and LR schedulers (no process group)."""

from __future__ import annotations

import copy
import io
import math
from functools import partial

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from decent_dp import optim as dopt

ALL_FNS = [
    dopt.optim_fn_sgd,
    dopt.optim_fn_adam,
    dopt.optim_fn_adamw,
    dopt.optim_fn_accum_adam,
    dopt.optim_fn_accum_adamw,
]


class _Net(nn.Module):
    """Weights (ndim 2, 4), a bias, a norm layer named like nothing special, and a scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.conv = nn.Conv2d(1, 2, 2, bias=False)
        self.scale = nn.Parameter(torch.tensor(1.5))
        # Named like a norm parameter but a matrix: must still be decayed.
        self.bn_proj = nn.Parameter(torch.ones(2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x)) * self.scale


def _groups_by_names(opt: torch.optim.Optimizer) -> dict[frozenset[str], dict]:
    return {frozenset(g["names"]): g for g in opt.param_groups}


# --------------------------------------------------------------------------- pairs and groups


@pytest.mark.parametrize("fn", ALL_FNS)
@pytest.mark.parametrize("order", ["name_first", "tensor_first", "mixed"])
def test_pair_orders_and_decay_groups(fn, order) -> None:
    net = _Net()
    named = list(net.named_parameters())
    if order == "name_first":
        pairs = named
    elif order == "tensor_first":
        pairs = [(p, n) for n, p in named]
    else:
        pairs = [(n, p) if i % 2 else (p, n) for i, (n, p) in enumerate(named)]

    opt = fn(pairs, weight_decay=0.1)
    groups = _groups_by_names(opt)
    decayed = frozenset({"fc.weight", "conv.weight", "bn_proj"})
    undecayed = frozenset({"fc.bias", "bn.weight", "bn.bias", "scale"})
    assert set(groups) == {decayed, undecayed}
    assert groups[decayed]["weight_decay"] == 0.1
    assert groups[undecayed]["weight_decay"] == 0.0
    by_name = dict(named)
    for g in opt.param_groups:
        assert len(g["params"]) == len(g["names"])
        for p, n in zip(g["params"], g["names"]):
            assert p is by_name[n]


def test_generator_input_and_empty_group_omitted() -> None:
    net = nn.Linear(3, 2, bias=False)
    opt = dopt.optim_fn_adamw(net.named_parameters())
    assert len(opt.param_groups) == 1
    assert opt.param_groups[0]["names"] == ["weight"]
    assert opt.param_groups[0]["weight_decay"] == 0.01

    only_bias = [("b", torch.zeros(3, requires_grad=True))]
    opt = dopt.optim_fn_sgd(only_bias)
    assert len(opt.param_groups) == 1
    assert opt.param_groups[0]["weight_decay"] == 0.0


def test_defaults() -> None:
    pairs = list(_Net().named_parameters())

    sgd = dopt.optim_fn_sgd(pairs)
    assert isinstance(sgd, torch.optim.SGD)
    assert sgd.defaults["lr"] == 0.1
    assert sgd.defaults["momentum"] == 0.9
    assert sgd.defaults["weight_decay"] == 5e-4
    assert sgd.defaults["nesterov"] is False

    for fn, cls, wd in [
        (dopt.optim_fn_adam, torch.optim.Adam, 0.0),
        (dopt.optim_fn_adamw, torch.optim.AdamW, 0.01),
        (dopt.optim_fn_accum_adam, dopt.AccumAdam, 0.0),
        (dopt.optim_fn_accum_adamw, dopt.AccumAdamW, 0.01),
    ]:
        opt = fn(pairs)
        assert type(opt) is cls
        assert opt.defaults["lr"] == 1e-3
        assert tuple(opt.defaults["betas"]) == (0.9, 0.999)
        assert opt.defaults["eps"] == 1e-8
        assert opt.defaults["weight_decay"] == wd
        assert max(g["weight_decay"] for g in opt.param_groups) == wd

    assert dopt.optim_fn_accum_adam(pairs).defaults["accum_iter"] == 4
    assert dopt.optim_fn_accum_adam(pairs).defaults["decoupled"] is False
    assert dopt.optim_fn_accum_adamw(pairs).defaults["accum_iter"] == 4
    assert dopt.optim_fn_accum_adamw(pairs).defaults["decoupled"] is True


def test_partial_overrides() -> None:
    pairs = list(_Net().named_parameters())
    opt = partial(dopt.optim_fn_adamw, lr=3e-4, betas=(0.8, 0.95), weight_decay=0.05)(pairs)
    assert opt.defaults["lr"] == 3e-4
    assert tuple(opt.defaults["betas"]) == (0.8, 0.95)
    assert sorted(g["weight_decay"] for g in opt.param_groups) == [0.0, 0.05]
    assert all(g["lr"] == 3e-4 for g in opt.param_groups)

    sgd = partial(dopt.optim_fn_sgd, lr=0.5, momentum=0.8, nesterov=True)(pairs)
    assert sgd.defaults["nesterov"] is True
    assert sgd.defaults["momentum"] == 0.8
    assert all(g["lr"] == 0.5 for g in sgd.param_groups)

    acc = partial(dopt.optim_fn_accum_adamw, accum_iter=7)(pairs)
    assert all(g["accum_iter"] == 7 for g in acc.param_groups)


_BAD = [
    (dopt.optim_fn_sgd, {"lr": -0.1}, "lr"),
    (dopt.optim_fn_sgd, {"momentum": -0.5}, "momentum"),
    (dopt.optim_fn_sgd, {"weight_decay": -1.0}, "weight_decay"),
    (dopt.optim_fn_sgd, {"momentum": 0.0, "nesterov": True}, "nesterov"),
    (dopt.optim_fn_adam, {"lr": -1e-3}, "lr"),
    (dopt.optim_fn_adam, {"eps": 0.0}, "eps"),
    (dopt.optim_fn_adam, {"eps": -1e-8}, "eps"),
    (dopt.optim_fn_adam, {"betas": (1.0, 0.999)}, "betas"),
    (dopt.optim_fn_adam, {"betas": (0.9, -0.1)}, "betas"),
    (dopt.optim_fn_adam, {"betas": (0.9,)}, "betas"),
    (dopt.optim_fn_adamw, {"betas": (0.9, 1.5)}, "betas"),
    (dopt.optim_fn_adamw, {"lr": -1.0}, "lr"),
    (dopt.optim_fn_accum_adam, {"accum_iter": 0}, "accum_iter"),
    (dopt.optim_fn_accum_adam, {"accum_iter": -2}, "accum_iter"),
    (dopt.optim_fn_accum_adamw, {"accum_iter": 0}, "accum_iter"),
    (dopt.optim_fn_accum_adamw, {"eps": 0.0}, "eps"),
    (dopt.optim_fn_accum_adamw, {"betas": (0.9, 1.0)}, "betas"),
]


@pytest.mark.parametrize(("fn", "kwargs", "word"), _BAD)
def test_bad_hyper_parameters(fn, kwargs, word) -> None:
    pairs = list(_Net().named_parameters())
    with pytest.raises(ValueError, match=word) as info:
        fn(pairs, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("fn", ALL_FNS)
def test_empty_params(fn) -> None:
    with pytest.raises(ValueError, match="params"):
        fn([])


@pytest.mark.parametrize("bad", [[torch.zeros(2)], [("a", "b")], [(torch.zeros(2), 3)]])
def test_bad_pairs(bad) -> None:
    with pytest.raises(TypeError, match=r"params\[0\]"):
        dopt.optim_fn_adam(bad)


def test_accum_adam_maximize_rejected() -> None:
    with pytest.raises(ValueError, match="maximize"):
        dopt.AccumAdam([torch.zeros(2, requires_grad=True)], maximize=True)


# --------------------------------------------------------------------------- dopt.AccumAdam


def _reference_accum_adam(
    init: dict[str, torch.Tensor],
    grads: list[dict[str, torch.Tensor]],
    *,
    lr: float,
    b1: float,
    b2: float,
    eps: float,
    wd: float,
    accum_iter: int,
    decoupled: bool,
) -> dict[str, torch.Tensor]:
    """The defining formulas, written out literally in float64, one parameter at a time."""
    out = {}
    for name, p0 in init.items():
        p = p0.clone()
        decay = wd if p.ndim >= 2 else 0.0
        m = torch.zeros_like(p)
        v = torch.zeros_like(p)
        acc = torch.zeros_like(p)
        k = 0
        for t, step_grads in enumerate(grads, start=1):
            g = step_grads[name].clone()
            if not decoupled:
                g = g + decay * p
            acc = acc + g
            m_hat = (b1 * m + (1 - b1) * g) / (1 - b1 ** (k + 1))
            v_hat = (b2 * v + (1 - b2) * g * g) / (1 - b2 ** (k + 1))
            if decoupled:
                p = p * (1 - lr * decay)
            p = p - lr * m_hat / (torch.sqrt(v_hat) + eps)
            if t % accum_iter == 0:
                gbar = acc / accum_iter
                m = b1 * m + (1 - b1) * gbar
                v = b2 * v + (1 - b2) * gbar * gbar
                k += 1
                acc = torch.zeros_like(p)
        out[name] = p
    return out


@pytest.mark.parametrize(
    ("fn", "decoupled"), [(dopt.optim_fn_accum_adam, False), (dopt.optim_fn_accum_adamw, True)]
)
def test_accum_adam_matches_reference(fn, decoupled) -> None:
    gen = torch.Generator().manual_seed(0)
    init = {
        "w": torch.randn(3, 2, generator=gen, dtype=torch.float64),
        "b": torch.randn(2, generator=gen, dtype=torch.float64),
    }
    n_steps = 10
    grads = [
        {n: torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in init.items()}
        for _ in range(n_steps)
    ]
    hp = {"lr": 0.05, "b1": 0.8, "b2": 0.9, "eps": 1e-6, "wd": 0.1, "accum_iter": 3}

    params = {n: p.clone().requires_grad_(True) for n, p in init.items()}
    opt = fn(
        [(p, n) for n, p in params.items()],
        lr=hp["lr"],
        betas=(hp["b1"], hp["b2"]),
        eps=hp["eps"],
        weight_decay=hp["wd"],
        accum_iter=hp["accum_iter"],
    )
    for step_grads in grads:
        for n, p in params.items():
            p.grad = step_grads[n].clone()
        opt.step()

    expected = _reference_accum_adam(init, grads, decoupled=decoupled, **hp)
    for n in init:
        assert_close(params[n].detach(), expected[n], rtol=1e-12, atol=1e-12)
    state = opt.state[params["w"]]
    assert state["step"] == n_steps
    assert state["refreshes"] == n_steps // hp["accum_iter"]


def _train(model: nn.Module, opt: torch.optim.Optimizer, n_steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n_steps):
        x = torch.randn(8, 3, generator=gen, dtype=torch.float64)
        y = torch.randn(8, 2, generator=gen, dtype=torch.float64)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()


@pytest.mark.parametrize(
    ("accum_fn", "torch_fn"),
    [
        (dopt.optim_fn_accum_adam, dopt.optim_fn_adam),
        (dopt.optim_fn_accum_adamw, dopt.optim_fn_adamw),
    ],
)
def test_accum_iter_one_equals_torch(accum_fn, torch_fn) -> None:
    torch.manual_seed(1)
    model_a = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    model_b = copy.deepcopy(model_a)
    hp = {"lr": 0.01, "betas": (0.85, 0.95), "eps": 1e-8, "weight_decay": 0.05}
    opt_a = accum_fn(list(model_a.named_parameters()), accum_iter=1, **hp)
    opt_b = torch_fn(list(model_b.named_parameters()), **hp)
    _train(model_a, opt_a, 10, seed=2)
    _train(model_b, opt_b, 10, seed=2)
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        assert_close(pa, pb, rtol=1e-12, atol=1e-14)


def test_accum_adam_skips_params_without_grad() -> None:
    a = torch.ones(2, 2, requires_grad=True)
    b = torch.ones(2, requires_grad=True)
    opt = dopt.optim_fn_accum_adamw([("a", a), ("b", b)], lr=0.1)
    a.grad = torch.ones(2, 2)
    opt.step()
    assert torch.equal(b.detach(), torch.ones(2))
    assert b not in opt.state
    assert not torch.equal(a.detach(), torch.ones(2, 2))


@pytest.mark.parametrize("fn", [dopt.optim_fn_accum_adam, dopt.optim_fn_accum_adamw])
def test_accum_adam_state_dict_round_trip(fn, tmp_path) -> None:
    torch.manual_seed(3)
    model_a = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    opt_a = fn(list(model_a.named_parameters()), lr=0.02, weight_decay=0.1, accum_iter=3)
    # Five steps leave the accumulator half full, so it must survive the round trip.
    _train(model_a, opt_a, 5, seed=4)

    path = tmp_path / "opt.pt"
    torch.save(opt_a.state_dict(), path)
    loaded = torch.load(path, weights_only=True)

    model_b = copy.deepcopy(model_a)
    opt_b = fn(list(model_b.named_parameters()), lr=0.5, weight_decay=0.0, accum_iter=3)
    opt_b.load_state_dict(loaded)
    assert opt_b.param_groups[0]["lr"] == 0.02
    assert opt_b.param_groups[0]["names"] == opt_a.param_groups[0]["names"]

    _train(model_a, opt_a, 6, seed=5)
    _train(model_b, opt_b, 6, seed=5)
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(pa, pb)


def test_builtin_optimizer_state_dict_weights_only() -> None:
    model = nn.Linear(3, 2).double()
    opt = dopt.optim_fn_sgd(list(model.named_parameters()))
    _train(model, opt, 2, seed=0)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert [g["names"] for g in state["param_groups"]] == [["weight"], ["bias"]]


# --------------------------------------------------------------------------- schedulers


def _lrs_over(opt: torch.optim.Optimizer, sched, n: int) -> list[list[float]]:
    """Learning rates of every group after 0, 1, ..., n scheduler steps."""
    out = [[g["lr"] for g in opt.param_groups]]
    for _ in range(n):
        opt.step()
        sched.step()
        out.append([g["lr"] for g in opt.param_groups])
    return out


def _two_group_sgd() -> torch.optim.SGD:
    a = torch.zeros(2, 2, requires_grad=True)
    b = torch.zeros(2, requires_grad=True)
    return torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.2}], lr=0.1)


def test_cosine_with_warmup_points() -> None:
    opt = _two_group_sgd()
    sched = dopt.lr_scheduler_fn_cosine_with_warmup(
        opt, t_max=10, t_warmup=2, eta_min=0.001, warmup_decay=0.01
    )
    lrs = _lrs_over(opt, sched, 12)
    # Group 0: base 0.1. Warm-up 0.1*0.01 -> 0.1; cosine over 8 steps to 0.001.
    assert lrs[0][0] == pytest.approx(0.001)  # start: 0.1 * 0.01
    assert lrs[1][0] == pytest.approx(0.1 * (0.01 + 0.99 / 2))  # half-way through warm-up
    assert lrs[2][0] == pytest.approx(0.1)  # end of warm-up
    assert lrs[4][0] == pytest.approx(0.001 + 0.099 * (1 + math.sqrt(0.5)) / 2)  # quarter
    assert lrs[6][0] == pytest.approx(0.001 + 0.099 / 2)  # middle of the cosine
    assert lrs[10][0] == pytest.approx(0.001)  # end
    assert lrs[11][0] == pytest.approx(0.001)  # after the end
    assert lrs[12][0] == pytest.approx(0.001)
    # Group 1: base 0.2, same absolute eta_min.
    assert lrs[0][1] == pytest.approx(0.002)
    assert lrs[2][1] == pytest.approx(0.2)
    assert lrs[6][1] == pytest.approx(0.001 + 0.199 / 2)
    assert lrs[10][1] == pytest.approx(0.001)
    assert lrs[12][1] == pytest.approx(0.001)
    # Monotone: up during warm-up, down afterwards.
    col = [row[0] for row in lrs]
    assert all(x < y for x, y in zip(col[:2], col[1:3]))
    assert all(x >= y for x, y in zip(col[2:], col[3:]))


def test_cosine_without_warmup_and_state_dict(tmp_path) -> None:
    opt = _two_group_sgd()
    sched = dopt.lr_scheduler_fn_cosine_with_warmup(opt, t_max=4, t_warmup=0)
    lrs = _lrs_over(opt, sched, 2)
    assert lrs[0][0] == pytest.approx(0.1)
    assert lrs[2][0] == pytest.approx(0.05)

    torch.save(sched.state_dict(), tmp_path / "sched.pt")
    opt2 = _two_group_sgd()
    sched2 = dopt.lr_scheduler_fn_cosine_with_warmup(opt2, t_max=4, t_warmup=0)
    sched2.load_state_dict(torch.load(tmp_path / "sched.pt", weights_only=True))
    opt2.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.1 * (1 + math.cos(math.pi * 3 / 4)) / 2)


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"t_max": 0, "t_warmup": 0}, "t_max"),
        ({"t_max": -5, "t_warmup": 0}, "t_max"),
        ({"t_max": 10, "t_warmup": -1}, "t_warmup"),
        ({"t_max": 10, "t_warmup": 11}, "t_warmup"),
        ({"t_max": 10, "t_warmup": 2, "warmup_decay": 0.0}, "warmup_decay"),
        ({"t_max": 10, "t_warmup": 2, "warmup_decay": 1.5}, "warmup_decay"),
        ({"t_max": 10, "t_warmup": 2, "eta_min": -0.1}, "eta_min"),
    ],
)
def test_cosine_bad_arguments(kwargs, word) -> None:
    with pytest.raises(ValueError, match=word):
        dopt.lr_scheduler_fn_cosine_with_warmup(_two_group_sgd(), **kwargs)


def test_step_and_constant_schedulers() -> None:
    opt = _two_group_sgd()
    sched = dopt.lr_scheduler_fn_step(opt, step_size=3, gamma=0.5)
    col = [row[0] for row in _lrs_over(opt, sched, 6)]
    assert col == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025])

    opt = _two_group_sgd()
    sched = dopt.lr_scheduler_fn_constant(opt)
    assert _lrs_over(opt, sched, 5) == [[0.1, 0.2]] * 6

    with pytest.raises(ValueError, match="step_size"):
        dopt.lr_scheduler_fn_step(_two_group_sgd(), step_size=0)
    with pytest.raises(ValueError, match="gamma"):
        dopt.lr_scheduler_fn_step(_two_group_sgd(), step_size=2, gamma=0.0)


# --------------------------------------------------------------------------- 0.2.x names


@pytest.mark.parametrize(("cls", "decoupled"), [(dopt.AccumAdam, False), (dopt.AccumAdamW, True)])
def test_v02_classes_from_param_groups(cls, decoupled) -> None:
    # decent-dp 0.2.x scripts build these from param groups with lr, betas, eps, weight_decay,
    # accum_iter; the result must equal the factory with the same decay on the same group
    gen = torch.Generator().manual_seed(3)
    init = torch.randn(3, 2, generator=gen, dtype=torch.float64)
    grads = [torch.randn(3, 2, generator=gen, dtype=torch.float64) for _ in range(7)]
    hp = {"lr": 0.05, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.1, "accum_iter": 3}
    p = init.clone().requires_grad_(True)
    q = init.clone().requires_grad_(True)
    opt = cls([{"params": [p], "weight_decay": hp["weight_decay"]}], **hp)
    ref = (dopt.optim_fn_accum_adamw if decoupled else dopt.optim_fn_accum_adam)([(q, "w")], **hp)
    assert opt.defaults["decoupled"] is decoupled
    for g in grads:
        p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    assert torch.equal(p.detach(), q.detach())
    assert type(dopt.optim_fn_accum_adamw([(q, "w")])) is dopt.AccumAdamW


# --------------------------------------------------------------------------- kernels


def test_optimizer_kernels_of_an_optimizer_and_of_buckets() -> None:
    from types import SimpleNamespace

    from decent_dp.ddp import DecentralizedDataParallel

    def sgd() -> torch.optim.SGD:
        return torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1)

    fused, looped = sgd(), sgd()
    assert dopt.prefer_fused_kernels(fused, "cpu") is True
    assert dopt.optimizer_kernels(fused) == {"optimizer": "SGD", "fused": True, "foreach": False}
    accum = dopt.AccumAdam([nn.Parameter(torch.zeros(3))], foreach=False)
    # the wrapper is recognised by its `_buckets` (optim.py does not import ddp.py)
    assert isinstance(DecentralizedDataParallel._buckets, property)
    before_backward = SimpleNamespace(_buckets=None)
    assert dopt.optimizer_kernels(before_backward) == dict.fromkeys(
        ("optimizer", "fused", "foreach")
    )
    wrapper = SimpleNamespace(
        _buckets=[SimpleNamespace(optimizer=o) for o in (fused, accum, looped, None)]
    )
    assert dopt.optimizer_kernels(wrapper) == {
        "optimizer": "AccumAdam,SGD",
        "fused": False,
        "foreach": False,
    }
    both = SimpleNamespace(_buckets=[SimpleNamespace(optimizer=fused)] * 2)
    assert dopt.optimizer_kernels(both) == {"optimizer": "SGD", "fused": True, "foreach": False}
