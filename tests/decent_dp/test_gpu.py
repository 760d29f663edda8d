"""CUDA + NCCL paths of the wrapper (skipped without a GPU).

Its features on CUDA tensors (compression, outer rounds, clipping) are in
``test_gpu_features.py``.
"""

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
    from decent_dp._engine.bucket import ALIGN_BYTES

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
    # at 4 ranks ring and one-peer-exp make groups of their own (at 2 every edge is the world)
    values = ok_values(run_distributed(multirun_memory_worker, 4, start_method="spawn"))
    for v in values:
        assert max(v["peaks"][1:]) <= v["peaks"][0] * 1.05, v["peaks"]
        assert max(v["after"]) <= v["after"][0] + (1 << 20), v["after"]
        assert len(set(v["groups"])) == 1, v["groups"]


# ------------------------------------------------------------ first contact with a GPU node
def no_set_device_worker(rank: int, world: int) -> dict[str, Any]:
    """init_process_group("nccl") and model.cuda(rank), without torch.cuda.set_device."""
    from torch import nn

    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_sgd

    dist.init_process_group("nccl", rank=rank, world_size=world)
    device = torch.device("cuda", rank)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).cuda(rank)
    ddp = DecentralizedDataParallel(model, optim_fn_sgd, topology="ring")
    for _ in range(3):
        ddp(torch.randn(8, 32, device=device)).square().mean().backward()
    timers = ddp.pop_timers()
    distance = ddp.consensus_distance()
    ddp.close()
    return {
        "gpu0_peak": torch.cuda.max_memory_allocated(0),
        "timers_ok": timers["comm/optim_s"] > 0.0,
        "distance": distance,
    }


def test_without_set_device_every_rank_stays_on_its_own_gpu() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    values = ok_values(run_distributed(no_set_device_worker, 2, init=False, start_method="spawn"))
    assert values[1]["gpu0_peak"] == 0  # nothing of rank 1 was staged on GPU 0
    assert all(v["timers_ok"] for v in values)
    assert values[0]["distance"] == values[1]["distance"]


def test_the_side_stream_is_cached_and_never_one_of_the_pools_streams() -> None:
    from decent_dp._engine.device import SIDE_STREAM_PRIORITY, side_stream

    device = torch.device("cuda", 0)
    side = side_stream(device)
    assert side_stream(torch.device("cuda:0")) is side
    least, greatest = side.priority_range()  # torch clips it to the levels it has pools for
    if least - greatest < 2:
        pytest.skip("the device has only two stream priorities")
    assert side.priority == max(SIDE_STREAM_PRIORITY, greatest)
    # the pools ProcessGroupNCCL draws from: priority 0, and the highest for high-priority groups
    drawn = [torch.cuda.Stream(device) for _ in range(64)]
    drawn += [torch.cuda.Stream(device, priority=greatest) for _ in range(64)]
    assert side.cuda_stream not in {s.cuda_stream for s in drawn}


def delayed_gossip_worker(rank: int, world: int) -> dict[str, Any]:
    """An emulated delay must not stall autograd's thread inside a gradient hook."""
    import time

    from torch import nn

    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_sgd

    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)]).cuda()
    ddp = DecentralizedDataParallel(model, optim_fn_sgd, topology="ring", bucket_size_in_mb=0)
    last_grad: list[float] = []
    model[0].weight.register_post_accumulate_grad_hook(
        lambda p: last_grad.append(time.perf_counter())
    )
    x = torch.randn(32, 256, device="cuda")
    ddp(x).square().mean().backward()
    ddp.set_comm_delay(lambda nbytes, k: 0.5)
    spans = []
    for _ in range(3):
        loss = ddp(x).square().mean()
        t0 = time.perf_counter()
        loss.backward()
        spans.append((last_grad[-1] - t0, time.perf_counter() - t0))
    torch.cuda.synchronize()
    return {"spans": spans}


def test_an_emulated_delay_on_cuda_leaves_the_rest_of_backward_running() -> None:
    values = ok_values(run_distributed(delayed_gossip_worker, 2, start_method="spawn"))
    for v in values:
        for to_last_grad, whole in v["spans"][1:]:
            assert to_last_grad < 0.2, v["spans"]  # no bucket slept inside a hook
            assert whole >= 0.3, v["spans"]  # the end of backward waited for the network


def user_stream_drain_worker(rank: int, world: int) -> dict[str, Any]:
    """consensus_distance() under a user stream drains the gossip; the next mix must still wait."""
    from torch import nn

    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_sgd

    torch.cuda.set_device(0)
    out = {}
    for measure in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024)).cuda()
        ddp = DecentralizedDataParallel(model, optim_fn_sgd, topology="complete")
        g = torch.Generator(device="cuda").manual_seed(rank)
        user = torch.cuda.Stream()
        for _ in range(5):
            ddp(torch.randn(64, 1024, device="cuda", generator=g)).square().mean().backward()
            if measure:
                with torch.cuda.stream(user):
                    ddp.consensus_distance()
        torch.cuda.synchronize()
        out[str(measure)] = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
        ddp.close()
    return out


def test_draining_under_a_user_stream_keeps_the_mix_after_the_collective() -> None:
    values = ok_values(run_distributed(user_stream_drain_worker, 2, start_method="spawn"))
    for v in values:
        assert_close(v["True"], v["False"], rtol=0, atol=0)


def close_in_flight_worker(rank: int, world: int) -> dict[str, Any]:
    from torch import nn

    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_sgd

    torch.cuda.set_device(0)
    model = nn.Sequential(nn.Linear(2048, 4096), nn.Linear(4096, 2048)).cuda()
    ddp = DecentralizedDataParallel(model, optim_fn_sgd, topology="complete")
    for _ in range(2):
        ddp(torch.randn(16, 2048, device="cuda")).square().mean().backward()
    buckets = ddp._buckets or []
    in_flight = sum(b.work is not None for b in buckets)
    ddp.close()  # right after launching the gossip of a 100 MB model
    torch.cuda.synchronize()
    return {"in_flight": in_flight, "left": sum(b.work is not None for b in buckets)}


def test_close_with_gossip_in_flight_finishes_it_first() -> None:
    values = ok_values(run_distributed(close_in_flight_worker, 2, start_method="spawn"))
    for v in values:
        assert v["in_flight"] > 0 and v["left"] == 0


def split_group_worker(rank: int, world: int) -> dict[str, Any]:
    from decent_dp._comm.groups import communicators_per_rank
    from decent_dp.utils import initialize_dist

    initialize_dist(timeout_s=120)  # nccl, bound to cuda:LOCAL_RANK: groups come from split_group
    model = make_model("mlp", seed=rank).cuda()
    cfg = {"topology": "one-peer-exp", "steps": 5}
    ddp = wrap(model, cfg)
    train_steps_cuda(ddp, rank, cfg)
    return {
        "params": flat(ddp.module).cpu(),
        "groups": len(ddp._engine._res.groups),
        "expected": communicators_per_rank(ddp.topology)[rank],
    }


def test_nccl_groups_split_per_round_match_replay() -> None:
    if torch.cuda.device_count() < 4:
        pytest.skip("needs 4 GPUs")
    cfg = {"topology": "one-peer-exp", "steps": 5}
    values = ok_values(run_distributed(split_group_worker, 4, init=False, start_method="spawn"))
    for got, exp in zip(values, replay(cfg, 4)):
        assert got["groups"] == got["expected"]
        assert_close(got["params"], exp, rtol=0, atol=1e-9)


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward keeps its stream busy first (about 50 ms on current GPUs)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(100_000_000)
        return grad.clone()


def _two_stream_loss(model: Any, x: torch.Tensor, branch: torch.cuda.Stream) -> torch.Tensor:
    main = torch.cuda.current_stream()
    y_main = model[1](x)  # first in forward: its gradients come last, on the main stream
    branch.wait_stream(main)
    with torch.cuda.stream(branch):
        y_branch = _SlowBackward.apply(model[0](x))  # gradients made late, on `branch`
    main.wait_stream(branch)
    return (y_main + y_branch).square().mean()


def multi_stream_worker(rank: int, world: int) -> dict[str, Any]:
    import copy

    from torch import nn

    from decent_dp import DecentralizedDataParallel

    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = nn.ModuleList([nn.Linear(512, 512), nn.Linear(512, 512)]).cuda()
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ddp = DecentralizedDataParallel(
        model,
        lambda pairs: torch.optim.SGD([p for p, _ in pairs], lr=0.1),
        topology="complete",
    )
    branch = torch.cuda.Stream()
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(4):
        x = torch.randn(256, 512, device="cuda", generator=g)
        # the loss calls the two branches itself; the wrapper's hooks still step the bucket
        _two_stream_loss(model, x, branch).backward()
        _two_stream_loss(ref, x, branch).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    torch.cuda.synchronize()
    ddp.close()  # the hooks hold the wrapper weakly: it lives until here
    return {
        "got": torch.cat([p.detach().flatten() for p in model.parameters()]).cpu(),
        "ref": torch.cat([p.detach().flatten() for p in ref.parameters()]).cpu(),
    }


def test_gradients_made_on_another_stream_are_waited_for() -> None:
    values = ok_values(run_distributed(multi_stream_worker, 1, start_method="spawn"))
    assert_close(values[0]["got"], values[0]["ref"], rtol=1e-5, atol=1e-6)
