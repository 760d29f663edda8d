"""Run a function on N real gloo worker processes and collect what each returns."""

from __future__ import annotations

import datetime
import os
import queue as queue_mod
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# optimizers import torch._dynamo lazily and that takes seconds: pay it once, before forking
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return {"__tensor__": obj.detach().cpu().tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_plain(v) for v in obj)
    return obj


def _from_plain(obj: Any) -> Any:
    if isinstance(obj, dict) and "__tensor__" in obj:
        return torch.tensor(obj["__tensor__"], dtype=getattr(torch, obj["dtype"].split(".")[-1]))
    if isinstance(obj, dict):
        return {k: _from_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_plain(v) for v in obj)
    return obj


def _worker(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    out: Any,
    local_world_size: int,
    init: bool,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank % local_world_size),
        LOCAL_WORLD_SIZE=str(local_world_size),
    )
    torch.set_num_threads(1)
    try:
        if init:
            dist.init_process_group(
                "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60)
            )
        result = fn(rank, world_size, *args)
        out.put((rank, "ok", _to_plain(result)))
    except BaseException as exc:  # report every failure to the parent
        out.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 180.0,
    local_world_size: int | None = None,
    init: bool = True,
    start_method: str = "fork",
) -> list[tuple[str, Any]]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo processes.

    Returns one ``(status, value)`` per rank: ``("ok", result)`` or
    ``("error", "ExcType: message ...")``. A worker that does not finish within
    ``timeout`` is killed and reported as ``("hang", None)``. Forking is fast
    because the children inherit the imported modules; use ``"spawn"`` for CUDA.
    """
    ctx = mp.get_context(start_method)
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, port, fn, args, out, local_world_size or world_size, init),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, tuple[str, Any]] = {}
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
    while len(results) < world_size:
        left = (deadline - datetime.datetime.now()).total_seconds()
        if left <= 0:
            break
        try:
            rank, status, value = out.get(timeout=min(left, 1.0))
            results[rank] = (status, _from_plain(value) if status == "ok" else value)
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs) and out.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return [results.get(r, ("hang", None)) for r in range(world_size)]


def ok_values(results: list[tuple[str, Any]]) -> list[Any]:
    """The per-rank values, failing with every rank's error when any rank failed."""
    bad = [f"rank {r}: {s}: {v}" for r, (s, v) in enumerate(results) if s != "ok"]
    if bad:
        raise AssertionError("distributed run failed:\n" + "\n".join(bad))
    return [v for _, v in results]
