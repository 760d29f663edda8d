"""Device and backend choice under every launcher, on CPU with the GPU count and environment faked.

Each case describes one node of a job: the environment each local rank sees
and how many GPUs it sees. Every rank of the node must choose the same
backend (a rank on gloo while another is on NCCL waits in the rendezvous
until the timeout) and a GPU that exists.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from decent_dp import utils
from decent_dp._engine.device import cached_per_device, side_stream

_LAUNCHER_VARS = (
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "SLURM_LOCALID",
    "SLURM_PROCID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "CUDA_VISIBLE_DEVICES",
)


def _torchrun(k: int, n: int, **extra: str) -> dict[str, str]:
    return {"LOCAL_RANK": str(k), "LOCAL_WORLD_SIZE": str(n), "RANK": str(k), **extra}


def _slurm(k: int, n: int, **extra: str) -> dict[str, str]:
    # srun without torchrun and without experiments.train.run's mapping
    return {
        "SLURM_LOCALID": str(k),
        "SLURM_PROCID": str(k),
        "SLURM_NTASKS_PER_NODE": str(n),
        **extra,
    }


# name: (environment of local rank k of n, visible GPUs, expected GPU index of rank k or None, backend)
CASES: dict[str, tuple[Any, int, Any, str]] = {
    "cpu-only torchrun": (lambda k: _torchrun(k, 4), 0, lambda k: None, "gloo"),
    "cpu-only slurm": (lambda k: _slurm(k, 4), 0, lambda k: None, "gloo"),
    "torchrun, a GPU per process": (lambda k: _torchrun(k, 4), 4, lambda k: k, "nccl"),
    "torchrun, 8 GPUs for 4 processes": (lambda k: _torchrun(k, 4), 8, lambda k: k, "nccl"),
    "torchrun, 2 GPUs for 4 processes": (lambda k: _torchrun(k, 4), 2, lambda k: k % 2, "gloo"),
    "torchrun, 4 processes share 1 GPU": (lambda k: _torchrun(k, 4), 1, lambda k: 0, "gloo"),
    "torchrun, CUDA_VISIBLE_DEVICES=LOCAL_RANK (the paper's scripts)": (
        lambda k: _torchrun(k, 4, CUDA_VISIBLE_DEVICES=str(k)),
        1,
        lambda k: 0,
        "nccl",
    ),
    "slurm, one GPU per task": (
        lambda k: _slurm(k, 4, CUDA_VISIBLE_DEVICES=str(k)),
        1,
        lambda k: 0,
        "nccl",
    ),
    "slurm, one GPU per task, mapped to torchrun's variables": (
        lambda k: {**_slurm(k, 4, CUDA_VISIBLE_DEVICES=str(k)), **_torchrun(k, 4)},
        1,
        lambda k: 0,
        "nccl",
    ),
    "slurm, all GPUs per node": (
        lambda k: _slurm(k, 4, CUDA_VISIBLE_DEVICES="0,1,2,3"),
        4,
        lambda k: k,
        "nccl",
    ),
    "slurm, tasks per node as 4(x2)": (
        lambda k: {"SLURM_LOCALID": str(k), "SLURM_TASKS_PER_NODE": "4(x2)"},
        4,
        lambda k: k,
        "nccl",
    ),
    "RANK only, 4 GPUs": (lambda k: {"RANK": str(4 + k)}, 4, lambda k: k, "nccl"),
    "one process, one GPU": (lambda k: {}, 1, lambda k: 0, "nccl"),
}


def _fake(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], n_gpus: int) -> None:
    for name in _LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n_gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n_gpus)


@pytest.mark.parametrize("case", list(CASES))
def test_every_local_rank_agrees_on_the_backend_and_gets_a_visible_gpu(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_of, n_gpus, index_of, backend = CASES[case]
    ranks = 1 if case.startswith("one process") else 4
    chosen = []
    for k in range(ranks):
        _fake(monkeypatch, env_of(k), n_gpus)
        index, chosen_backend = utils._plan()
        device = utils.get_device()
        assert index == index_of(k), (case, k)
        expected = torch.device("cpu") if index is None else torch.device("cuda", index)
        assert device == expected
        assert index is None or 0 <= index < n_gpus
        chosen.append(chosen_backend)
    assert chosen == [backend] * ranks, case


def test_the_backend_never_depends_on_the_local_rank_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old rule (nccl iff LOCAL_RANK < device_count) split a one-GPU-per-task node."""
    backends = set()
    for k in range(8):
        _fake(monkeypatch, _slurm(k, 8, CUDA_VISIBLE_DEVICES=str(k)), 1)
        backends.add(utils._plan()[1])
    assert backends == {"nccl"}


def test_initialize_dist_refuses_nccl_without_any_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, _torchrun(1, 2, WORLD_SIZE="2"), 0)
    with pytest.raises(ValueError, match="backend 'nccl' needs a CUDA device") as info:
        utils.initialize_dist(backend="nccl")
    assert "\n" not in str(info.value)


def test_side_streams_are_cached_one_per_device() -> None:
    made: list[torch.device] = []

    def make(device: torch.device) -> object:
        made.append(device)
        return object()

    cache: dict[Any, Any] = {}
    a0 = cached_per_device(cache, torch.device("cuda", 0), make)
    a1 = cached_per_device(cache, torch.device("cuda", 1), make)
    assert cached_per_device(cache, torch.device("cuda", 0), make) is a0
    assert cached_per_device(cache, torch.device("cuda:1"), make) is a1
    assert a0 is not a1
    assert made == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert side_stream(torch.device("cpu")) is None
