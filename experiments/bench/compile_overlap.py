"""How much of the backward pass the optimizer steps overlap, eager and under torch.compile.

Each bucket's optimizer step runs when its last gradient arrives. Eager
autograd delivers gradients layer by layer, so the first buckets step (and
launch their gossip) early in the backward pass. A forward compiled whole is
one backward node: every gradient arrives at its end, and nothing overlaps.
Compiling block by block keeps one node per block.

    python -m experiments.bench.compile_overlap            # prints a Markdown table
    python -m experiments.bench.compile_overlap --device cuda

Reported per mode: when the first bucket steps, as a fraction of the time from
the start of backward to the last step (0 = right away, 1 = only at the end),
and the median step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from decent_dp import DecentralizedDataParallel
from experiments.bench.options import add_options
from experiments.report.doc_data import md_table

MODES = ("eager", "compile-whole", "compile-per-block")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def make_model(width: int, depth: int, mode: str, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(width) for _ in range(depth)]).to(device)
    if mode == "compile-whole":
        model.forward = torch.compile(model.forward)  # type: ignore[method-assign]
    elif mode == "compile-per-block":
        for block in model:
            block.forward = torch.compile(block.forward)  # type: ignore[method-assign]
    return model


class StampedSGD(torch.optim.SGD):
    """SGD that notes when it steps."""

    stamps: list[float]

    def __init__(self, params: Any, sync: bool, **kw: Any) -> None:
        super().__init__(params, **kw)
        self.stamps = []
        self.sync = sync

    def step(self, closure: Any = None) -> Any:
        if self.sync:
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())
        return super().step(closure)


def measure(mode: str, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    model = make_model(args.width, args.depth, mode, device)
    sync = device.type == "cuda"
    ddp = DecentralizedDataParallel(
        model,
        lambda pairs: StampedSGD([p for p, _ in pairs], sync=sync, lr=1e-3),
        topology="complete",
        bucket_size_in_mb=args.bucket_mb,
    )
    x = torch.randn(args.batch, args.width, device=device)
    fractions, times = [], []
    for it in range(args.warmup + args.steps):
        out = ddp(x).square().mean()
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out.backward()
        stamps = sorted(s for b in ddp._buckets or [] for s in b.optimizer.stamps[-1:])
        if it >= args.warmup and stamps:
            span = stamps[-1] - start
            fractions.append((stamps[0] - start) / span if span > 0 else 1.0)
            times.append(span)
    ddp.close()
    return {
        "first_step_at": statistics.median(fractions),
        "backward_ms": 1000 * statistics.median(times),
        "buckets": len(ddp.buckets_info),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add_options(parser, width=1024, depth=8, batch=256, bucket_mb=4.0, warmup=3, steps=10)
    args = parser.parse_args()
    device = torch.device(args.device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        rows = [(mode, measure(mode, args, device)) for mode in MODES]
    finally:
        dist.destroy_process_group()
    print(
        f"{args.depth} residual blocks of width {args.width}, batch {args.batch}, "
        f"{args.bucket_mb} MB buckets, {device.type}, torch {torch.__version__}\n"
    )
    header = ["mode", "buckets", "first bucket steps at (fraction of backward)"]
    header.append("backward + steps (ms)")
    cells = [
        [mode, str(r["buckets"]), f"{r['first_step_at']:.2f}", f"{r['backward_ms']:.1f}"]
        for mode, r in rows
    ]
    print(md_table(header, ["---"] * len(header), cells))


if __name__ == "__main__":
    main()
