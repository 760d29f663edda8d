"""Wrapper features beyond the plain recursion: loss scaling, evaluation swaps, buffers, layouts, bad input."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from tests.support.ddp_cases import flat, loss_of, make_model, replay, train_steps, wrap
from tests.support.dist_harness import ok_values, run_distributed


def scaler_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    ddp = wrap(make_model("mlp", seed=rank), cfg, scaler=scaler)
    train_steps(ddp, rank, cfg, 1, cfg["steps"], scaler=scaler)
    return {"params": flat(ddp.module), "scale": scaler.get_scale()}


def test_grad_scaler_inf_on_one_worker_skips_every_worker() -> None:
    cfg = {"topology": "ring", "steps": 5, "inf_at": (3, 1)}
    values = ok_values(run_distributed(scaler_worker, 4, cfg))
    expected = replay(cfg, 4)
    for got, exp in zip(values, expected):
        assert_close(got["params"], exp, rtol=0, atol=1e-9)
        assert got["scale"] == 2.0**15  # backed off once, on every worker alike


def averaged_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    ddp = wrap(make_model("mlp", seed=rank), cfg)
    train_steps(ddp, rank, cfg, 1, cfg["steps"])
    own = flat(ddp.module)
    with ddp.averaged() as module:
        inside = flat(module)
    after = flat(ddp.module)
    train_steps(ddp, rank, {**cfg}, cfg["steps"] + 1, cfg["steps"] + 2)
    return {"own": own, "inside": inside, "after": after, "continued": flat(ddp.module)}


def test_averaged_swaps_in_the_mean_and_restores() -> None:
    cfg = {"topology": "ring", "steps": 4}
    values = ok_values(run_distributed(averaged_worker, 4, cfg))
    expected = replay(cfg, 4)
    mean = torch.stack(expected).mean(0)
    longer = replay({**cfg, "steps": 6}, 4)
    for v, exp, cont in zip(values, expected, longer):
        assert_close(v["own"], exp, rtol=0, atol=1e-9)
        assert_close(v["inside"], mean, rtol=0, atol=1e-9)
        assert torch.equal(v["after"], v["own"])
        # evaluating in the middle must not disturb the recursion
        assert_close(v["continued"], cont, rtol=0, atol=1e-9)


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.lin(x)))


def buffers_worker(rank: int, world: int, sync: bool) -> dict[str, Any]:
    torch.manual_seed(rank)
    model = BNNet().double()
    ddp = DecentralizedDataParallel(
        model,
        optim_fn=lambda pairs: torch.optim.SGD([p for p, _ in pairs], lr=0.1),
        topology="ring",
        sync_buffer_in_global_avg=sync,
    )
    for t in range(3):
        g = torch.Generator().manual_seed(rank * 100 + t)
        x = torch.randn(16, 4, generator=g, dtype=torch.float64) + rank
        ddp(x).pow(2).mean().backward()
    ddp.global_avg()
    after_avg = flat(ddp.module)
    mean_buf = ddp.module.bn.running_mean.clone()
    x = torch.randn(16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(999))
    ddp(x).pow(2).mean().backward()
    return {"params": after_avg, "running_mean": mean_buf, "next": flat(ddp.module)}


@pytest.mark.parametrize("sync", [True, False])
def test_global_avg_parameters_and_buffers(sync: bool) -> None:
    values = ok_values(run_distributed(buffers_worker, 2, sync))
    assert torch.equal(values[0]["params"], values[1]["params"])
    same_buffers = torch.equal(values[0]["running_mean"], values[1]["running_mean"])
    assert same_buffers is sync
    # with identical data on the next step (same seed), identical workers stay identical
    assert_close(values[0]["next"], values[1]["next"], rtol=0, atol=1e-12)


def channels_last_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    ddp = wrap(make_model("conv", seed=rank), cfg)
    train_steps(ddp, rank, cfg, 1, cfg["steps"])
    w = ddp.module.conv.weight
    params = flat(ddp.module)
    with ddp.no_sync():  # gradients are dropped after each step; accumulate one to look at it
        loss_of(ddp, rank, cfg["steps"] + 1, kind="conv").backward()
    return {
        "params": params,
        "channels_last": w.is_contiguous(memory_format=torch.channels_last)
        and not w.is_contiguous(),
        "grad_channels_last": w.grad is not None and w.grad.stride() == w.stride(),
    }


def test_channels_last_parameters_keep_their_layout() -> None:
    cfg = {"topology": "one-peer-exp", "steps": 4, "kind": "conv", "bucket_mb": 25}
    values = ok_values(run_distributed(channels_last_worker, 2, cfg))
    for v, exp in zip(values, replay(cfg, 2)):
        assert v["channels_last"] and v["grad_channels_last"]
        assert_close(v["params"], exp, rtol=0, atol=1e-9)


def _sgd(pairs):
    return torch.optim.SGD([p for p, _ in pairs], lr=0.1)


def _error(fn) -> tuple[str, str]:
    try:
        fn()
    except Exception as exc:  # the test compares the type and message
        return type(exc).__name__, str(exc)
    return "no error", ""


def bad_input_worker(rank: int, world: int) -> dict[str, tuple[str, str]]:
    make = functools.partial(nn.Linear, 3, 2)
    out = {
        "unknown_topology": _error(
            lambda: DecentralizedDataParallel(make(), _sgd, topology="hypercube")
        ),
        "does_not_fit": _error(
            lambda: DecentralizedDataParallel(make(), _sgd, topology="one-peer-exp")
        ),
        "bad_optim": _error(
            lambda: DecentralizedDataParallel(make(), lambda pairs: "sgd", topology="ring")
        ),
        "bad_sched": _error(
            lambda: DecentralizedDataParallel(make(), _sgd, lambda o: 1, topology="ring")
        ),
        "negative_bucket": _error(
            lambda: DecentralizedDataParallel(make(), _sgd, topology="ring", bucket_size_in_mb=-1)
        ),
        "shape_mismatch": _error(
            lambda: DecentralizedDataParallel(nn.Linear(3, 2 + (rank == 1)), _sgd, topology="ring")
        ),
    }
    # the group is still usable after every rejection
    t = torch.ones(1)
    dist.all_reduce(t)
    out["alive"] = ("ok", str(int(t.item())))
    return out


def test_bad_input_fails_on_every_rank_without_hanging() -> None:
    values = ok_values(run_distributed(bad_input_worker, 3, timeout=90))
    for v in values:
        assert v["unknown_topology"][0] == "ValueError"
        assert (
            "hypercube" in v["unknown_topology"][1] and "one-peer-exp" in v["unknown_topology"][1]
        )
        assert v["does_not_fit"][0] == "ValueError" and "n=3" in v["does_not_fit"][1]
        assert "ring" in v["does_not_fit"][1]
        assert v["bad_optim"][0] == "TypeError" and "str" in v["bad_optim"][1]
        assert v["bad_sched"][0] == "TypeError" and "int" in v["bad_sched"][1]
        assert v["negative_bucket"][0] == "ValueError" and "-1" in v["negative_bucket"][1]
        assert (
            v["shape_mismatch"][0] == "ValueError"
            and "differ across ranks" in v["shape_mismatch"][1]
        )
        assert v["alive"] == ("ok", "3")
        for _kind, msg in v.values():
            assert "\n" not in msg, msg


def test_uninitialized_process_group_is_a_clear_error() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="torchrun"):
        DecentralizedDataParallel(nn.Linear(2, 2), _sgd)


def test_state_dict_has_the_modules_own_keys() -> None:
    values = ok_values(run_distributed(state_dict_worker, 2))
    assert values[0]["keys"] == ["weight", "bias"]
    assert values[0]["loaded"]
    # casting after the buckets exist would silently detach the parameters from them
    assert values[0]["moved"][0] == "RuntimeError" and "before wrapping" in values[0]["moved"][1]
    assert values[0]["still_float"]


def state_dict_worker(rank: int, world: int) -> dict[str, Any]:
    ddp = DecentralizedDataParallel(nn.Linear(3, 2), _sgd, topology="ring")
    ddp(torch.randn(4, 3)).sum().backward()
    sd = ddp.state_dict()
    plain = nn.Linear(3, 2)
    plain.load_state_dict(sd)
    moved = _error(lambda: ddp.double())
    return {
        "keys": list(sd),
        "loaded": torch.equal(plain.weight, ddp.module.weight),
        "moved": moved,
        "still_float": ddp.module.weight.dtype == torch.float32,
    }
