"""``LaggedVAdamW``: AdamW whose second moment is fed by the previous step's gradient."""

from __future__ import annotations

import io
import math
import re

import pytest
import torch

from decent_dp.optim import LaggedVAdamW, optim_fn_lagged_v_adamw


def _reference(
    p0: torch.Tensor, grads: list[torch.Tensor], lr: float, wd: float, lag_m: bool = False
) -> torch.Tensor:
    """The update rule written out, one scalar coordinate at a time."""
    b1, b2, eps = 0.9, 0.95, 1e-8
    out = p0.clone()
    for idx in range(p0.numel()):
        p, m, v, prev = float(p0.view(-1)[idx]), 0.0, 0.0, None
        for t, g_all in enumerate(grads, 1):
            g = float(g_all.view(-1)[idx])
            s = g if prev is None else prev
            m = b1 * m + (1 - b1) * (s if lag_m else g)
            v = b2 * v + (1 - b2) * s * s
            u = (m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + eps)
            p *= 1 - lr * wd
            p -= lr * max(-5.0, min(5.0, u))
            prev = g
        out.view(-1)[idx] = p
    return out


def test_the_step_follows_the_rule_with_v_one_gradient_late() -> None:
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(3, 2, generator=gen, dtype=torch.float64)
    grads = [torch.randn(3, 2, generator=gen, dtype=torch.float64) * (i + 1) for i in range(5)]
    p = torch.nn.Parameter(p0.clone())
    opt = LaggedVAdamW([p], lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    torch.testing.assert_close(p.detach(), _reference(p0, grads, 0.01, 0.1), rtol=1e-12, atol=0)
    assert torch.equal(opt.state[p]["grad_prev"], grads[-1])
    # v holds the squares of gradients 1, 1, 2, 3, 4: the last one is not in it yet
    v = torch.zeros_like(p0)
    for s in [grads[0], *grads[:-1]]:
        v = 0.95 * v + 0.05 * s * s
    torch.testing.assert_close(opt.state[p]["exp_avg_sq"], v, rtol=1e-12, atol=0)


def test_lag_m_follows_the_rule_with_both_moments_one_gradient_late() -> None:
    gen = torch.Generator().manual_seed(1)
    p0 = torch.randn(4, generator=gen, dtype=torch.float64)
    grads = [torch.randn(4, generator=gen, dtype=torch.float64) for _ in range(6)]
    p = torch.nn.Parameter(p0.clone())
    opt = LaggedVAdamW([p], lr=0.02, betas=(0.9, 0.95), weight_decay=0.1, lag_m=True)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want = _reference(p0, grads, 0.02, 0.1, lag_m=True)
    torch.testing.assert_close(p.detach(), want, rtol=1e-12, atol=0)
    assert not torch.allclose(want, _reference(p0, grads, 0.02, 0.1))


def test_lag_m_is_torch_adamw_fed_the_gradients_one_step_late() -> None:
    """From the second step on: torch's AdamW given g1, g1, g2, ... lands on the same weights."""
    gen = torch.Generator().manual_seed(2)
    p0 = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    grads = [torch.randn(3, 3, generator=gen, dtype=torch.float64) for _ in range(5)]
    lagged = torch.nn.Parameter(p0.clone())
    plain = torch.nn.Parameter(p0.clone())
    opt = LaggedVAdamW([lagged], lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, lag_m=True)
    ref = torch.optim.AdamW([plain], lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    for g, late in zip(grads, [grads[0], *grads[:-1]], strict=True):
        lagged.grad, plain.grad = g.clone(), late.clone()
        opt.step()
        ref.step()
    torch.testing.assert_close(lagged.detach(), plain.detach(), rtol=1e-10, atol=1e-12)


def test_a_mixed_grad_prev_is_what_feeds_v() -> None:
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    opt = LaggedVAdamW([p], lr=0.1, betas=(0.0, 0.5), weight_decay=0.0)
    p.grad = torch.ones(4, dtype=torch.float64)
    opt.step()
    opt.state[p]["grad_prev"].fill_(3.0)  # as state_sync leaves it after a mix
    opt.step()
    # v = 0.5 * (0.5 * 1) + 0.5 * 9
    torch.testing.assert_close(
        opt.state[p]["exp_avg_sq"], torch.full((4,), 4.75, dtype=torch.float64)
    )


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_gradient_that_appears_after_zeros_steps_by_at_most_clip(sign: float) -> None:
    # both bounds of the clip: a large negative gradient moves the parameter up by lr * clip
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = LaggedVAdamW([p], lr=0.1, weight_decay=0.0, clip=2.0)
    p.grad = torch.tensor([1.0, 0.0], dtype=torch.float64)
    opt.step()
    p.grad = torch.tensor([1.0, sign * 50.0], dtype=torch.float64)  # v of the second is still 0
    before = p.detach().clone()
    opt.step()
    assert (before - p.detach())[1].item() == pytest.approx(sign * 0.2)


def test_the_factory_decays_weights_only_and_the_state_loads_weights_only() -> None:
    model = torch.nn.Linear(3, 2)
    opt = optim_fn_lagged_v_adamw([(p, n) for n, p in model.named_parameters()], lr=0.01)
    assert isinstance(opt, LaggedVAdamW)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    again = optim_fn_lagged_v_adamw(list(model.named_parameters()), lr=0.01)
    again.load_state_dict(torch.load(buf, weights_only=True))
    assert again.state_dict()["state"][0]["step"] == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"lr": -1.0}, "lr must be >= 0"), ({"betas": (0.9, 1.0)}, "betas[1] must be in [0, 1)"),
     ({"eps": 0.0}, "eps must be > 0"), ({"weight_decay": -0.1}, "weight_decay must be >= 0"),
     ({"clip": 0.0}, "clip must be > 0"), ({"lag_m": 1}, "lag_m must be True or False")],
)  # fmt: skip
def test_bad_hyper_parameters_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        LaggedVAdamW([torch.nn.Parameter(torch.zeros(2))], **kwargs)


def test_the_defaults_are_the_documented_ones() -> None:
    # docs/library.md: lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, clip=5.0
    opt = LaggedVAdamW([torch.nn.Parameter(torch.zeros(2))])
    got = {k: opt.defaults[k] for k in ("lr", "betas", "eps", "weight_decay", "clip", "lag_m")}
    assert got == {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.01,
        "clip": 5.0,
        "lag_m": False,
    }


def test_a_weight_decay_of_one_decays() -> None:
    # a zero gradient moves nothing: what is left is the decay, p * (1 - lr * wd)
    p = torch.nn.Parameter(torch.full((3,), 2.0, dtype=torch.float64))
    opt = LaggedVAdamW([p], lr=0.1, weight_decay=1.0)
    p.grad = torch.zeros(3, dtype=torch.float64)
    opt.step()
    torch.testing.assert_close(p.detach(), torch.full((3,), 1.8, dtype=torch.float64))


def test_a_group_saved_before_lag_m_steps_without_it() -> None:
    def run(drop_key: bool) -> torch.Tensor:
        p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        opt = LaggedVAdamW([p], lr=0.1, weight_decay=0.0)
        if drop_key:
            del opt.param_groups[0]["lag_m"]  # as a state saved before the option loads
        for g in ([1.0, -2.0], [3.0, 0.5], [-1.0, 1.0]):
            p.grad = torch.tensor(g, dtype=torch.float64)
            opt.step()
        return p.detach().clone()

    assert torch.equal(run(drop_key=True), run(drop_key=False))
