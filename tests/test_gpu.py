"""CUDA + NCCL paths of the wrapper (skipped without a GPU)."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ddp_cases import flat, make_model, replay, train_steps, wrap
from dist_harness import free_port, ok_values, run_distributed
from torch.testing import assert_close

pytestmark = pytest.mark.gpu


def nccl_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    model = make_model(cfg.get("kind", "mlp"), seed=rank).cuda()
    ddp = wrap(model, cfg)
    train_steps_cuda(ddp, rank, cfg)
    out = {"params": flat(ddp.module).cpu(), "consensus": ddp.consensus_distance()}
    return out


def train_steps_cuda(ddp, rank: int, cfg: dict[str, Any]) -> None:
    # the shared driver builds CPU batches; move them by wrapping the module's forward
    inner = ddp.module.forward

    def forward(x, *args):
        return inner(x.cuda(), *args).cpu()

    ddp.module.forward = forward  # type: ignore[method-assign]
    train_steps(ddp, rank, cfg, 1, cfg["steps"])


@pytest.mark.parametrize("topology", ["ring", "one-peer-exp"])
def test_nccl_matches_replay(topology: str) -> None:
    world = min(torch.cuda.device_count(), 4) if torch.cuda.device_count() > 1 else 2
    if torch.cuda.device_count() < world:
        pytest.skip("needs 2 GPUs")
    cfg = {"topology": topology, "steps": 5}
    values = ok_values(run_distributed(nccl_worker, world, cfg, init=False, start_method="spawn"))
    for got, exp in zip(values, replay(cfg, world)):
        assert_close(got["params"], exp, rtol=0, atol=1e-9)


def test_single_gpu_world_size_one_bf16_autocast() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        from torch import nn

        from decent_dp import DecentralizedDataParallel
        from decent_dp.optim import optim_fn_adamw

        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
        ddp = DecentralizedDataParallel(model, optim_fn_adamw, topology="ring")
        x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
        losses = []
        for _ in range(30):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            losses.append(loss.item())
        assert losses[-1] < losses[0] * 0.5
        assert next(model.parameters()).device.type == "cuda"
    finally:
        dist.destroy_process_group()
