"""The outer optimizer (DiLoCo, SlowMo) on real gloo groups against a float64 replay.

The replay is the recursion the wrapper documents: at steps ``t`` with
``t % H == 0`` the exact average ``xbar(t-1)`` gives the outer gradient
``x_outer - xbar(t-1)``, the outer optimizer steps ``x_outer``, and every
worker continues from ``x(t) = x(t-1) + a (x_outer - x(t-1)) + d(t)``;
at the other steps the topology mixes as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp.topo import LocalSGDTopology
from tests.support.ddp_cases import (
    assert_same_runs,
    flat,
    loss_of,
    make_model,
    make_optim,
    make_sched,
    replay_workers,
    resume_worker,
    set_flat,
    topology_of,
    train_steps,
)
from tests.support.dist_harness import ok_values, run_distributed

ATOL = 1e-9
NESTEROV = {"outer": "sgd", "outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}


def outer_fn(cfg: dict[str, Any]) -> Any:
    if cfg.get("outer") == "adam":
        return partial(torch.optim.Adam, lr=cfg.get("outer_lr", 0.1))
    return partial(
        torch.optim.SGD,
        lr=cfg.get("outer_lr", 0.7),
        momentum=cfg.get("outer_momentum", 0.9),
        nesterov=cfg.get("nesterov", True),
    )


def topology(cfg: dict[str, Any], world: int) -> Any:
    if cfg["topology"] == "local-sgd":
        return LocalSGDTopology(world, world, period=cfg["period"])
    return cfg["topology"]


def wrap_outer(model: torch.nn.Module, cfg: dict[str, Any], scaler: Any = None) -> Any:
    world = dist.get_world_size()
    return DecentralizedDataParallel(
        model,
        optim_fn=make_optim(cfg),
        lr_scheduler_fn=make_sched(cfg),
        topology=topology(cfg, world) if cfg["topology"] == "local-sgd" else topology_of(cfg),
        scaler=scaler,
        param_as_bucket_view=cfg.get("view", True),
        bucket_size_in_mb=cfg.get("bucket_mb", 0),
        stable_param_storage=cfg.get("stable", False),
        outer_optim_fn=outer_fn(cfg) if cfg.get("every") else None,
        outer_every=cfg.get("every"),
        outer_fragments=cfg.get("fragments", 1),
        outer_compression=cfg.get("outer_compression"),
        outer_scale_by_inner_lr=cfg.get("scaled", False),
    )


def outer_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16) if cfg.get("scaler") else None
    ddp = wrap_outer(make_model("mlp", seed=rank), cfg, scaler)
    if cfg.get("alpha") is not None:
        ddp.set_adaptive_factor(cfg["alpha"])
    train_steps(ddp, rank, cfg, 1, cfg["steps"], scaler=scaler)
    out = {"params": flat(ddp.module), "step": ddp.step_count}
    norm = ddp.outer_delta_norm()
    out["delta_norm"] = -1.0 if norm is None else norm
    out["consensus"] = ddp.consensus_distance()
    ddp.close()
    return out


def replay_outer(cfg: dict[str, Any], world: int) -> tuple[list[torch.Tensor], float]:
    """Single-process float64 replay; returns the workers' models and the last ``||Delta||``."""
    mats, start, models, optims = replay_workers(topology(cfg, world), world, cfg)
    make = make_sched(cfg)
    scheds = [make(o) if make else None for o in optims]
    x_outer = flat(start)
    every = cfg.get("every")
    outer_opt = outer_fn(cfg)([x_outer]) if every else None
    alpha, delta_norm = cfg.get("alpha", 1.0), -1.0
    slow_u = torch.zeros_like(x_outer)  # SlowMo's momentum, written out for "scaled"
    for t in range(1, cfg["steps"] + 1):
        old = [flat(m) for m in models]
        gamma = float(optims[0].param_groups[0]["lr"])  # the inner lr of step t
        skip = cfg.get("inf_at", (None,))[0] == t  # an inf anywhere skips every worker's update
        for i, (m, opt) in enumerate(zip(models, optims)):
            opt.zero_grad(set_to_none=True)
            for micro in range(1, cfg.get("accum", 1)):
                loss_of(m, i, t, micro).backward()
            loss_of(m, i, t, 0).backward()
            if not skip:
                opt.step()
                if scheds[i] is not None:
                    scheds[i].step()
        new = [flat(m) for m in models]
        stacked = torch.stack(old)
        if every and t % every == 0:
            assert outer_opt is not None
            delta = x_outer - stacked.mean(0)
            delta_norm = float(delta.norm())
            if cfg.get("scaled"):  # Wang et al. 2020, Algorithm 1 (no Nesterov)
                assert not cfg.get("nesterov")
                slow_u = cfg["outer_momentum"] * slow_u + delta / gamma
                x_outer = x_outer - cfg["outer_lr"] * gamma * slow_u
            else:
                x_outer.grad = delta
                outer_opt.step()
            mixed = [x_outer.clone() for _ in range(world)]
        else:
            w = mats[(t - 1) % len(mats)]
            mixed = [(w[i].unsqueeze(1) * stacked).sum(0) for i in range(world)]
        for i, m in enumerate(models):
            set_flat(m, old[i] + alpha * (mixed[i] - old[i]) + (new[i] - old[i]))
        if cfg.get("global_avg_at") == t:
            mean = torch.stack([flat(m) for m in models]).mean(0)
            for m in models:
                set_flat(m, mean)
    return [flat(m) for m in models], delta_norm


def check(cfg: dict[str, Any], world: int = 4) -> list[dict[str, Any]]:
    values = ok_values(run_distributed(outer_worker, world, cfg))
    expected, delta_norm = replay_outer(cfg, world)
    for rank, (got, exp) in enumerate(zip(values, expected)):
        assert got["step"] == cfg["steps"]
        assert_close(got["params"], exp, rtol=0, atol=ATOL, msg=lambda m, r=rank: f"rank {r}: {m}")
        assert got["delta_norm"] == pytest.approx(delta_norm, rel=1e-9)
    return values


LOCAL_SGD = {"topology": "local-sgd", "period": 3, "every": 3, "steps": 8, **NESTEROV}
RING = {"topology": "ring", "every": 4, "steps": 9, **NESTEROV}


@pytest.mark.parametrize(
    "cfg",
    [
        pytest.param(LOCAL_SGD, id="local-sgd-H3-swap"),
        pytest.param(
            {**LOCAL_SGD, "optim": "sgd_wd", "sched": True}, id="local-sgd-H3-coupled-decay"
        ),
        pytest.param(
            {**LOCAL_SGD, "optim": "subclass_wd"},
            id="local-sgd-H3-in-place",
            marks=pytest.mark.slow,
        ),
        pytest.param({**RING, "optim": "adamw", "sched": True}, id="ring-every4-decoupled-decay"),
        pytest.param({**RING, "optim": "subclass_wd"}, id="ring-every4-in-place"),
        pytest.param(
            {**RING, "stable": True, "outer": "adam"},
            id="ring-every4-stable-adam-outer",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_outer_step_matches_replay(cfg: dict[str, Any]) -> None:
    values = check(cfg)
    if cfg["steps"] % cfg["every"] != 0:  # the workers drift apart again after an outer step
        assert (values[0]["params"] - values[1]["params"]).abs().max() > 1e-6


SLOWMO = {"outer": "sgd", "outer_lr": 1.0, "outer_momentum": 0.5, "nesterov": False}


@pytest.mark.parametrize(
    "cfg",
    [
        pytest.param({**RING, **SLOWMO, "sched": True}, id="ring-every4-decaying-lr"),
        pytest.param(
            {**LOCAL_SGD, **SLOWMO, "optim": "adamw", "sched": True}, id="local-sgd-H3-adamw"
        ),
    ],
)
def test_slowmo_scaled_by_the_inner_lr_matches_the_papers_update(cfg: dict[str, Any]) -> None:
    """``u = beta u + Delta / gamma_t``, ``x_outer -= alpha gamma_t u`` under a decaying inner lr."""
    scaled = {**cfg, "scaled": True}
    check(scaled)
    # under the schedule the scaled update is another one: the comparison can tell them apart
    (a, _), (b, _) = replay_outer(scaled, 4), replay_outer(cfg, 4)
    assert (a[0] - b[0]).abs().max() > 1e-4


def test_slowmo_scaled_by_a_constant_inner_lr_is_the_plain_update() -> None:
    cfg = {**RING, **SLOWMO}
    values = check({**cfg, "scaled": True})
    plain, _ = replay_outer(cfg, 4)
    for got, exp in zip(values, plain):
        assert_close(got["params"], exp, rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"view": False}, id="params-not-bucket-views", marks=pytest.mark.slow),
        pytest.param({"accum": 2}, id="no_sync-accumulation"),
        pytest.param({"global_avg_at": 3}, id="global-avg-before-an-outer-step"),
        pytest.param({"alpha": 0.5}, id="mixing-step-0.5", marks=pytest.mark.slow),
        pytest.param({"bucket_mb": 25}, id="one-bucket", marks=pytest.mark.slow),
        pytest.param(
            {"scaler": True, "inf_at": (4, 2)},
            id="skipped-step-still-steps-outer",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_outer_with_wrapper_features(extra: dict[str, Any]) -> None:
    check({**RING, **extra})


def test_skipped_step_still_takes_the_outer_step() -> None:
    """An inf on one worker at an outer step skips d(t) everywhere; the all-reduce still happened."""
    check({**LOCAL_SGD, "scaler": True, "inf_at": (6, 1), "optim": "sgd_wd"})


def test_world_of_one_steps_the_outer_copy() -> None:
    check({"topology": "complete", "every": 2, "steps": 5, **NESTEROV}, world=1)


def test_unit_lr_without_momentum_is_plain_local_sgd() -> None:
    """Outer SGD lr=1, momentum 0 gives x_outer = xbar: the run is local-sgd (to rounding)."""
    base = {"topology": "local-sgd", "period": 3, "steps": 8, "optim": "sgd_wd"}
    plain = ok_values(run_distributed(outer_worker, 4, base))
    unit = {**base, "every": 3, "outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}
    outer = ok_values(run_distributed(outer_worker, 4, unit))
    for a, b in zip(plain, outer):
        # x_outer - (x_outer - xbar) is xbar up to one rounding of each subtraction
        assert_close(b["params"], a["params"], rtol=0, atol=1e-13)
    assert (plain[0]["params"] - plain[1]["params"]).abs().max() > 1e-4  # not a trivial run


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({}, id="one-fragment"),
        # outer rounds of fragment 0 at 4, 8; of fragment 1 at 2, 6, 10: saved after step 5,
        # the next step is an outer round of fragment 1 only, and a ring round of fragment 0
        pytest.param({"fragments": 2, "resume_at": 5}, id="two-fragments"),
        pytest.param(
            {"fragments": 2, "resume_at": 5, "outer_compression": "int8"},
            id="two-fragments-int8-outer",
        ),
    ],
)
def test_resume_mid_period_is_bit_exact(tmp_path, extra: dict[str, Any]) -> None:
    # saved after step 7: the next step is an outer one, mixing a gossip relaunched after the load
    cfg = {**RING, "steps": 10, "resume_at": 7, "optim": "adam", "sched": True, **extra}
    straight = ok_values(run_distributed(outer_worker, 4, cfg))
    ok_values(run_distributed(resume_worker, 4, cfg, str(tmp_path), "first", wrap_outer))
    resumed = ok_values(run_distributed(resume_worker, 4, cfg, str(tmp_path), "second", wrap_outer))
    assert_same_runs(straight, resumed, 10)


def _state_worker(rank: int, world: int) -> dict[str, Any]:
    cfg = {"topology": "complete", "every": 4, **NESTEROV}
    ddp = wrap_outer(make_model("mlp", seed=0), cfg)
    train_steps(ddp, rank, cfg, 1, 4)
    state = ddp.training_state_dict()
    copies = torch.cat([x.reshape(-1) for xs in state["outer"]["copies"] for x in xs])
    momenta = [o["state"] for o in state["outer"]["optimizers"]]
    train_steps(ddp, rank, cfg, 5, 6)
    old = dict(state)
    del old["outer"]  # a training state saved before the outer optimizer existed
    fresh = wrap_outer(make_model("mlp", seed=0), cfg)
    fresh.load_state_dict(ddp.state_dict())
    fresh.load_training_state_dict(old)
    loaded = fresh._engine.outer
    restarted = torch.cat([x.reshape(-1) for xs in loaded.copies for x in xs])
    return {
        "moved": float((copies - torch.cat([b.flat for b in ddp._buckets])).abs().max()),
        "restart_is_params": bool(
            torch.equal(restarted, torch.cat([b.flat for b in fresh._buckets]))
        ),
        "has_momentum": all(len(m) > 0 for m in momenta),
    }


def test_outer_state_is_saved_and_old_states_still_load() -> None:
    (value,) = ok_values(run_distributed(_state_worker, 1))
    assert value["moved"] > 0  # two local steps after the outer step moved the model off x_outer
    assert value["has_momentum"]
    assert value["restart_is_params"]  # without the key, x_outer restarts at the loaded model


def _fragments_state_worker(rank: int, world: int) -> dict[str, Any]:
    cfg = {"topology": "complete", "every": 4, "fragments": 2, **NESTEROV}
    ddp = wrap_outer(make_model("mlp", seed=0), cfg)
    train_steps(ddp, rank, cfg, 1, 3)
    state = ddp.training_state_dict()

    def load_message(changed: dict[str, Any]) -> str:
        """What loading ``state`` into a wrapper built with ``changed`` settings says."""
        other = wrap_outer(make_model("mlp", seed=0), {**cfg, **changed})
        train_steps(other, rank, cfg, 1, 1)
        try:
            other.load_training_state_dict(state)
        except ValueError as exc:
            return str(exc)
        return "accepted"

    message = load_message({"fragments": 4})
    packed_message = load_message({"outer_compression": "bf16"})
    scaled_message = load_message({"scaled": True})
    old = dict(state["outer"])
    del old["fragments"]  # saved before fragments existed: one fragment
    try:
        ddp._engine.outer.load_state_dict(old)
    except ValueError as exc:
        old_message = str(exc)
    else:
        old_message = "accepted"
    return {
        "fragments": state["outer"]["fragments"],
        "message": message,
        "old": old_message,
        "packed": packed_message,
        "scaled": scaled_message,
    }


def test_fragments_and_outer_compression_are_saved_and_checked_on_load() -> None:
    (value,) = ok_values(run_distributed(_fragments_state_worker, 1))
    assert value["fragments"] == 2
    assert "outer_fragments=2" in value["message"] and "outer_fragments=4" in value["message"]
    assert "outer_fragments=1" in value["old"] and "\n" not in value["message"]
    assert "outer_compression='none'" in value["packed"] and "'bf16'" in value["packed"]
    assert "saved with outer_scale_by_inner_lr=False" in value["scaled"]
    assert "this wrapper has outer_scale_by_inner_lr=True" in value["scaled"]


def _bad_stream_args_worker(rank: int, world: int) -> list[str]:
    sgd = partial(torch.optim.SGD, lr=0.7)
    cases = (
        {"outer_fragments": 2},
        {"outer_optim_fn": sgd, "outer_every": 4, "outer_fragments": 0},
        {"outer_optim_fn": sgd, "outer_every": 4, "outer_fragments": 2.0},
        {"outer_optim_fn": sgd, "outer_every": 4, "outer_fragments": True},
        {"outer_optim_fn": sgd, "outer_every": 6, "outer_fragments": 4},
        {"outer_compression": "int8"},
        {"outer_optim_fn": sgd, "outer_every": 4, "outer_compression": "randk"},
        {"outer_optim_fn": sgd, "outer_every": 4, "outer_compression": 8},
        {"outer_scale_by_inner_lr": True},
        {"outer_optim_fn": sgd, "outer_every": 4, "outer_scale_by_inner_lr": 1},
    )
    return _construct_messages(cases)


def test_bad_fragments_and_outer_compression_raise_one_line() -> None:
    (messages,) = ok_values(run_distributed(_bad_stream_args_worker, 1))
    assert all(m.startswith("ValueError") and "\n" not in m for m in messages), messages
    assert "outer_fragments=2" in messages[0] and "outer_optim_fn" in messages[0]
    assert "outer_fragments=0" in messages[1] and "integer >= 1" in messages[1]
    assert "outer_fragments=2.0" in messages[2]
    assert "outer_fragments=True" in messages[3]
    assert "outer_fragments=4 does not divide outer_every=6" in messages[4]
    assert "outer_compression='int8'" in messages[5] and "outer_optim_fn" in messages[5]
    assert "outer_compression='randk' is invalid" in messages[6] and "'int8'" in messages[6]
    assert "outer_compression=8 is invalid" in messages[7]
    assert "outer_scale_by_inner_lr=True" in messages[8] and "outer_optim_fn" in messages[8]
    assert "outer_scale_by_inner_lr=1 is invalid" in messages[9]


def _construct_messages(cases: Sequence[dict[str, Any]]) -> list[str]:
    """The one-line error of building the wrapper with each set of arguments, or "accepted"."""
    messages = []
    for kwargs in cases:
        try:
            DecentralizedDataParallel(make_model("mlp", 0), make_optim({}), **kwargs)
        except (ValueError, TypeError) as exc:
            messages.append(f"{type(exc).__name__}: {exc}")
        else:
            messages.append("accepted")
    return messages


def _bad_args_worker(rank: int, world: int) -> list[str]:
    sgd = partial(torch.optim.SGD, lr=0.7)
    cases = (
        {"outer_optim_fn": sgd},
        {"outer_every": 4},
        {"outer_optim_fn": sgd, "outer_every": 0},
        {"outer_optim_fn": sgd, "outer_every": 2.5},
        {"outer_optim_fn": sgd, "outer_every": True},
        {"outer_optim_fn": lambda ts: ts, "outer_every": 4},
        {"outer_optim_fn": "sgd", "outer_every": 4},
    )
    return _construct_messages(cases)


def test_bad_arguments_raise_one_line() -> None:
    (messages,) = ok_values(run_distributed(_bad_args_worker, 1))
    assert all(m != "accepted" and "\n" not in m for m in messages), messages
    assert "outer_every=None" in messages[0] and "give both" in messages[0]
    assert "outer_optim_fn=None" in messages[1]
    assert "outer_every=0" in messages[2] and "integer >= 1" in messages[2]
    assert "outer_every=2.5" in messages[3]
    assert "outer_every=True" in messages[4]
    assert messages[5].startswith("TypeError") and "list" in messages[5]
    assert messages[6].startswith("TypeError") and "callable" in messages[6]


def compressed_outer_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """The same run with and without int8 gossip, and the bytes each wrapper counts."""
    out: dict[str, Any] = {}
    for compression in (None, "int8"):
        ddp = DecentralizedDataParallel(
            make_model("mlp", seed=rank),
            optim_fn=make_optim(cfg),
            topology="ring",
            bucket_size_in_mb=0,
            outer_optim_fn=outer_fn(cfg),
            outer_every=cfg["every"],
            compression=compression,
        )
        train_steps(ddp, rank, cfg, 1, cfg["steps"])
        out[str(compression)] = (flat(ddp.module), ddp.comm_bytes_per_step())
        ddp.close()
    return out


@pytest.mark.parametrize("every", [1, 2])
def test_outer_rounds_are_exact_under_compressed_gossip(every: int) -> None:
    """Outer rounds bypass the compressor: every round outer gives the uncompressed run exactly;
    the bytes count the exact world all-reduce every H-th step and int8 pairs otherwise."""
    cfg = {"topology": "ring", "every": every, "steps": 4, "optim": "sgd_wd", **NESTEROV}
    values = ok_values(run_distributed(compressed_outer_worker, 4, cfg))
    for v in values:
        (plain, plain_bytes), (packed, packed_bytes) = v["None"], v["int8"]
        if every == 1:
            assert torch.equal(plain, packed)
            assert packed_bytes == plain_bytes
        else:  # the values against a replay: test_compression's outer-rounds test
            # ring rounds cost one payload per neighbour pair; int8 is about a quarter of it
            assert 0.5 * plain_bytes < packed_bytes < 0.7 * plain_bytes
