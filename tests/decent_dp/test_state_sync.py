"""Optimizer-state averaging (``state_sync``) against a float64 replay on real gloo groups.

The replay mixes each due state with the round's weights before the
optimizer steps (``s_i(t-1) <- sum_j W_ij s_j(t-1)``), then steps and mixes the
parameters as every other replay does (:mod:`tests.support.state_mix`).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from decent_dp import DecentralizedDataParallel
from decent_dp._engine.state_sync import StateSync
from decent_dp.optim import check_state_sync
from decent_dp.topo import TopologyReg
from tests.support.compression_replay import compressed_replay
from tests.support.ddp_cases import (
    LOCAL_TOPOLOGIES,
    flat,
    local_steps,
    make_model,
    make_optim,
    replay_workers,
    set_flat,
    topology_of,
    train_steps,
)
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.state_mix import mix_states


def _wrap(model: torch.nn.Module, cfg: dict[str, Any]) -> DecentralizedDataParallel:
    return DecentralizedDataParallel(
        model,
        optim_fn=make_optim(cfg),
        topology=topology_of(cfg),
        topology_kwargs=cfg.get("kwargs"),
        local_world_size=1,
        bucket_size_in_mb=cfg.get("bucket_mb", 0),
        param_as_bucket_view=cfg.get("view", True),
        compression=cfg.get("compression"),
        state_sync=cfg.get("state_sync"),
    )


def _states(ddp: DecentralizedDataParallel, names: list[str]) -> dict[str, torch.Tensor]:
    """Each parameter's named states, flat, keyed ``param/state``."""
    out = {}
    for b in ddp._engine.buckets or []:
        assert b.optimizer is not None
        for n, p in zip(b.names, b.params):
            for s in names:
                out[f"{n}/{s}"] = b.optimizer.state[p][s].detach().reshape(-1).clone()
    return out


def _worker(rank: int, world: int, cfg: dict[str, Any], ckpt: str | None = None) -> dict[str, Any]:
    ddp = _wrap(make_model(cfg.get("kind", "mlp"), seed=rank), cfg)
    k = cfg.get("resume_at")
    if k and ckpt is not None and os.path.exists(os.path.join(ckpt, f"{rank}.pt")):
        state = torch.load(os.path.join(ckpt, f"{rank}.pt"), weights_only=True)
        ddp.load_state_dict(state["model"])
        ddp.load_training_state_dict(state["train"])
        train_steps(ddp, rank, cfg, k + 1, cfg["steps"])
    elif k and ckpt is not None:
        train_steps(ddp, rank, cfg, 1, k)
        torch.save(
            {"model": ddp.state_dict(), "train": ddp.training_state_dict()},
            os.path.join(ckpt, f"{rank}.pt"),
        )
        return {}
    else:
        train_steps(ddp, rank, cfg, 1, cfg["steps"])
    return {
        "params": flat(ddp.module),
        "states": _states(ddp, cfg.get("check", list(cfg["state_sync"]))),
        "layout": [b["names"] for b in ddp.buckets_info],
    }


def _replay(
    cfg: dict[str, Any], world: int
) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    name = cfg["topology"]
    if name in LOCAL_TOPOLOGIES:
        topo = LOCAL_TOPOLOGIES[name](world, 1)
    else:
        topo = TopologyReg.create(name, world, 1, **cfg.get("kwargs", {}))
    mats, _, models, optims = replay_workers(topo, world, cfg)
    for t in range(1, cfg["steps"] + 1):
        r = (t - 1) % topo.period
        mix_states(models, optims, topo.rounds[r], t, cfg["state_sync"])
        old, new = local_steps(models, optims, t)
        stacked = torch.stack(old)
        for i, m in enumerate(models):
            # the first gossip is launched after step 1
            mixed = (mats[r][i].unsqueeze(1) * stacked).sum(0) if t > 1 else old[i]
            set_flat(m, mixed + new[i] - old[i])
    states = []
    for m, opt in zip(models, optims):
        states.append(
            {
                f"{n}/{s}": opt.state[p][s].detach().reshape(-1).clone()
                for n, p in m.named_parameters()
                for s in cfg.get("check", list(cfg["state_sync"]))
            }
        )
    return [flat(m) for m in models], states


def _assert_matches(
    got: list[dict[str, Any]], params: list[torch.Tensor], states: list[Any]
) -> None:
    for rank, (res, x, s) in enumerate(zip(got, params, states)):
        torch.testing.assert_close(res["params"], x, rtol=1e-10, atol=1e-12, msg=f"rank {rank}")
        assert res["states"].keys() == s.keys()
        for key in s:
            torch.testing.assert_close(
                res["states"][key], s[key], rtol=1e-10, atol=1e-14, msg=f"rank {rank} {key}"
            )


CASES = [
    (4, {"topology": "one-peer-exp", "optim": "adam", "state_sync": {"exp_avg_sq": 1}}),
    (
        4,
        {
            "topology": "complete",
            "optim": "adamw",
            "state_sync": {"exp_avg_sq": 1, "exp_avg": 2},
            "bucket_mb": 25,
        },
    ),
    (
        4,
        {
            "topology": "ring",
            "optim": "accum_adamw",
            "state_sync": {"exp_avg_sq": 3, "grad_accum": 2},
            "view": False,
        },
    ),
    (
        4,
        {
            "topology": "local-sgd",
            "kwargs": {"period": 3},
            "optim": "adam",
            "state_sync": {"exp_avg_sq": 1},
        },
    ),
    (2, {"topology": "ring", "optim": "adam", "state_sync": {"exp_avg_sq": 2}}),
    # v fed by the neighbours' mixed gradient of the step before
    (
        4,
        {
            "topology": "complete",
            "optim": "lagged_v_adamw",
            "state_sync": {"grad_prev": 1},
            "check": ["grad_prev", "exp_avg_sq"],
        },
    ),
    (8, {"topology": "one-peer-exp", "optim": "adamw", "state_sync": {"exp_avg_sq": 2}}),
    # W_ii = 0.7 != W_ij = 0.3: a rank's own weight and its peer's are told apart
    (4, {"topology": "lopsided-pairs", "optim": "adam", "state_sync": {"exp_avg_sq": 1}}),
    # rank 1 steps the branch from step 3 on: rank 0's state of it is not mixed with a
    # zero in its place before then
    (
        2,
        {
            "topology": "ring",
            "optim": "adam",
            "state_sync": {"exp_avg_sq": 1, "exp_avg": 1},
            "kind": "late_on_one",
        },
    ),
    # the same in one bucket: the late parameter sits beside others, at an offset
    (
        2,
        {
            "topology": "ring",
            "optim": "adam",
            "state_sync": {"exp_avg_sq": 1},
            "kind": "late_on_one",
            "bucket_mb": 25,
        },
    ),
]


@pytest.mark.parametrize(
    ("world", "cfg"),
    CASES,
    ids=lambda c: (
        str(c)
        if isinstance(c, int)
        else c.get("kind", c["topology"]) + ("-one-bucket" if c.get("bucket_mb") else "")
    ),
)
def test_state_sync_replays_exactly(world: int, cfg: dict[str, Any]) -> None:
    cfg = dict(cfg, steps=7)
    got = ok_values(run_distributed(_worker, world, cfg))
    params, states = _replay(cfg, world)
    _assert_matches(got, params, states)
    # the states really moved: without the mix, some rank ends elsewhere
    _, plain = _replay(dict(cfg, state_sync={}, check=list(cfg["state_sync"])), world)
    assert any(not torch.allclose(a[k], b[k]) for a, b in zip(states, plain) for k in a)


@pytest.mark.parametrize("compression", ["int8", "bf16"])
def test_state_sync_composes_with_compressed_gossip(compression: str) -> None:
    """The parameters' gossip compressed, the states' exact, both in one exchange per bucket."""
    cfg = {
        "topology": "complete",
        "optim": "adam",
        "compression": compression,
        "state_sync": {"exp_avg_sq": 1},
        "steps": 6,
    }
    got = ok_values(run_distributed(_worker, 4, cfg))
    want = compressed_replay(cfg, 4, got[0]["layout"])
    for rank, (res, x) in enumerate(zip(got, want)):
        torch.testing.assert_close(res["params"], x, rtol=1e-9, atol=1e-11, msg=f"rank {rank}")


def test_state_sync_resumes_bit_for_bit(tmp_path: Any) -> None:
    cfg = {"topology": "one-peer-exp", "optim": "adam", "state_sync": {"exp_avg_sq": 2}, "steps": 8}
    straight = ok_values(run_distributed(_worker, 4, cfg))
    resumed = dict(cfg, resume_at=3)
    ok_values(run_distributed(_worker, 4, resumed, str(tmp_path)))
    second = ok_values(run_distributed(_worker, 4, resumed, str(tmp_path)))
    for a, b in zip(straight, second):
        assert torch.equal(a["params"], b["params"])
        for key in a["states"]:
            assert torch.equal(a["states"][key], b["states"][key]), key


def _refusal(rank: int, world: int, kwargs: dict[str, Any]) -> str:
    try:
        DecentralizedDataParallel(
            make_model("mlp", seed=0), optim_fn=make_optim({"optim": "adam"}), **kwargs
        )
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"state_sync": {"exp_avg_sq": 0}},
            "state_sync['exp_avg_sq']=0: the period must be an int >= 1",
        ),
        ({"state_sync": {"exp_avg_sq": True}}, "the period must be an int >= 1"),
        ({"state_sync": ["exp_avg_sq"]}, "give a mapping of optimizer state names to periods"),
        (
            {
                "state_sync": {"exp_avg_sq": 1},
                "topology": "local-sgd",
                "outer_every": 4,
                "outer_optim_fn": lambda p: torch.optim.SGD(p, lr=0.7),
            },
            "does not combine with an outer optimizer",
        ),
    ],
)
def test_bad_state_sync_is_refused_in_one_line(kwargs: dict[str, Any], message: str) -> None:
    errors = ok_values(run_distributed(_refusal, 2, kwargs))
    for e in errors:
        assert message in e and "\n" not in e, e


def _unknown_name(rank: int, world: int, spec: dict[str, int]) -> str:
    ddp = DecentralizedDataParallel(
        make_model("mlp", seed=0),
        optim_fn=make_optim({"optim": "adam"}),
        topology="ring",
        state_sync=spec,
    )
    try:
        train_steps(ddp, rank, {}, 1, 3)
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize(
    "spec",
    [{"exp_avg_sqq": 1}, {"exp_avg": 1, "exp_avg_sqq": 1}],  # alone, and after one it keeps
    ids=["alone", "second"],
)
def test_a_state_the_optimizer_does_not_keep_is_named(spec: dict[str, int]) -> None:
    errors = ok_values(run_distributed(_unknown_name, 2, spec, timeout=60))
    for e in errors:
        assert "state_sync names 'exp_avg_sqq', which Adam does not keep for parameter group 0" in e
        assert "that group keeps: exp_avg, exp_avg_sq" in e and "\n" not in e, e


@pytest.mark.parametrize("name", ["", 3])
def test_a_state_name_that_is_no_name_is_refused(name: Any) -> None:
    with pytest.raises(ValueError, match="state_sync names must be optimizer state names, got"):
        check_state_sync({name: 1})


def test_the_rounds_of_each_step_of_a_span() -> None:
    sync = StateSync({"exp_avg": 2, "exp_avg_sq": 1})
    assert sync.rounds_in(4) == [1, 2, 1, 2]
    assert sync.due(6) == ["exp_avg", "exp_avg_sq"] and sync.due(3) == ["exp_avg_sq"]


def _training_refusal(rank: int, optim_fn: Any, kind: str, bucket_mb: float, steps: int) -> str:
    """The ValueError's message on ``rank`` of training ``kind`` with state_sync of amsgrad's state.

    ``state_sync={"max_exp_avg_sq": 1}`` on ``ring``; ``"no error"`` when none is raised.
    """
    ddp = DecentralizedDataParallel(
        make_model(kind, seed=0),
        optim_fn=optim_fn,
        topology="ring",
        bucket_size_in_mb=bucket_mb,
        state_sync={"max_exp_avg_sq": 1},
    )
    try:
        train_steps(ddp, rank, {"kind": kind}, 1, steps)
    except ValueError as exc:
        return str(exc)
    return "no error"


def _amsgrad_on_biases(rank: int, world: int) -> str:
    def optim_fn(pairs: list[tuple[torch.nn.Parameter, str]]) -> torch.optim.Optimizer:
        weights = [p for p, n in pairs if not n.endswith("bias")]
        biases = [p for p, n in pairs if n.endswith("bias")]
        groups = [{"params": weights}, {"params": biases, "amsgrad": True}]
        return torch.optim.Adam([g for g in groups if g["params"]], lr=0.01)

    # one bucket per parameter: the first ones checked keep the state
    return _training_refusal(rank, optim_fn, "mlp", bucket_mb=0, steps=3)


def test_a_state_one_parameter_group_does_not_keep_is_named_on_every_rank() -> None:
    # amsgrad on the biases only: every bucket is checked, not just the first one, and the
    # refusal is one line, the same on both ranks (no KeyError, no hang)
    errors = ok_values(run_distributed(_amsgrad_on_biases, 2, timeout=60))
    assert errors[0] == errors[1], errors
    e = errors[0]
    assert "\n" not in e, e
    assert "state_sync names 'max_exp_avg_sq', which Adam does not keep for parameter group 0" in e
    assert ".weight); state_sync needs it for every parameter" in e, e
    assert e.endswith("that group keeps: exp_avg, exp_avg_sq"), e


def test_training_state_with_another_state_sync_is_refused(tmp_path: Any) -> None:
    cfg = {
        "topology": "ring",
        "optim": "adam",
        "state_sync": {"exp_avg_sq": 2},
        "steps": 4,
        "resume_at": 2,
    }
    ok_values(run_distributed(_worker, 2, cfg, str(tmp_path)))
    results = run_distributed(_worker, 2, dict(cfg, state_sync={"exp_avg_sq": 1}), str(tmp_path))
    for status, value in results:
        assert status == "error"
        assert (
            "saved with state_sync={'exp_avg_sq': 2}; this run has state_sync={'exp_avg_sq': 1}"
            in value
        )


def _amsgrad_but_the_late_branch(
    rank: int, world: int, on_branch: bool = False, kind: str = "late"
) -> str:
    def optim_fn(pairs: list[tuple[torch.nn.Parameter, str]]) -> torch.optim.Optimizer:
        branch = [p for p, n in pairs if n.startswith("branch")]
        rest = [p for p, n in pairs if not n.startswith("branch")]
        groups = [{"params": rest, "amsgrad": not on_branch}, {"params": branch}]
        groups[1]["amsgrad"] = on_branch
        return torch.optim.Adam([g for g in groups if g["params"]], lr=0.01)

    # the branch gets its first gradient at step 3; one bucket: checked while it has no state yet
    return _training_refusal(rank, optim_fn, kind, bucket_mb=25, steps=5)


def test_a_bucket_is_checked_again_once_a_late_parameter_has_state() -> None:
    errors = ok_values(run_distributed(_amsgrad_but_the_late_branch, 2, timeout=60))
    assert errors[0] == errors[1], errors
    assert "which Adam does not keep for parameter group 1 of bucket 0 (branch." in errors[0]


def test_a_parameter_without_state_does_not_stop_the_check_of_the_others() -> None:
    # on rank 1 the branch (first in the bucket) has no state yet at the first exchange;
    # the parameters after it, without amsgrad, are refused then, on both ranks
    errors = ok_values(
        run_distributed(_amsgrad_but_the_late_branch, 2, True, "late_on_one", timeout=60)
    )
    assert errors[0] == errors[1], errors
    assert "which Adam does not keep for parameter group 0 of bucket 0 (head." in errors[0]
