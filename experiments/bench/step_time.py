"""Step-time benchmark: local (no communication) vs torch DDP vs the wrapper on every topology.

``python -m experiments.bench.step_time`` (or ``make bench``) launches ``torchrun`` once
per world size (2 and 4 processes on CPU with gloo by default). Inside, every
variant trains the same model on the same data side by side in one run, so
the ratios are comparable even on a noisy machine:

1. ``local``: each process trains alone, no communication (the compute-only limit);
2. ``torch-ddp``: ``torch.nn.parallel.DistributedDataParallel`` + an ordinary optimizer;
3. ``decent/<topology>``: :class:`DecentralizedDataParallel` on each topology.

It prints the median step time, the ratio to torch DDP and to local, and where
the wrapper's time goes (waiting for gossip, mixing, optimizer), and writes
the rows to ``--out`` as JSON.

``--device cuda`` runs every process on the first visible GPU, still with
gloo (which moves CUDA tensors itself), so one GPU is enough for 1, 2 and 4
processes; each timed step ends with ``torch.cuda.synchronize()``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from experiments.report.doc_data import md_table

# decent_dp is imported inside the functions that use it: experiments.bench.upstream
# reuses this module under decent-dp 0.2.3, which has the same import name
MODELS = ("mlp", "resnet18")


def build(name: str) -> tuple[nn.Module, tuple[int, ...], int]:
    """Model, input shape per sample, number of classes."""
    torch.manual_seed(0)
    if name == "mlp":
        # about 9.5M parameters: communication-heavy at a small batch
        model = nn.Sequential(
            nn.Linear(512, 2048),
            nn.ReLU(),
            nn.Linear(2048, 2048),
            nn.ReLU(),
            nn.Linear(2048, 2048),
            nn.ReLU(),
            nn.Linear(2048, 10),
        )
        return model, (512,), 10
    from experiments.models import build_model

    return (
        build_model({"name": "resnet18_cifar"}, num_classes=10, in_channels=3, image_size=32),
        (3, 32, 32),
        10,
    )


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def synthetic_batches(
    batch: int, shape: tuple[int, ...], classes: int, seed: int, n: int = 4
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` random (input, label) batches that a benchmark cycles through."""
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch, *shape, generator=gen),
            torch.randint(0, classes, (batch,), generator=gen),
        )
        for _ in range(n)
    ]


def timed_steps(
    step: Callable[[int], None],
    warmup: int,
    steps: int,
    after_warmup: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Run ``warmup`` then ``steps`` steps and time them.

    Returns:
        ``median_step_s``: the median step time of the slowest rank;
        ``cpu_step_s``: CPU seconds per step of a whole process (every thread,
        gloo's included), the mean over ranks. Other users of the machine barely
        change it, so it tells the work apart from the waiting for a core;
        ``faults_per_step``: minor page faults per step of a process, the mean
        over ranks (memory the allocator gave back to the kernel and takes again).
    """
    for i in range(warmup):
        step(i)
    if after_warmup is not None:
        after_warmup()
    dist.barrier()
    times = []
    cpu0, faults0 = time.process_time(), _minor_faults()
    for i in range(steps):
        t0 = time.perf_counter()
        step(warmup + i)
        times.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu0) / steps
    faults = (_minor_faults() - faults0) / steps
    dist.barrier()
    # the slowest rank sets the pace
    med = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    means = torch.tensor([cpu, faults], dtype=torch.float64)
    dist.all_reduce(means)
    means /= dist.get_world_size()
    return {
        "median_step_s": float(med.item()),
        "cpu_step_s": float(means[0]),
        "faults_per_step": float(means[1]),
    }


def _minor_faults() -> int:
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_variant(
    variant: str,
    model_name: str,
    batch: int,
    warmup: int,
    steps: int,
    local_world_size: int,
    device: str = "cpu",
) -> dict[str, Any]:
    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_sgd

    rank, world = dist.get_rank(), dist.get_world_size()
    model, shape, classes = build(model_name)
    model = model.to(device)
    data = [
        (x.to(device), y.to(device)) for x, y in synthetic_batches(batch, shape, classes, seed=rank)
    ]
    cuda = torch.device(device).type == "cuda"
    loss_fn = nn.CrossEntropyLoss()
    optim_fn = partial(optim_fn_sgd, lr=0.01, momentum=0.9, weight_decay=0.0)
    wrapper: DecentralizedDataParallel | None = None
    if variant == "local":
        net: nn.Module = model
        opt = optim_fn(list(model.named_parameters()))
    elif variant == "torch-ddp":
        net = nn.parallel.DistributedDataParallel(model)
        opt = optim_fn(list(model.named_parameters()))
    else:
        topo = variant.split("/", 1)[1]
        wrapper = DecentralizedDataParallel(
            model, optim_fn, topology=topo, local_world_size=local_world_size
        )
        net = wrapper

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        loss_fn(net(x), y).backward()
        if wrapper is None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()  # the step is over when the device is done

    timed = timed_steps(step, warmup, steps, wrapper.pop_timers if wrapper is not None else None)
    timers = wrapper.pop_timers() if wrapper is not None else {}
    row: dict[str, Any] = {
        "model": model_name,
        "params_m": n_params(model) / 1e6,
        "world_size": world,
        "batch": batch,
        "variant": variant,
        "median_step_s": timed["median_step_s"],
    }
    if cuda:
        row["device"] = torch.cuda.get_device_name()
    for key, value in timers.items():
        row[key.replace("comm/", "") + "_per_step"] = value / steps
    if wrapper is not None:
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        extra = (
            sum(b["numel"] for b in wrapper.buckets_info) * next(model.parameters()).element_size()
        )
        row["extra_memory_x_params"] = extra / param_bytes
    return row


def median_row(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The first row with every float replaced by its median over the repeated runs ``reps``."""
    row = dict(reps[0])
    for key, value in reps[0].items():
        if isinstance(value, float):
            row[key] = statistics.median(r[key] for r in reps)
    return row


def add_common_arguments(parser: argparse.ArgumentParser, batch: int, out: str) -> None:
    """The options of both step-time benchmarks: batch, threads, output file, worker flag."""
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--out", default=out)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def worker(args: argparse.Namespace) -> None:
    """One rank: every variant that fits this world size, in turns, ``--repeats`` times."""
    from decent_dp.topo import TopologyReg

    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.cuda.set_device(0)  # every process on the first GPU; gloo moves the tensors
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    local = 2 if world % 2 == 0 and world >= 4 else world
    variants = ["local", "torch-ddp"]
    for name in TopologyReg.names():
        try:
            TopologyReg.create(name, world, local)
        except ValueError:
            continue
        variants.append(f"decent/{name}")
    if args.with_noview:
        variants += [
            f"decent-noview/{v.split('/')[1]}" for v in variants if v.startswith("decent/")
        ]
    rows = []
    for model_name in args.models:
        steps = args.steps if model_name == "mlp" else max(3, args.steps // 4)
        batch = args.batch if model_name == "mlp" else 8
        # variants take turns, `repeats` times, so a slow spell of the machine hits all of them
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for rep in range(args.repeats):
            for variant in variants:
                r = time_variant(variant, model_name, batch, args.warmup, steps, local, args.device)
                runs[variant].append(r)
                if dist.get_rank() == 0:
                    print(
                        f"  [{world} procs, round {rep + 1}] {model_name:9s} {variant:28s} "
                        f"{r['median_step_s'] * 1e3:8.1f} ms",
                        flush=True,
                    )
        rows += [{**median_row(runs[v]), "repeats": len(runs[v])} for v in variants]
    if dist.get_rank() == 0:
        with open(args.out_part, "w") as f:
            json.dump(rows, f)
    gc.collect()  # free DDP reducers before their process group goes away
    dist.destroy_process_group()


def table(rows: list[dict[str, Any]]) -> str:
    header = ["model", "procs", "variant", "median step (ms)", "vs torch DDP", "vs local"]
    header += ["wait (ms)", "mix (ms)", "optim (ms)", "extra mem (x params)"]
    ref = {(x["model"], x["world_size"], x["variant"]): x["median_step_s"] for x in rows}
    cells = []
    for r in rows:
        step = r["median_step_s"]
        ddp = ref[(r["model"], r["world_size"], "torch-ddp")]
        local = ref[(r["model"], r["world_size"], "local")]

        def ms(key: str, r: dict[str, Any] = r) -> str:
            return f"{r[key] * 1e3:.1f}" if key in r else ""

        mem = f"{r['extra_memory_x_params']:.2f}" if "extra_memory_x_params" in r else ""
        name = [f"{r['model']} ({r['params_m']:.1f}M)", str(r["world_size"]), r["variant"]]
        ratios = [f"{step * 1e3:.1f}", f"{step / ddp:.2f}", f"{step / local:.2f}"]
        phases = [ms(f"{k}_s_per_step") for k in ("wait", "mix", "optim")]
        cells.append([*name, *ratios, *phases, mem])
    return md_table(header, ["---", "---:", "---", *["---:"] * 7], cells)


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring; ``--worker`` runs one rank instead."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all variants")
    parser.add_argument(
        "--with-noview", action="store_true", help="also time param_as_bucket_view=False"
    )
    add_common_arguments(parser, batch=16, out="outputs/bench/bench.json")
    parser.add_argument("--out-part", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: every process on GPU 0"
    )
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    for p in args.procs:
        if p < 1:
            parser.error(f"--procs {p} is invalid; process counts must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda is invalid here: torch.cuda.is_available() is False")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    torchrun = Path(sys.executable).with_name("torchrun")
    for procs in args.procs:
        part = out.with_suffix(f".{procs}.json")
        where = "CPU" if args.device == "cpu" else "CUDA tensors on GPU 0"
        print(f"== {procs} processes ({where}, gloo, {args.threads} thread(s) each)", flush=True)
        cmd = [
            str(torchrun), "--standalone", f"--nproc_per_node={procs}", "-m", "experiments.bench.step_time", "--worker",
            "--out-part", str(part), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--batch", str(args.batch), "--threads", str(args.threads), "--repeats", str(args.repeats),
            "--models", *args.models, *(["--with-noview"] if args.with_noview else []),
            "--device", args.device,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        subprocess.run(cmd, check=True, env=env)
        rows += json.loads(part.read_text())
        part.unlink()  # merged into --out below
    out.write_text(json.dumps(rows, indent=1))
    print()
    print(table(rows))
    print(f"\nrows written to {out}")


if __name__ == "__main__":
    main()
