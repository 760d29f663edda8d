"""Peak memory per rank: the wrapper over a device mesh (FSDP2 shards) against the unsharded one.

``python -m experiments.bench.sharded_memory`` (part of ``make bench``) runs one
GPT on ``--world`` CPU processes (gloo, loopback) in one arm per entry of
``--arms``: ``1`` is the plain wrapper (every rank holds the model, its
gradients, the optimizer states and a gossip buffer); ``S > 1`` shards each
replica over ``S`` ranks with ``fully_shard`` and gossips between the
``world / S`` replicas (``ring``); ``hS`` is torch's HSDP of the same shards
(``fully_shard`` over the whole mesh, gradients all-reduced between the
replicas, one AdamW stepped after the backward pass), the baseline without
gossip. Each rank measures its own peak resident memory over
building, wrapping and ``--steps`` AdamW steps: the kernel's high-water mark
(``VmHWM``), reset (``/proc/self/clear_refs``) before the model is built, less
the resident memory at that point. It also counts the bytes its model
state holds (local parameters, optimizer states, gossip buffers), which the
peak should follow. Rows go to ``--out`` as JSON and a table is printed.

CPU only (Linux: ``/proc``). The peak includes everything the step allocates:
FSDP's all-gathered blocks and activations as well as the model state.

The allocator. By default (``--allocator mmap``) every rank starts with
``MALLOC_MMAP_THRESHOLD_=65536``: glibc then maps each block of 64 KiB or more
on its own and returns it when freed, so that resident memory follows the
live tensors. With ``--allocator default`` glibc keeps freed blocks in its
heap (and the wrapper raises its thresholds further, see
:mod:`decent_dp._engine.cpu_memory`): FSDP's all-gathered and reduce-scattered
buffers, allocated and freed in every block of every step, then stay
resident, and the peak measures the allocator more than the tensors (on a
63M-parameter GPT, 4 ranks: 1281 MB unsharded, 1204 MB with 4 shards, although the
model state per rank fell from 961 to 240 MB).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from experiments.bench.options import add_options
from experiments.report.doc_data import md_table

DEFAULT_OUT = Path("docs/results/sharded/bench.json")


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak() -> int:
    """Reset the high-water mark of resident memory; return the resident kB now."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS")


def _warm_up(world: int) -> None:
    """Run a tiny model through both wrappers first, in every arm alike.

    FSDP, DTensor and the optimizers load code (and fill caches) on first use;
    without this, an arm's peak would count that code rather than its tensors.
    """
    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_adamw
    from experiments.train.sharding import build_mesh, shard_model

    shards = 2 if world % 2 == 0 else 1
    mesh2d = build_mesh(shards, world, "cpu") if shards > 1 else None
    for mesh, hsdp in ((None, False), (mesh2d, False), (mesh2d, True)):
        torch.manual_seed(0)
        tiny: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
        if mesh is not None:
            tiny = shard_model(tiny, mesh, hsdp=hsdp)
        if hsdp:
            opt = torch.optim.AdamW(tiny.parameters(), lr=1e-3)
            for _ in range(2):
                tiny(torch.ones(2, 8)).sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            continue
        ddp = DecentralizedDataParallel(
            tiny,
            optim_fn=lambda pairs: optim_fn_adamw(pairs, lr=1e-3),
            topology="ring",
            device_mesh=mesh,
        )
        for _ in range(2):
            ddp(torch.ones(2, 8)).sum().backward()
        ddp.close()


def _model(args: argparse.Namespace) -> torch.nn.Module:
    from experiments.models.gpt import GPT, GPT_TINY

    torch.manual_seed(0)
    sizes = {k: getattr(args, k) for k in ("n_layer", "n_head", "n_embd")}  # --n-layer ...
    return GPT(dataclasses.replace(GPT_TINY, block_size=args.seq, vocab_size=args.vocab, **sizes))


def _state_bytes(ddp: Any) -> dict[str, int]:
    engine = ddp._engine
    params = sum(p.numel() * p.element_size() for p in engine.params)
    optim = sum(
        v.numel() * v.element_size()
        for b in engine.buckets or []
        if b.optimizer is not None
        for st in b.optimizer.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor)
    )
    comm = sum(b.comm.numel() * b.comm.element_size() for b in engine.buckets or [])
    return {"param_bytes": params, "optim_bytes": optim, "comm_bytes": comm}


def _hsdp_state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    params = sum(local(p).numel() * p.element_size() for p in model.parameters())
    optim = sum(
        local(v).numel() * v.element_size()
        for st in opt.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor)
    )
    return {"param_bytes": params, "optim_bytes": optim, "comm_bytes": 0}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, arm: str, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from decent_dp import DecentralizedDataParallel
        from decent_dp.optim import optim_fn_adamw
        from experiments.train.sharding import build_mesh, shard_model

        hsdp = arm.startswith("h")
        shards = int(arm.lstrip("h"))
        _warm_up(world)
        base = _reset_peak()
        mesh = None
        if shards > 1:
            # the FSDP recipe for a model larger than a worker: no rank ever holds it whole
            mesh = build_mesh(shards, world, "cpu")
            with torch.device("meta"):
                model = _model(args)
            model = shard_model(model, mesh, hsdp=hsdp)
            model.to_empty(device="cpu")
            with torch.no_grad():
                model._init_weights()  # type: ignore[operator]
        else:
            model = _model(args)
        opt = None
        if hsdp:
            net: Any = model
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        else:
            net = DecentralizedDataParallel(
                model,
                optim_fn=lambda pairs: optim_fn_adamw(pairs, lr=1e-3),
                topology="ring",
                device_mesh=mesh,
            )
        g = torch.Generator().manual_seed(rank)
        times = []
        for _ in range(args.steps):
            x = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=g)
            t0 = time.perf_counter()
            _, loss = net(x[:, :-1], x[:, 1:])
            loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        peak = _status_kb("VmHWM") - base
        row = {
            "arm": "hsdp" if hsdp else ("gossip" if shards > 1 else "unsharded"),
            "shards": shards,
            "replicas": world // shards,
            "rank": rank,
            "peak_mb": peak / 1024,
            "step_s": statistics.median(times[1:] or times),
            **(_hsdp_state_bytes(model, opt) if opt is not None else _state_bytes(net)),
            "model_params": sum(p.numel() for p in model.parameters()),
        }
        if opt is None:
            net.close()
        out.put(row)
    finally:
        dist.destroy_process_group()


def run_arm(args: argparse.Namespace, arm: str) -> list[dict[str, Any]]:
    """Every rank's row of one arm (``S`` or ``hS``, see the module docstring)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    ctx = mp.get_context("spawn")  # each rank starts from a fresh interpreter
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, args.world, port, args, arm, queue))
        for r in range(args.world)
    ]
    for p in procs:
        p.start()
    rows = [queue.get(timeout=args.timeout) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return sorted(rows, key=lambda r: r["rank"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_options(parser, world=4)
    parser.add_argument(
        "--arms",
        default="1,2,4,h2,h4",
        help="comma-separated: S (the wrapper, S ranks per replica) or hS (HSDP)",
    )
    add_options(parser, steps=3, n_layer=8, n_head=8, n_embd=512, vocab=8192, seq=64, batch=2)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per arm")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--allocator",
        choices=("mmap", "default"),
        default="mmap",
        help="mmap: MALLOC_MMAP_THRESHOLD_=65536 in every rank (resident memory follows the "
        "live tensors); default: glibc's own heap (see the module docstring)",
    )
    args = parser.parse_args(argv)
    if args.allocator == "mmap":
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by each spawned rank's glibc
    rows = []
    for arm in args.arms.split(","):
        rows.extend(run_arm(args, arm))
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    args.out.write_text(json.dumps({"args": meta, "rows": rows}, indent=2) + "\n")
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    """Per arm: ranks, mean and max peak MB per rank, state bytes per rank, step time."""
    header = ["arm", "shards x replicas", "peak MB per rank (mean, max)"]
    header += ["params + optimizer + gossip MB per rank", "step s"]
    cells = []
    keys = sorted({(r.get("arm", ""), r["shards"]) for r in rows}, key=lambda k: (k[1], k[0]))
    for name, shards in keys:
        arm = [r for r in rows if r.get("arm", "") == name and r["shards"] == shards]
        peaks = [r["peak_mb"] for r in arm]
        state = statistics.mean(r["param_bytes"] + r["optim_bytes"] + r["comm_bytes"] for r in arm)
        peak = f"{statistics.mean(peaks):.1f}, {max(peaks):.1f}"
        step = f"{statistics.median(r['step_s'] for r in arm):.3f}"
        cells.append([name, f"{shards} x {arm[0]['replicas']}", peak, f"{state / 2**20:.1f}", step])
    return md_table(header, ["---"] * len(header), cells)


if __name__ == "__main__":
    sys.exit(main())
