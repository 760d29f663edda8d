"""Which step the wrapper takes for which optimizer, and what it costs the process, on real ranks.

The numbers these paths produce are checked against the float64 replay in
``test_ddp.py``; here the tests pin down that the cheap paths are the ones
actually taken (and the careful one where nothing is known).
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import pytest
import torch
from torch import nn

from decent_dp import DecentralizedDataParallel
from decent_dp._engine.cpu_memory import _glibc
from tests.support.ddp_cases import SubclassedSGD, batch, make_model
from tests.support.dist_harness import ok_values, run_distributed

OPTIMS: dict[str, Any] = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "sgd_wd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.1),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01),
    "adam_foreach_off": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False),
    "sgd_fused_off": lambda ps: torch.optim.SGD(ps, lr=0.05, fused=False),
    "subclass": lambda ps: SubclassedSGD(ps, lr=0.05, weight_decay=0.1),
    "rprop": lambda ps: torch.optim.Rprop(ps, lr=0.01),
}


def storage_worker(rank: int, world: int, name: str, stable: bool = False) -> dict[str, Any]:
    model = make_model("mlp", seed=rank)
    ddp = DecentralizedDataParallel(
        model,
        optim_fn=lambda pairs: OPTIMS[name]([p for p, _ in pairs]),
        topology="ring",
        bucket_size_in_mb=25,
        stable_param_storage=stable,
    )
    ptrs = []
    for t in range(1, 6):
        a, b = batch(rank, t)
        ((ddp(a, t, rank) - b) ** 2).mean().backward()
        ptrs.append(model.l1.weight.data_ptr())
    assert ddp._buckets is not None
    opt = ddp._buckets[0].optimizer
    assert opt is not None
    return {"ptrs": ptrs, "fused": [g.get("fused") for g in opt.param_groups]}


@pytest.mark.parametrize(
    ("name", "swaps", "fused"),
    [
        ("sgd", True, True),
        ("sgd_wd", True, True),  # weight decay folded in by hand
        ("adamw", True, True),
        ("adam_foreach_off", True, False),  # the user chose an implementation
        ("sgd_fused_off", True, False),
        ("subclass", False, False),  # unknown update: steps in place, as chosen
        ("rprop", True, False),  # no fused kernel
    ],
)
def test_parameter_storage_and_kernel(name: str, swaps: bool, fused: bool) -> None:
    for v in ok_values(run_distributed(storage_worker, 2, name)):
        ptrs = v["ptrs"]
        if swaps:
            # the mixed gossip buffer becomes the parameter block: two blocks take turns
            assert len(set(ptrs)) == 2 and ptrs[0::2] == [ptrs[0]] * 3, ptrs
        else:
            assert len(set(ptrs)) == 1, ptrs
        assert all(bool(f) is fused for f in v["fused"]), v["fused"]


def test_stable_parameter_storage_keeps_the_addresses() -> None:
    for v in ok_values(run_distributed(storage_worker, 2, "sgd_wd", True)):
        assert len(set(v["ptrs"])) == 1, v["ptrs"]
        assert all(v["fused"])


def sparse_worker(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.EmbeddingBag(50, 4, mode="sum", sparse=True)
    before = model.weight.detach().clone()
    ddp = DecentralizedDataParallel(
        model,
        optim_fn=lambda pairs: torch.optim.SGD([p for p, _ in pairs], lr=0.1),
        topology="ring",
    )
    for t in range(3):
        idx = torch.randint(0, 50, (8, 3), generator=torch.Generator().manual_seed(rank * 10 + t))
        ddp(idx).pow(2).sum().backward()
    assert ddp._buckets is not None
    opt = ddp._buckets[0].optimizer
    assert opt is not None
    return {
        "fused": opt.param_groups[0]["fused"],
        "moved": float((model.weight.detach() - before).abs().max()),
    }


def test_sparse_gradients_fall_back_to_the_default_kernel() -> None:
    for v in ok_values(run_distributed(sparse_worker, 2)):
        assert not v["fused"]
        assert v["moved"] > 0


def faults_worker(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    # about 34 MB of parameters, every gradient below glibc's 32 MiB mmap limit
    model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU())
    model.append(nn.Linear(2048, 1024))
    ddp = DecentralizedDataParallel(
        model,
        optim_fn=lambda pairs: torch.optim.SGD([p for p, _ in pairs], lr=1e-3),
        topology="ring",
    )
    x = torch.randn(8, 1024)
    for _ in range(3):
        ddp(x).square().mean().backward()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        ddp(x).square().mean().backward()
    return {"faults_per_step": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 5}


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _glibc() is None, reason="glibc malloc only"
)
@pytest.mark.slow
def test_freed_gradients_are_not_faulted_in_again(monkeypatch: pytest.MonkeyPatch) -> None:
    for knob in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(knob, raising=False)
    monkeypatch.setenv("DECENT_DP_KEEP_FREED_MEMORY", "0")
    # fresh interpreters: a forked worker would inherit this process's malloc settings
    off = ok_values(run_distributed(faults_worker, 2, start_method="spawn"))
    monkeypatch.setenv("DECENT_DP_KEEP_FREED_MEMORY", "1")
    on = ok_values(run_distributed(faults_worker, 2, start_method="spawn"))
    base = min(v["faults_per_step"] for v in off)
    # 34 MB of gradients are 8300 pages; returning them to the kernel faults most of them in
    assert base > 2000, f"without the setting only {base} faults per step: nothing to show"
    for v in on:
        assert v["faults_per_step"] < 0.3 * base, (v, base)


def test_malloc_setting_respects_the_users_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from decent_dp._engine import cpu_memory as _cpu_memory

    monkeypatch.setattr(_cpu_memory, "_applied_trim", 0)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert _cpu_memory.keep_freed_memory(10**8) is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("DECENT_DP_KEEP_FREED_MEMORY", "0")
    assert _cpu_memory.keep_freed_memory(10**8) is False
