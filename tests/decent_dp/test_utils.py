"""Tests for decent_dp.utils: process-group set-up on real gloo groups, device choice."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from decent_dp.utils import get_backend_for, get_device, initialize_dist
from tests.support.dist_harness import ok_values, run_distributed

REPO = Path(__file__).resolve().parents[2]
_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_script(script: str, env_extra: dict[str, str]) -> Any:
    """Run ``script`` in a fresh interpreter without launcher variables; return its JSON line."""
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _single(rank: int, world: int, preset_port: str) -> list[dict[str, Any]]:
    """Two one-process groups set up from an environment without launcher variables."""
    runs = []
    for preset in (None, preset_port):
        for k in _DIST_VARS:
            os.environ.pop(k, None)
        if preset is not None:
            os.environ["MASTER_PORT"] = preset
        first = initialize_dist(timeout_s=60)
        second = initialize_dist()
        x = torch.full((2,), 3.0, device=get_device())
        dist.all_reduce(x)
        runs.append(
            {
                "first": list(first),
                "second": list(second),
                "backend": dist.get_backend(),
                "sum": x.tolist(),
                "device": str(get_device()),
                "env": {k: os.environ.get(k) for k in _DIST_VARS},
            }
        )
        dist.destroy_process_group()
    return runs


def test_single_process_without_world_size() -> None:
    # in a forked process (a fresh interpreter would import torch again): it clears the
    # launcher variables the harness sets before each of its two set-ups
    preset = str(_free_port())
    (runs,) = ok_values(run_distributed(_single, 1, preset, init=False, timeout=120))
    assert len(runs) == 2
    for i, out in enumerate(runs):
        assert out["first"] == [0, 1]
        assert out["second"] == [0, 1]
        assert out["backend"] == "gloo"
        assert out["sum"] == [3.0, 3.0]
        assert out["device"] == "cpu"
        env = out["env"]
        assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1"
        assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert 0 < int(env["MASTER_PORT"]) < 65536
        if i == 1:
            assert env["MASTER_PORT"] == preset


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    try:
        first = initialize_dist(backend="gloo", timeout_s=60)
        second = initialize_dist()
        x = torch.tensor([float(rank + 1)])
        dist.all_reduce(x)
        gathered: list[object] = [None] * world_size
        dist.all_gather_object(gathered, rank)
        result = {
            "first": list(first),
            "second": list(second),
            "sum": x.item(),
            "gathered": gathered,
            "backend": dist.get_backend(),
        }
        Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_two_processes(tmp_path: Path) -> None:
    # forked, not spawned: initialize_dist reads only the environment, and a spawned child
    # would import torch and decent_dp again (seconds); test_gpu_defects spawns its ranks
    world_size = 2
    mp.start_processes(
        _worker,
        args=(world_size, _free_port(), str(tmp_path)),
        nprocs=world_size,
        join=True,
        start_method="fork",
    )
    for rank in range(world_size):
        out = json.loads((tmp_path / f"{rank}.json").read_text())
        assert out["first"] == [rank, world_size]
        assert out["second"] == [rank, world_size]
        assert out["sum"] == 3.0  # 1 + 2
        assert out["gathered"] == [0, 1]
        assert out["backend"] == "gloo"


@pytest.mark.parametrize("backend", ["mpi", "bogus", "NCCL", ""])
def test_bad_backend(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="backend") as info:
        initialize_dist(backend=backend)
    assert repr(backend) in str(info.value)
    assert "\n" not in str(info.value)
    assert not dist.is_initialized()
    assert "WORLD_SIZE" not in os.environ


@pytest.mark.parametrize("timeout_s", [0.0, -5.0])
def test_bad_timeout(timeout_s: float) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        initialize_dist(timeout_s=timeout_s)
    assert not dist.is_initialized()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_nccl_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="nccl"):
        initialize_dist(backend="nccl")
    assert not dist.is_initialized()
    assert "WORLD_SIZE" not in os.environ


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_get_device_is_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert get_device() == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert get_device() == torch.device("cpu")


def test_get_device_bad_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "first")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        get_device()


def test_get_backend_for() -> None:
    assert get_backend_for("cpu") == "gloo"
    assert get_backend_for(torch.device("cpu")) == "gloo"
    assert get_backend_for("cuda:1") == "nccl"
    with pytest.raises(ValueError, match="meta"):
        get_backend_for("meta")


_SINGLE_GPU = """
    import json
    import torch, torch.distributed as dist
    from decent_dp.utils import initialize_dist, get_device

    first = initialize_dist(timeout_s=60)
    second = initialize_dist()
    x = torch.full((2,), 3.0, device=get_device())
    dist.all_reduce(x)
    out = {
        "first": list(first),
        "second": list(second),
        "backend": dist.get_backend(),
        "sum": x.tolist(),
        "device": str(get_device()),
        "current": torch.cuda.current_device(),
    }
    dist.destroy_process_group()
    print(json.dumps(out))
"""


@pytest.mark.gpu
def test_single_process_gpu_picks_nccl() -> None:
    out = _run_script(_SINGLE_GPU, {})
    assert out["first"] == [0, 1]
    assert out["second"] == [0, 1]
    assert out["backend"] == "nccl"
    assert out["sum"] == [3.0, 3.0]
    assert out["device"] == "cuda:0"
    assert out["current"] == 0
