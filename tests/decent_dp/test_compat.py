"""decent-dp 0.2.x code runs here unchanged: its script style, pair order, methods and hooks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp.topo import mixing_matrices
from tests.support.ddp_cases import flat, make_model, replay, train_steps, train_worker, wrap
from tests.support.dist_harness import free_port, ok_values, run_distributed

ROOT = Path(__file__).resolve().parents[2]


def test_legacy_script_runs_unchanged_under_torchrun() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        str(ROOT / "tests" / "decent_dp" / "legacy_02x_script.py"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line[len("RESULT ") :])
    assert r["world_size"] == 2
    assert r["last_loss"] < r["first_loss"]
    # cosine with warm-up at the end of its 30 steps: down to a small fraction of lr0
    assert 0.0 <= r["lr"] < 0.01 * 0.05
    assert r["d2c"] > 0 and r["restored"] and r["averages_agree"]
    assert "bn.running_mean" in r["keys"] and not any(k.startswith("module.") for k in r["keys"])


# ------------------------------------------------------------------ pair order
def _sgd_legacy(pairs: list[Any]) -> torch.optim.Optimizer:
    """Written for 0.2.x: unpacks (name, tensor)."""
    decay = [v for n, v in pairs if "bias" not in n]
    rest = [v for n, v in pairs if "bias" in n]
    return torch.optim.SGD(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest}], lr=0.05, momentum=0.9
    )


def _sgd_current(pairs: list[Any]) -> torch.optim.Optimizer:
    """The same optimizer written for (tensor, name)."""
    decay = [p for p, n in pairs if "bias" not in n]
    rest = [p for p, n in pairs if "bias" in n]
    return torch.optim.SGD(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest}], lr=0.05, momentum=0.9
    )


def order_worker(rank: int, world: int, which: str) -> torch.Tensor:
    fn = _sgd_legacy if which == "legacy" else _sgd_current
    model = make_model("mlp", seed=rank)
    ddp = DecentralizedDataParallel(model, fn, topology="ring", bucket_size_in_mb=0)
    train_steps(ddp, rank, {"topology": "ring"}, 1, 4)
    return flat(ddp.module)


def test_optim_fn_in_either_pair_order_trains_identically() -> None:
    legacy = ok_values(run_distributed(order_worker, 2, "legacy"))
    current = ok_values(run_distributed(order_worker, 2, "current"))
    for a, b in zip(legacy, current):
        assert torch.equal(a, b)
    assert not torch.equal(legacy[0], flat(make_model("mlp", 0)))


def _raises_always(pairs: list[Any]) -> torch.optim.Optimizer:
    raise KeyError("boom")


def _drops_one(pairs: list[Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD([pairs[0][0]], lr=0.1)


def bad_order_worker(rank: int, world: int, which: str) -> str:
    fn = {"raises": _raises_always, "drops": _drops_one}[which]
    try:
        DecentralizedDataParallel(make_model("mlp", 0), fn, topology="complete")
    except ValueError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize(
    "which, detail", [("raises", "KeyError: 'boom'"), ("drops", "misses 5 of them")]
)
def test_optim_fn_fitting_neither_order_names_both(which: str, detail: str) -> None:
    (msg,) = ok_values(run_distributed(bad_order_worker, 1, which))
    assert "(tensor, name)" in msg and "(name, tensor)" in msg and detail in msg
    assert "\n" not in msg


# ------------------------------------------------------------- adaptive factor
@pytest.mark.parametrize("alpha", [0.5, 1.0])
@pytest.mark.parametrize("topology", ["ring", "one-peer-exp"])
def test_adaptive_factor_matches_replay(topology: str, alpha: float) -> None:
    cfg = {"topology": topology, "steps": 5, "alpha": alpha}
    values = ok_values(run_distributed(train_worker, 4, cfg))
    for got, exp in zip(values, replay(cfg, 4)):
        assert_close(got["params"], exp, rtol=0, atol=1e-9)


def alpha_error_worker(rank: int, world: int) -> str:
    ddp = wrap(make_model("mlp", 0), {"topology": "complete"})
    try:
        ddp.set_adaptive_factor(1.5)
    except ValueError as exc:
        return str(exc)
    return ""


def test_adaptive_factor_outside_unit_interval_is_rejected() -> None:
    (msg,) = ok_values(run_distributed(alpha_error_worker, 1))
    assert "1.5" in msg and "[0, 1]" in msg


# ------------------------------------------------------------ optimizer hooks
class RecordingSGD(torch.optim.SGD):
    """Records what the wrapper tells it around each mix."""

    def __init__(self, params: Any, **kw: Any) -> None:
        super().__init__(params, **kw)
        self.calls: list[tuple[str, Any, Any]] = []
        self._x: torch.Tensor | None = None

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for g in self.param_groups for p in g["params"]])

    def pre_average_hook(self, edge: Any, weight: float) -> None:
        self._x = self._flat().clone()
        self.calls.append(("pre", tuple(edge.ranks), weight))

    def step(self, closure: Any = None) -> Any:
        assert self._x is not None and torch.equal(self._flat(), self._x)  # still x(t-1)
        return super().step(closure)

    def post_average_hook(self) -> None:
        self.calls.append(("post", None, None))


def hooks_worker(rank: int, world: int) -> list[list[Any]]:
    model = make_model("mlp", seed=rank)
    ddp = DecentralizedDataParallel(
        model,
        lambda pairs: RecordingSGD([p for p, _ in pairs], lr=0.05),
        topology="one-peer-exp",
        bucket_size_in_mb=0,
    )
    train_steps(ddp, rank, {"topology": "one-peer-exp"}, 1, 4)
    return [list(map(list, b.optimizer.calls)) for b in ddp._buckets]


def test_pre_and_post_average_hooks_follow_the_topology() -> None:
    values = ok_values(run_distributed(hooks_worker, 4))
    mats = mixing_matrices("one-peer-exp", 4)
    for rank, buckets in enumerate(values):
        for calls in buckets:
            assert [c[0] for c in calls] == ["pre", "post"] * 4
            pres = [c for c in calls if c[0] == "pre"]
            assert list(pres[0][1]) == [rank] and pres[0][2] == 1.0  # step 1: all start equal
            for t, (_, ranks, weight) in enumerate(pres[1:], start=2):
                w = mats[(t - 1) % len(mats)][rank]
                assert sorted(ranks) == [j for j in range(4) if w[j] > 0]
                assert weight == pytest.approx(float(w[rank]))


# ------------------------------------------------- global average and revert
def revert_worker(rank: int, world: int, mode: str) -> dict[str, Any]:
    cfg = {"topology": "ring", "steps": 6}
    ddp = wrap(make_model("mlp", seed=rank), cfg)
    train_steps(ddp, rank, cfg, 1, 3)
    out: dict[str, Any] = {"lr": ddp.get_lr() == ddp.current_lr()}
    if mode == "revert":
        before = flat(ddp.module)
        d2c = ddp.global_avg(will_revert=True, return_d2c=True)
        mean = flat(ddp.module)
        out["d2c"], out["before"], out["mean"] = d2c, before, mean
        ddp.revert_global_avg()
        out["restored"] = torch.equal(flat(ddp.module), before)
    train_steps(ddp, rank, cfg, 4, 6)
    out["params"] = flat(ddp.module)
    return out


def test_global_avg_returns_distance_to_centre_and_reverts_exactly() -> None:
    plain = ok_values(run_distributed(revert_worker, 4, "plain"))
    reverted = ok_values(run_distributed(revert_worker, 4, "revert"))
    centre = torch.stack([v["before"] for v in reverted]).mean(0)
    for p, r in zip(plain, reverted):
        assert r["lr"] and r["restored"]
        assert_close(r["mean"], centre, rtol=0, atol=1e-12)
        assert r["d2c"] == pytest.approx(float((r["before"] - centre).norm()), rel=1e-9)
        # the gossip set aside is restored: training continues exactly as without the average
        assert torch.equal(p["params"], r["params"])


def revert_without_avg_worker(rank: int, world: int) -> str:
    ddp = wrap(make_model("mlp", 0), {"topology": "complete"})
    ddp.global_avg(will_revert=False)
    try:
        ddp.revert_global_avg()
    except RuntimeError as exc:
        return str(exc)
    return ""


def test_revert_without_a_saved_average_is_an_error() -> None:
    (msg,) = ok_values(run_distributed(revert_without_avg_worker, 1))
    assert "will_revert=True" in msg


def test_the_legacy_names_import() -> None:
    from decent_dp.ddp import LR_SCHEDULER_FN_TYPE, OPTIM_FN_TYPE
    from decent_dp.optim import AccumAdam, AccumAdamW

    assert OPTIM_FN_TYPE is not None and LR_SCHEDULER_FN_TYPE is not None
    p = torch.nn.Parameter(torch.ones(2))
    opt = AccumAdamW(
        [{"params": [p]}], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, accum_iter=2
    )
    assert isinstance(opt, AccumAdam)
    assert math.isclose(opt.param_groups[0]["weight_decay"], 0.1)
