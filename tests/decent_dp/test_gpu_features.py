"""CUDA paths of the wrapper's features on gloo (skipped without a GPU): compressed
gossip, its exact resume, outer rounds, clipping and the multi-tensor AccumAdamW step.

The wrapper's own CUDA + NCCL paths are in ``test_gpu.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from tests.decent_dp.test_gpu import gloo_cuda_worker
from tests.support.ddp_cases import flat, make_model, replay, train_steps
from tests.support.dist_harness import ok_values, run_distributed

pytestmark = pytest.mark.gpu


# ------------------------------------------------ compression, outer rounds, clipping, resume
def _cuda_forward(ddp: Any) -> None:
    inner = ddp.module.forward

    def forward(x, *args):
        return inner(x.cuda(), *args).cpu()

    ddp.module.forward = forward  # type: ignore[method-assign]


def compressed_cuda_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    from decent_dp import DecentralizedDataParallel
    from tests.support.ddp_cases import make_optim

    torch.cuda.set_device(0)
    ddp = DecentralizedDataParallel(
        make_model("mlp", seed=rank).cuda(),
        optim_fn=make_optim(cfg),
        topology=cfg["topology"],
        bucket_size_in_mb=0,
        grad_clip_norm=cfg.get("clip", 0.0),
        compression=cfg["compression"],
    )
    _cuda_forward(ddp)
    train_steps(ddp, rank, cfg, 1, cfg["steps"])
    out = {"params": flat(ddp.module).cpu(), "layout": [b["names"] for b in ddp.buckets_info]}
    ddp.close()
    return out


@pytest.mark.parametrize(
    ("topology", "comp"), [("complete", "int8"), ("ring", "bf16"), ("one-peer-exp", "randk:0.3")]
)
def test_gloo_with_cuda_tensors_compressed_gossip_matches_replay(topology: str, comp: str) -> None:
    from tests.support.compression_replay import compressed_replay

    cfg = {"topology": topology, "steps": 5, "compression": comp, "clip": 0.5}
    values = ok_values(run_distributed(compressed_cuda_worker, 4, cfg, start_method="spawn"))
    expected = compressed_replay(cfg, 4, values[0]["layout"])
    for got, exp in zip(values, expected):
        assert_close(got["params"], exp, rtol=0, atol=1e-9)


def compressed_resume_cuda_worker(rank: int, world: int, comp: str) -> dict[str, Any]:
    """Straight 6 steps, against 3 steps, a save, a fresh wrapper that loads it and 3 more."""
    from decent_dp import DecentralizedDataParallel
    from tests.support.ddp_cases import make_optim

    torch.cuda.set_device(0)

    def fresh() -> Any:
        ddp = DecentralizedDataParallel(
            make_model("mlp", seed=rank).cuda(),
            optim_fn=make_optim({}),
            topology="complete",
            bucket_size_in_mb=0,
            compression=comp,
        )
        _cuda_forward(ddp)
        return ddp

    straight = fresh()
    train_steps(straight, rank, {}, 1, 6)
    expected = flat(straight.module).cpu()
    straight.close()
    first = fresh()
    train_steps(first, rank, {}, 1, 3)
    model_state = {k: v.clone() for k, v in first.state_dict().items()}
    train_state = first.training_state_dict()
    first.close()
    second = fresh()
    second.load_state_dict(model_state)
    second.load_training_state_dict(train_state)  # relaunches on the side stream before forward
    train_steps(second, rank, {}, 4, 6)
    got = flat(second.module).cpu()
    second.close()
    return {"expected": expected, "got": got}


@pytest.mark.parametrize("comp", ["int8", "randk:0.3"])
def test_gloo_with_cuda_tensors_compressed_resume_is_exact(comp: str) -> None:
    values = ok_values(
        run_distributed(compressed_resume_cuda_worker, 4, comp, start_method="spawn")
    )
    for v in values:
        assert torch.equal(v["got"], v["expected"])


def outer_cuda_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    from tests.decent_dp.test_outer import wrap_outer

    torch.cuda.set_device(0)
    ddp = wrap_outer(make_model("mlp", seed=rank).cuda(), cfg)
    _cuda_forward(ddp)
    train_steps(ddp, rank, cfg, 1, cfg["steps"])
    out = {"params": flat(ddp.module).cpu()}
    ddp.close()
    return out


def test_gloo_with_cuda_tensors_outer_rounds_match_replay() -> None:
    from tests.decent_dp.test_outer import NESTEROV, replay_outer

    cfg = {"topology": "ring", "every": 3, "steps": 7, **NESTEROV}
    values = ok_values(run_distributed(outer_cuda_worker, 4, cfg, start_method="spawn"))
    expected, _ = replay_outer(cfg, 4)
    for got, exp in zip(values, expected):
        assert_close(got["params"], exp, rtol=0, atol=1e-9)


def test_gloo_with_cuda_tensors_clipping_matches_replay() -> None:
    cfg = {"topology": "ring", "steps": 5, "bucket_mb": 0, "clip": 0.3}
    values = ok_values(run_distributed(gloo_cuda_worker, 4, cfg, start_method="spawn"))
    for got, exp in zip(values, replay(cfg, 4)):
        assert_close(got["params"], exp, rtol=0, atol=1e-9)


def test_accum_adamw_multi_tensor_step_on_cuda_matches_per_tensor() -> None:
    from decent_dp.optim import AccumAdamW

    gen = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (10, 64), (10,)]
    start = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    grads = [
        [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes] for _ in range(25)
    ]
    results = []
    for foreach in (True, False):
        params = [p.clone().cuda().requires_grad_() for p in start]
        opt = AccumAdamW(params, lr=1e-2, weight_decay=0.1, accum_iter=3, foreach=foreach)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.cuda()
            opt.step()
        results.append([p.detach().cpu() for p in params])
    for a, b in zip(*results):
        assert_close(a, b, rtol=0, atol=1e-12)
