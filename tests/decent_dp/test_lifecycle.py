"""What users do to the wrapper beyond plain training: drop it, checkpoint activations,
compile it, freeze parameters, let a backward fail. Real gloo processes throughout."""

from __future__ import annotations

import contextlib
import gc
import weakref
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp._engine.bucket import ALIGN_BYTES
from tests.support.ddp_cases import (
    batch,
    make_model,
    make_optim,
    replay,
    train_steps,
    train_worker,
    wrap,
)
from tests.support.dist_harness import ok_values, run_distributed

ATOL = 1e-9


def check_against_replay(cfg: dict, world: int, **kw: Any) -> list[dict]:
    values = ok_values(run_distributed(train_worker, world, cfg, **kw))
    expected = replay(cfg, world)
    for rank, (got, exp) in enumerate(zip(values, expected)):
        assert got["step"] == cfg["steps"], f"rank {rank} took {got['step']} steps"
        assert_close(got["params"], exp, rtol=0, atol=ATOL, msg=lambda m, r=rank: f"rank {r}: {m}")
    return values


def _n_groups() -> int:
    return len(dist.distributed_c10d._world.pg_map)


def lifetime_worker(rank: int, world: int) -> dict[str, Any]:
    cfg = {"topology": "ring", "steps": 2}
    base = _n_groups()
    refs, counts = [], []
    for seed in range(3):
        ddp = wrap(make_model("mlp", seed=seed), cfg)
        train_steps(ddp, rank, cfg, 1, 2)  # gossip is in flight when it is dropped
        refs.append(weakref.ref(ddp))
        opt_ref = weakref.ref(ddp._buckets[0].optimizer)
        del ddp
        gc.collect()
        counts.append(_n_groups())
    with wrap(make_model("mlp", seed=5), cfg) as ddp:
        train_steps(ddp, rank, cfg, 1, 2)
        inside = _n_groups()
    after_with = _n_groups()
    ddp.close()  # idempotent
    try:
        ddp(batch(rank, 1)[0])
        closed_error = ""
    except RuntimeError as exc:
        closed_error = str(exc)
    return {
        "alive": [r() is not None for r in refs],
        "opt_alive": opt_ref() is not None,
        "base": base,
        "counts": counts,
        "inside": inside,
        "after_with": after_with,
        "closed_error": closed_error,
    }


def test_dropped_and_closed_wrappers_free_everything() -> None:
    for v in ok_values(run_distributed(lifetime_worker, 4)):
        assert v["alive"] == [False, False, False]
        assert not v["opt_alive"]
        # a ring at n=4 needs its own pair groups; none of them outlive their wrapper
        assert v["inside"] > v["base"]
        assert v["counts"] == [v["base"]] * 3
        assert v["after_with"] == v["base"]
        assert "closed" in v["closed_error"]


def test_reentrant_checkpointing_steps_once_per_backward() -> None:
    check_against_replay({"topology": "ring", "steps": 4, "kind": "ckpt"}, 2)


def test_reentrant_checkpointing_matches_plain_training() -> None:
    plain = ok_values(run_distributed(train_worker, 2, {"topology": "ring", "steps": 4}))
    ckpt = ok_values(
        run_distributed(train_worker, 2, {"topology": "ring", "steps": 4, "kind": "ckpt"})
    )
    for a, b in zip(plain, ckpt):
        assert_close(a["params"], b["params"], rtol=0, atol=1e-12)


class TenClassHead(nn.Module):
    """A 10-class head first: every later parameter would start 8 bytes off alignment."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, 10, bias=True)
        self.body = nn.Linear(10, 3)
        self.conv = nn.Conv2d(3, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(torch.ones(x.shape[0], 10, dtype=x.dtype)) + x
        h = self.conv(h[:, :, None, None].contiguous(memory_format=torch.channels_last))
        return self.head(h.flatten(1)[:, :3])


def alignment_worker(rank: int, world: int, view: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = TenClassHead().double()
    ddp = DecentralizedDataParallel(
        model,
        lambda pairs: torch.optim.SGD([p for p, _ in pairs], lr=0.1),
        topology="complete",
        bucket_size_in_mb=1,
        param_as_bucket_view=view,
    )
    for _ in range(2):
        ddp(torch.randn(4, 3, dtype=torch.float64)).sum().backward()
    b = ddp._buckets[0]
    return {
        "params": [p.data_ptr() % ALIGN_BYTES for p in model.parameters()],
        "comm": [c.data_ptr() % ALIGN_BYTES for c in b.comm_views],
        "n_buckets": len(ddp._buckets),
    }


@pytest.mark.parametrize("view", [True, False])
def test_parameter_views_are_aligned(view: bool) -> None:
    (v,) = ok_values(run_distributed(alignment_worker, 1, view))
    assert v["n_buckets"] == 1
    if view:
        assert v["params"] == [0] * 6
    assert set(v["comm"]) == {0}


def test_failed_backward_leaves_the_wrapper_usable() -> None:
    # rank 0's backward raises before l1's gradients at step 3; the peers keep going
    check_against_replay({"topology": "ring", "steps": 6, "bucket_mb": 0, "fail_at": (3, 0)}, 2)
    check_against_replay(
        {"topology": "one-peer-exp", "steps": 5, "bucket_mb": 0, "fail_at": (2, 1)}, 4
    )


def failed_scaled_worker(rank: int, world: int) -> dict[str, Any]:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    model = make_model("mlp", seed=rank).float()
    ddp = DecentralizedDataParallel(
        model, make_optim({}), topology="complete", scaler=scaler, bucket_size_in_mb=0
    )
    cfg = {"fail_at": (2, 0)}
    for t in range(1, 5):
        a, b = batch(rank, t)
        ddp.module.bomb = cfg["fail_at"] == (t, rank)
        loss = scaler.scale(((ddp(a.float()) - b.float()) ** 2).mean())
        ddp.module.bomb = False
        with contextlib.suppress(RuntimeError):  # rank 0's backward fails on purpose
            loss.backward()
    return {"scale": float(scaler.get_scale()), "step": ddp.step_count}


def test_failed_backward_with_loss_scaling_skips_every_worker_together() -> None:
    values = ok_values(run_distributed(failed_scaled_worker, 2, timeout=60))
    # 4 iterations, one of them skipped everywhere (the scale backs off once, to 2^9)
    assert [v["step"] for v in values] == [4, 4]
    assert [v["scale"] for v in values] == [2.0**9, 2.0**9]


# the paper's scripts compile the forward; the other two ways run in the slow suite
@pytest.mark.parametrize(
    "how",
    [
        "forward",
        pytest.param("module", marks=pytest.mark.slow),
        pytest.param("wrapper", marks=pytest.mark.slow),
    ],
)
def test_compiled_models_train_like_eager(how: str) -> None:
    # the least-squares model's forward takes no Python ints, so it compiles once
    cfg = {"topology": "ring", "steps": 3, "kind": "lsq", "compile": how}
    values = check_against_replay(cfg, 2)
    eager = sorted(make_model("lsq", 0).state_dict())
    for v in values:
        assert v["keys"] == eager  # no _orig_mod. prefix: checkpoints load either way


def test_frozen_parameters_stay_out_of_buckets() -> None:
    check_against_replay({"topology": "ring", "steps": 4, "kind": "frozen"}, 2)
    (names,) = ok_values(run_distributed(_bucket_names_worker, 1))
    assert "l2.weight" not in names and "l2.bias" in names


def _bucket_names_worker(rank: int, world: int) -> list[str]:
    cfg = {"topology": "complete", "steps": 1, "kind": "frozen"}
    ddp = wrap(make_model("frozen", 0), cfg)
    train_steps(ddp, rank, cfg, 1, 1)
    return [n for b in ddp.buckets_info for n in b["names"]]


def fp16_scaler_worker(rank: int, world: int) -> str:
    model = nn.Linear(2, 2).half()
    try:
        DecentralizedDataParallel(
            model, make_optim({}), scaler=torch.amp.GradScaler("cpu"), topology="complete"
        )
    except ValueError as exc:
        return str(exc)
    return ""


def test_fp16_parameters_with_a_scaler_are_rejected() -> None:
    (msg,) = ok_values(run_distributed(fp16_scaler_worker, 1))
    assert "float16" in msg and "'weight'" in msg and "\n" not in msg
