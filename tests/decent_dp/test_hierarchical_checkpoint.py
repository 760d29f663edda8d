"""Checkpoints of compressed hierarchical gossip while the exchange between hosts is in flight.

Off NCCL the exchange between hosts (phase 2) runs on the wrapper's phase
thread, so a state saved after the backward pass can be read before or after
that thread finished it. Real runs on 4 gloo ranks (2 hosts of 2,
``compression="int8"``, SGD) check that the saved state does not depend on when
it is read: a pause before the save (a logging or evaluation phase) changes
nothing, a resume repeats the run bit for bit, and partners save the same
chunk references even when only one host pauses.
"""

from __future__ import annotations

import io
import time
from typing import Any

import torch

from decent_dp import DecentralizedDataParallel
from decent_dp.topo import HierarchicalTopology
from tests.support.ddp_cases import flat, make_model, train_steps
from tests.support.dist_harness import ok_values, run_distributed

__all__: list[str] = []

HOSTS, LOCAL = 2, 2
WORLD = HOSTS * LOCAL


def _wrap(rank: int) -> DecentralizedDataParallel:
    return DecentralizedDataParallel(
        make_model("mlp", seed=rank),
        optim_fn=lambda pairs: torch.optim.SGD([p for _, p in pairs], lr=0.05),
        topology=HierarchicalTopology(WORLD, LOCAL),
        local_world_size=LOCAL,
        bucket_size_in_mb=0,
        compression="int8",
    )


def _save(ddp: DecentralizedDataParallel, rank: int, pause: tuple[int, ...]) -> bytes:
    """What a trainer does at a checkpoint: its hosts in ``pause`` first spend 0.5 s elsewhere."""
    if rank // LOCAL in pause:
        time.sleep(0.5)  # the phase thread finishes the exchange between hosts meanwhile
    buf = io.BytesIO()
    torch.save({"model": ddp.state_dict(), "train": ddp.training_state_dict()}, buf)
    return buf.getvalue()


def _load(ddp: DecentralizedDataParallel, blob: bytes, lr: float | None = None) -> None:
    state = torch.load(io.BytesIO(blob), weights_only=True)
    if lr is not None:
        for opt in state["train"]["optimizers"]:
            for group in opt["param_groups"]:
                group["lr"] = lr
    ddp.load_state_dict(state["model"])
    ddp.load_training_state_dict(state["train"])


def _host_refs(blob: bytes) -> dict[str, torch.Tensor]:
    state = torch.load(io.BytesIO(blob), weights_only=True)
    return state["train"]["compression"]["host_refs"]


def _resume_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train ``1..steps`` with a save after ``save_at``; then resume from it in a new wrapper."""
    steps, k = cfg["steps"], cfg["save_at"]
    ddp = _wrap(rank)
    train_steps(ddp, rank, {}, 1, k)
    blob = _save(ddp, rank, cfg["pause"])
    train_steps(ddp, rank, {}, k + 1, steps)  # the save read the state, nothing more
    straight = flat(ddp.module)
    ddp.close()
    ddp = _wrap(rank)
    _load(ddp, blob)
    train_steps(ddp, rank, {}, k + 1, steps)
    resumed = flat(ddp.module)
    ddp.close()
    return {"straight": straight, "resumed": resumed, "host_refs": _host_refs(blob)}


def test_a_pause_before_the_save_changes_nothing_and_a_resume_repeats_the_run() -> None:
    cfg = {"steps": 6, "save_at": 3, "pause": tuple(range(HOSTS))}
    values = ok_values(run_distributed(_resume_worker, WORLD, cfg, local_world_size=LOCAL))
    for rank, v in enumerate(values):
        diff = (v["straight"] - v["resumed"]).abs().max().item()
        assert torch.equal(v["straight"], v["resumed"]), f"rank {rank}: differs by {diff:.3g}"
    _assert_partners_agree(values)


def _assert_partners_agree(values: list[dict[str, Any]]) -> None:
    """Local rank ``l`` of both hosts carries chunk ``l``: their saved references are one."""
    for rank in range(LOCAL):
        mine, partner = values[rank]["host_refs"], values[rank + LOCAL]["host_refs"]
        assert mine and sorted(mine) == sorted(partner)
        for key in mine:
            gap = (mine[key] - partner[key]).abs().max().item()
            assert torch.equal(mine[key], partner[key]), f"ranks {rank}, {rank + LOCAL}: {gap:.3g}"


def _one_host_pauses_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Only host 0 pauses before its save; the resumed run is pure gossip (lr = 0)."""
    ddp = _wrap(rank)
    train_steps(ddp, rank, {}, 1, cfg["save_at"])
    blob = _save(ddp, rank, (0,))
    ddp.close()
    ddp = _wrap(rank)
    _load(ddp, blob, lr=0.0)
    k = cfg["save_at"]
    gaps = []
    for last in cfg["checks"]:
        train_steps(ddp, rank, {}, k + 1, last)
        k = last
        x = flat(ddp.module)
        gathered = [torch.empty_like(x) for _ in range(world)]
        torch.distributed.all_gather(gathered, x)
        host_means = [sum(gathered[h * LOCAL : (h + 1) * LOCAL]) / LOCAL for h in range(HOSTS)]
        gaps.append((host_means[0] - host_means[1]).abs().max().item())
    ddp.close()
    return {"gaps": gaps, "host_refs": _host_refs(blob)}


def test_one_host_pausing_before_its_save_does_not_split_the_hosts() -> None:
    cfg = {"save_at": 3, "checks": (4, 8, 60)}
    values = ok_values(run_distributed(_one_host_pauses_worker, WORLD, cfg, local_world_size=LOCAL))
    _assert_partners_agree(values)
    gaps = values[0]["gaps"]
    # pure gossip over both hosts: the host means meet (int8 rounds, the references converge)
    assert gaps[-1] < 1e-9 and gaps[-1] < gaps[0], gaps
