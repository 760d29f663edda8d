"""AccumAdam(W)'s multi-tensor step against the per-parameter formulas (no process group)."""

from __future__ import annotations

import pytest
import torch

from decent_dp.optim import AccumAdam, AccumAdamW

STATE_KEYS = {"step", "refreshes", "exp_avg", "exp_avg_sq", "grad_accum"}


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype == torch.float64
    err = (actual - expected).abs().max().item() if actual.numel() else 0.0
    assert err <= 1e-9, f"max abs error {err:.3g} > 1e-9"


class _Reference:
    """The class docstring's formulas for one parameter, written out literally in float64."""

    def __init__(self, p: torch.Tensor) -> None:
        self.p = p.detach().clone()
        self.m = torch.zeros_like(self.p)
        self.v = torch.zeros_like(self.p)
        self.acc = torch.zeros_like(self.p)
        self.k = 0
        self.t = 0

    def step(self, g: torch.Tensor, hp: dict) -> None:
        lr, (b1, b2), eps, wd = hp["lr"], hp["betas"], hp["eps"], hp["weight_decay"]
        if not hp["decoupled"]:
            g = g + wd * self.p
        self.acc = self.acc + g
        self.t += 1
        m_hat = (b1 * self.m + (1 - b1) * g) / (1 - b1 ** (self.k + 1))
        v_hat = (b2 * self.v + (1 - b2) * g * g) / (1 - b2 ** (self.k + 1))
        if hp["decoupled"]:
            self.p = self.p * (1 - lr * wd)
        self.p = self.p - lr * m_hat / (torch.sqrt(v_hat) + eps)
        if self.t % hp["accum_iter"] == 0:
            gbar = self.acc / hp["accum_iter"]
            self.m = b1 * self.m + (1 - b1) * gbar
            self.v = b2 * self.v + (1 - b2) * gbar * gbar
            self.k += 1
            self.acc = torch.zeros_like(self.p)


def _groups(gen: torch.Generator, decoupled: bool, device: str) -> list[dict]:
    """Three groups with their own hyper-parameters; shapes of a small conv net and an LM."""
    shapes = [[(4, 3, 3, 3), (4,), (8, 4)], [(8,), (5, 8), (5,)], [(16, 6), ()]]
    hps = [
        {"lr": 0.05, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.1, "accum_iter": 3},
        {"lr": 0.01, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.0, "accum_iter": 3},
        {"lr": 0.02, "betas": (0.5, 0.95), "eps": 1e-7, "weight_decay": 0.3, "accum_iter": 4},
    ]
    return [
        {
            "params": [
                torch.randn(s, generator=gen, dtype=torch.float64).to(device).requires_grad_(True)
                for s in group_shapes
            ],
            **hp,
            "decoupled": decoupled,
        }
        for group_shapes, hp in zip(shapes, hps)
    ]


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("cls", [AccumAdam, AccumAdamW])
def test_step_matches_per_parameter_reference(cls, foreach, device="cpu") -> None:
    """Many steps over several groups; some parameters skip steps, so their counts drift apart."""
    decoupled = cls is AccumAdamW
    gen = torch.Generator().manual_seed(3)
    groups = _groups(gen, decoupled, device)
    refs = [[_Reference(p) for p in g["params"]] for g in groups]
    opt = cls(
        [{k: v for k, v in g.items() if k != "decoupled"} for g in groups],
        decoupled=decoupled,
        foreach=foreach,
    )
    assert opt.param_groups[0]["decoupled"] is decoupled
    assert "foreach" not in opt.param_groups[0]  # the state dict keeps its format

    n_steps = 25
    for t in range(n_steps):
        for gi, group in enumerate(opt.param_groups):
            for pi, p in enumerate(group["params"]):
                # parameter pi of each group has no gradient on every (pi + 2)-th step
                if pi > 0 and t % (pi + 2) == 1:
                    p.grad = None
                    continue
                g = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(device)
                p.grad = g.clone()
                refs[gi][pi].step(g, groups[gi])
        opt.step()

    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group["params"]):
            ref = refs[gi][pi]
            _assert_close(p.detach(), ref.p)
            state = opt.state[p]
            assert set(state) == STATE_KEYS
            assert (state["step"], state["refreshes"]) == (ref.t, ref.k)
            assert isinstance(state["step"], int) and isinstance(state["refreshes"], int)
            _assert_close(state["exp_avg"], ref.m)
            _assert_close(state["exp_avg_sq"], ref.v)
            _assert_close(state["grad_accum"], ref.acc)
    # the skipping pattern must have produced parameters at different refresh counts
    assert len({opt.state[p]["refreshes"] for p in opt.param_groups[0]["params"]}) > 1


@pytest.mark.parametrize("foreach", [True, False])
def test_batched_step_equals_one_optimizer_per_parameter(foreach) -> None:
    """Batching is bit for bit invisible, also across dtypes and memory formats in one group."""
    gen = torch.Generator().manual_seed(5)
    tensors = [
        torch.randn(2, 3, 4, 4, generator=gen).to(memory_format=torch.channels_last),
        torch.randn(7, generator=gen, dtype=torch.float64),
        torch.randn(3, 5, generator=gen),
        torch.randn(3, 5, generator=gen, dtype=torch.float64).t(),  # not contiguous
    ]
    together = [t.clone().requires_grad_(True) for t in tensors]
    alone = [t.clone().requires_grad_(True) for t in tensors]
    hp = {"lr": 0.03, "betas": (0.7, 0.9), "weight_decay": 0.05, "accum_iter": 2}
    opt = AccumAdamW(together, **hp, foreach=foreach)
    opts = [AccumAdamW([p], **hp, foreach=False) for p in alone]
    for _ in range(7):
        grads = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in tensors]
        for a, b, g in zip(together, alone, grads):
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        for o in opts:
            o.step()
    for a, b, o in zip(together, alone, opts):
        assert torch.equal(a, b)
        for key in ("exp_avg", "exp_avg_sq", "grad_accum"):
            assert torch.equal(opt.state[a][key], o.state[b][key])


def test_maximize_group_and_sparse_grad_refused_before_any_change() -> None:
    a = torch.ones(3, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    opt = AccumAdam([{"params": [a]}, {"params": [b]}], lr=0.1)
    opt.param_groups[1]["maximize"] = True
    a.grad, b.grad = torch.ones(3), torch.ones(3)
    with pytest.raises(ValueError, match="maximize must be False"):
        opt.step()
    opt.param_groups[1]["maximize"] = False
    b.grad = torch.ones(3).to_sparse()
    before = a.detach().clone()
    with pytest.raises(RuntimeError, match="sparse"):
        AccumAdam([a, b], lr=0.1).step()
    assert torch.equal(a.detach(), before)


def test_default_is_per_tensor_on_cpu_and_survives_pickling() -> None:
    import copy

    opt = AccumAdamW([torch.zeros(2, requires_grad=True)])
    assert opt.foreach is None
    assert not opt._use_foreach(torch.device("cpu"))
    assert opt._use_foreach(torch.device("cuda"))
    opt.foreach = True
    assert copy.deepcopy(opt).foreach is True


@pytest.mark.gpu
@pytest.mark.parametrize("cls", [AccumAdam, AccumAdamW])
def test_cuda_default_is_foreach_and_matches_reference(cls) -> None:
    p = torch.zeros(2, device="cuda", requires_grad=True)
    assert cls([p])._use_foreach(p.device)
    for foreach in (None, False):
        test_step_matches_per_parameter_reference(cls, foreach, device="cuda")
