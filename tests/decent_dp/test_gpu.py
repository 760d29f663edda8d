"""CUDA + NCCL paths of the wrapper (skipped without a GPU)."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from tests.support.ddp_cases import flat, make_model, replay, train_steps, wrap
from tests.support.dist_harness import free_port, ok_values, run_distributed

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


# ------------------------------------------------------------------ one GPU is enough below
def gloo_cuda_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Several ranks share one GPU through gloo, which moves CUDA tensors itself."""
    torch.cuda.set_device(0)
    model = make_model(cfg.get("kind", "mlp"), seed=rank).cuda()
    ddp = wrap(model, cfg)
    if cfg.get("alpha") is not None:
        ddp.set_adaptive_factor(cfg["alpha"])
    train_steps_cuda(ddp, rank, cfg)
    timers = ddp.pop_timers()
    return {
        "params": flat(ddp.module).cpu(),
        "timers_ok": all(v >= 0.0 for v in timers.values()) and timers["comm/optim_s"] > 0.0,
        "side_stream": ddp._stream is not None,
    }


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("topology", ["ring", "one-peer-exp"])
def test_gloo_with_cuda_tensors_matches_replay(topology: str, world: int) -> None:
    cfg = {"topology": topology, "steps": 5, "bucket_mb": 0}
    values = ok_values(run_distributed(gloo_cuda_worker, world, cfg, start_method="spawn"))
    for got, exp in zip(values, replay(cfg, world)):
        assert got["side_stream"] and got["timers_ok"]
        assert_close(got["params"], exp, rtol=0, atol=1e-9)


@pytest.mark.parametrize("optim", ["sgd_wd", "adamw", "subclass_wd"])
def test_gloo_with_cuda_tensors_weight_decay_and_in_place_paths(optim: str) -> None:
    """The swapped blocks with decay folded in (sgd_wd, adamw), and the in-place step, on a side stream."""
    cfg = {"topology": "lopsided-pairs", "steps": 5, "optim": optim, "alpha": 0.5}
    values = ok_values(run_distributed(gloo_cuda_worker, 4, cfg, start_method="spawn"))
    for got, exp in zip(values, replay(cfg, 4)):
        assert_close(got["params"], exp, rtol=0, atol=1e-9)


def test_gloo_with_cuda_tensors_reentrant_checkpoint_and_failed_backward() -> None:
    for cfg in (
        {"topology": "ring", "steps": 4, "kind": "ckpt"},
        {"topology": "ring", "steps": 5, "bucket_mb": 0, "fail_at": (3, 0)},
    ):
        values = ok_values(run_distributed(gloo_cuda_worker, 2, cfg, start_method="spawn"))
        for got, exp in zip(values, replay(cfg, 2)):
            assert_close(got["params"], exp, rtol=0, atol=1e-9)


def fp16_scaler_worker(rank: int, world: int) -> dict[str, Any]:
    from torch import nn

    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_sgd

    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
    scaler = torch.amp.GradScaler("cuda")
    ddp = DecentralizedDataParallel(model, optim_fn_sgd, topology="complete", scaler=scaler)
    g = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(64, 64, device="cuda", generator=g)
    y = torch.randint(0, 10, (64,), device="cuda", generator=g)
    losses = []
    for step in range(40):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(ddp(x), y)
        if step == 5 and rank == 1:
            loss = loss * float("inf")  # one worker overflows: everyone skips that step
        scaler.scale(loss).backward()
        losses.append(float(loss))
    return {"first": losses[0], "last": losses[-1], "scale": float(scaler.get_scale())}


def test_fp16_autocast_with_grad_scaler_on_cuda() -> None:
    values = ok_values(run_distributed(fp16_scaler_worker, 2, start_method="spawn"))
    assert values[0]["scale"] == values[1]["scale"] < 65536.0
    for v in values:
        assert v["last"] < v["first"] * 0.7


def inductor_worker(rank: int, world: int) -> dict[str, Any]:
    from torch import nn

    from decent_dp import DecentralizedDataParallel
    from decent_dp._bucket import ALIGN_BYTES

    torch.cuda.set_device(0)
    torch.manual_seed(0)
    # a 10-class head first in gradient order: unpadded, every later view starts 8 bytes off
    model = nn.Sequential(
        nn.Linear(32, 250), nn.GELU(), nn.Linear(250, 130), nn.GELU(), nn.Linear(130, 10)
    ).cuda()
    model.forward = torch.compile(model.forward)  # type: ignore[method-assign]
    ddp = DecentralizedDataParallel(
        model,
        lambda pairs: torch.optim.AdamW([p for p, _ in pairs], lr=1e-3, foreach=True),
        topology="complete",
    )
    g = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(128, 32, device="cuda", generator=g)
    y = torch.randint(0, 10, (128,), device="cuda", generator=g)
    losses = []
    for _ in range(30):
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        losses.append(float(loss))
    torch.cuda.synchronize()
    return {
        "aligned": all(p.data_ptr() % ALIGN_BYTES == 0 for p in model.parameters()),
        "first": losses[0],
        "last": losses[-1],
    }


def test_inductor_on_cuda_over_padded_views() -> None:
    values = ok_values(run_distributed(inductor_worker, 2, start_method="spawn", timeout=600))
    for v in values:
        assert v["aligned"] and v["last"] < v["first"]


def multirun_memory_worker(rank: int, world: int) -> dict[str, Any]:
    """Six jobs in one process, as a Hydra multirun runs them: memory must not grow."""
    import gc

    from torch import nn

    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_adamw

    torch.cuda.set_device(0)
    peaks, after, groups = [], [], []
    for job, topology in enumerate(["ring", "one-peer-exp", "complete"] * 2):
        torch.cuda.reset_peak_memory_stats()
        model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).cuda()
        ddp = DecentralizedDataParallel(model, optim_fn_adamw, topology=topology)
        for _ in range(3):
            ddp(torch.randn(64, 512, device="cuda")).square().mean().backward()
        if job % 2:
            ddp.close()  # closed explicitly, or just dropped
        del ddp, model
        gc.collect()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated())
        after.append(torch.cuda.memory_allocated())
        groups.append(len(dist.distributed_c10d._world.pg_map))
    return {"peaks": peaks, "after": after, "groups": groups}


def test_multirun_of_six_jobs_does_not_grow_gpu_memory() -> None:
    values = ok_values(run_distributed(multirun_memory_worker, 2, start_method="spawn"))
    for v in values:
        assert max(v["peaks"][1:]) <= v["peaks"][0] * 1.05, v["peaks"]
        assert max(v["after"]) <= v["after"][0] + (1 << 20), v["after"]
        assert len(set(v["groups"])) == 1, v["groups"]
