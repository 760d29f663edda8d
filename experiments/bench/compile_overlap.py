"""How much of the backward pass the optimizer steps overlap, eager and under torch.compile.

Each bucket's optimizer step runs when its last gradient arrives. Eager
autograd delivers gradients layer by layer, so the first buckets step (and
launch their gossip) early in the backward pass. A forward compiled whole is
one backward node: every gradient arrives at its end, and nothing overlaps.
Compiling block by block keeps one node per block.

    python -m experiments.bench.compile_overlap [--out docs/results/compile-overlap.json]
    python -m experiments.bench.compile_overlap --device cuda --out OUT.json

Reported per mode: when the first bucket steps, as a fraction of the time from
the start of backward to the last step (0 = right away, 1 = only at the end),
and the median step time. The measurement is kept in ``--out`` and the page
beside it (``compile-overlap.md``) is written from it by :func:`page`, which
``make check-docs`` runs again on the committed file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
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


def page(data: dict[str, Any]) -> str:
    """The results page (markdown) of a measurement as ``main`` keeps it."""
    s, rows = data["setting"], data["modes"]
    eager, whole, block = (rows[m] for m in MODES)
    header = ["mode", "buckets", "first bucket steps at (fraction of backward)"]
    header.append("backward + steps (ms)")
    cells = [
        [m, str(rows[m]["buckets"]), f"{rows[m]['first_step_at']:.2f}"]
        + [f"{rows[m]['backward_ms']:.1f}"]
        for m in MODES
    ]
    pct = "{:.0%}".format
    lines = [
        "# Optimizer steps overlapping backward, eager and compiled",
        "",
        "Measured with `python -m experiments.bench.compile_overlap` (one process, gloo, "
        f"{s['machine']}, Inductor's {s['device'].upper()} backend); the numbers are in "
        "[compile-overlap.json](compile-overlap.json). A bucket steps, and launches its gossip, "
        'when its last gradient arrives; the column "first bucket steps at" is when the first '
        "bucket stepped, as a fraction of the time from the start of backward to the last step.",
        "",
        f"{s['depth']} residual blocks of width {s['width']}, batch {s['batch']}, "
        f"{s['bucket_mb']} MB buckets, {s['device']}, torch {s['torch']}",
        "",
        md_table(header, ["---"] * len(header), cells),
        "",
        "The milliseconds move with whatever else the machine runs; the fractions and the "
        "bucket counts are what this page compares.",
        "",
        "- **Eager:** gradients arrive layer by layer. The first bucket steps "
        f"{pct(eager['first_step_at'])} into backward, and the remaining steps and gossip "
        "launches interleave with the rest of backward.",
        "- **Forward compiled whole** (`model.forward = torch.compile(model.forward)`): the "
        "compiled backward is one autograd node. Every gradient arrives when it ends, so all "
        f"{whole['buckets']} steps run after the backward compute (the first at "
        f"{pct(whole['first_step_at'])} of the span).",
        f"  - {whole['buckets']} buckets against eager's {eager['buckets']}: the gradients "
        "arrive in another order, and the buckets are cut in the order they arrive.",
        "- **Compiled block by block** (`block.forward = torch.compile(block.forward)` for each "
        "residual block): one backward node per block; the first bucket steps "
        f"{pct(block['first_step_at'])} into backward, as eager's {pct(eager['first_step_at'])}.",
        "- **Recommendation:** compile per block (per transformer layer or residual stage) to "
        "keep the optimizer steps and gossip overlapping backward.",
        "- **Not measured:** compiled autograd (`torch._dynamo.config.compiled_autograd`). "
        "Neither this measurement nor the tests cover it.",
        "- **GPU:** on a GPU the same structure holds, with the bucket work on the side stream. "
        "It has not been measured on a GPU yet (`--device cuda`).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add_options(parser, width=1024, depth=8, batch=256, bucket_mb=4.0, warmup=3, steps=10)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/results/compile-overlap.json"),
        help="the measurement (JSON); the page is written beside it as compile-overlap.md",
    )
    parser.add_argument(
        "--machine", default=f"{os.cpu_count()}-core CPU machine", help="how the page names it"
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        rows = {mode: measure(mode, args, device) for mode in MODES}
    finally:
        dist.destroy_process_group()
    setting = {k: getattr(args, k) for k in ("depth", "width", "batch", "bucket_mb")}
    setting |= {"device": device.type, "torch": torch.__version__, "machine": args.machine}
    data = {"setting": setting, "modes": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    text = page(data)
    args.out.with_name("compile-overlap.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
