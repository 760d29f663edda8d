"""Elastic gossip's step time on capped links: the wrapper's in-backward path against a step after it.

``python -m experiments.bench.elastic_overlap --rate 100mbit --hosts 4`` (as root)
builds the testbed (:mod:`experiments.network.testbed`: one network namespace a
host, links capped at ``--rate``, no default route), starts a torchft lighthouse
on host 0 and, ``--reps`` times in turn, the same job on each path:

- ``backward``: :class:`decent_dp.elastic.ElasticDataParallel`, each bucket's
  optimizer step inside the backward pass and its gossip overlapping the rest
  of the backward pass and the next forward;
- ``step``: :class:`decent_dp.elastic.ElasticGossip`, the optimizer step and
  the exchange of the whole model after the backward pass (the exchange
  overlaps the optimizer step only).

Every host trains the same MLP (``--mb`` MiB of float32 parameters, random
data, SGD) with ``ring``, a quorum every ``--quorum-every`` steps. Each host
reports the time of each step; the job's step time is the median over the
steps after ``--warmup`` of the slowest host's. The two paths alternate in one
run, so the ratio is measured side by side; the seconds are this machine's,
whose cores the hosts share.

``--worker`` is one host's process (the bench starts it in the host's namespace).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PATHS = ("backward", "step")


def _mlp(mb: float, width: int) -> Any:
    import torch
    from torch import nn

    layers = max(1, round(mb * 2**20 / 4 / (width * width)))
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, 1))


def worker(args: argparse.Namespace) -> None:
    """One host: train ``--steps`` steps on ``--path``; write each step's seconds."""
    import torch

    from decent_dp.elastic import ElasticDataParallel, ElasticGossip

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = _mlp(args.mb, args.width)
    g = torch.Generator().manual_seed(int(args.rid[1:]))
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randn(args.batch, 1, generator=g)
    common: dict[str, Any] = {
        "topology": "ring",
        "lighthouse": args.lighthouse,
        "replica_id": args.rid,
        "min_replicas": args.hosts,
        "timeout_s": 60.0,
        "quorum_every": args.quorum_every,
        "host": args.host,
        "consensus": False,
        "log": lambda line: None,
    }
    times = []
    if args.path == "backward":
        edp = ElasticDataParallel(
            model,
            lambda named: torch.optim.SGD([p for _, p in named], lr=1e-3),
            bucket_size_in_mb=args.bucket_mb,
            **common,
        )
        for _ in range(args.steps):
            t0 = time.perf_counter()
            edp.quorum()
            ((edp(x) - y) ** 2).mean().backward()
            times.append(time.perf_counter() - t0)
        edp.close()
    else:
        gossip = ElasticGossip(model, torch.optim.SGD(model.parameters(), lr=1e-3), **common)
        for _ in range(args.steps):
            t0 = time.perf_counter()
            gossip.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            gossip.step()
            times.append(time.perf_counter() - t0)
        gossip.close()
    Path(args.out).write_text(json.dumps({"rid": args.rid, "path": args.path, "times": times}))


def _one_job(args: argparse.Namespace, bed: Any, path: str, out: Path, port: int) -> dict:
    from experiments.network import testbed as tb
    from experiments.network.testbed.launch import host_env

    lh = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            tb.host_ns(0, bed.prefix),
            str(Path(sys.executable).with_name("torchft_lighthouse")),
        ]
        + ["--bind", f"[::]:{port}", "--min_replicas", str(args.hosts)]
        + ["--join_timeout_ms", "10000", "--quorum_tick_ms", "50"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs = []
    try:
        for i in range(args.hosts):
            cmd = ["ip", "netns", "exec", tb.host_ns(i, bed.prefix), sys.executable]
            cmd += ["-m", "experiments.bench.elastic_overlap", "--worker", "--path", path]
            cmd += ["--rid", f"h{i}", "--lighthouse", f"http://{tb.address(0)}:{port}"]
            cmd += ["--host", tb.address(i), "--out", str(out / f"h{i}.json")]
            for key in ("hosts", "steps", "mb", "width", "batch", "quorum_every", "bucket_mb"):
                cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
            env = host_env(i, bed, {"PYTHONPATH": str(ROOT)})
            procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT))
        for p in procs:
            if p.wait(timeout=args.limit_s) != 0:
                raise RuntimeError(f"a host of the {path} job exited with {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        lh.kill()
        lh.wait()
    hosts = [json.loads((out / f"h{i}.json").read_text()) for i in range(args.hosts)]
    slowest = [max(step) for step in zip(*(h["times"] for h in hosts))][args.warmup :]
    return {"path": path, "step_s": statistics.median(slowest), "steps": len(slowest)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--path", choices=PATHS, default="backward")
    p.add_argument("--rid", default="h0")
    p.add_argument("--lighthouse", default="")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--out", type=Path, default=Path("docs/results/elastic/overlap.json"))
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--mb", type=float, default=8.0, help="MiB of parameters")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--quorum-every", type=int, default=20)
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--limit-s", type=float, default=600.0)
    p.add_argument("--port", type=int, default=29810)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return
    from experiments.network import testbed as tb

    why = tb.missing()
    if why is not None:
        raise SystemExit(f"elastic_overlap: the testbed cannot be built here: {why}")
    spec = tb.Spec(hosts=args.hosts, rate_bps=tb.parse_rate(args.rate), prefix="ddpov")
    runs: list[dict[str, Any]] = []
    scratch = Path("/tmp") / f"elastic_overlap_{os.getpid()}"
    with tb.testbed(spec) as bed:
        for rep in range(args.reps):
            for path in PATHS:  # alternating: side by side under the same load
                out = scratch / f"{path}-{rep}"
                out.mkdir(parents=True, exist_ok=True)
                run = _one_job(args, bed, path, out, args.port + len(runs))
                run["rep"] = rep
                runs.append(run)
                print(f"elastic_overlap: {path} rep {rep}: {run['step_s'] * 1e3:.1f} ms a step")
    med = {
        path: statistics.median(r["step_s"] for r in runs if r["path"] == path) for path in PATHS
    }
    result = {
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "path", "rid", "out")},
        "runs": runs,
        "step_s": med,
        "step_over_backward": med["step"] / med["backward"],
        "load_avg_1m": os.getloadavg()[0],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"elastic_overlap: backward {med['backward'] * 1e3:.1f} ms, step {med['step'] * 1e3:.1f} ms "
        f"a step; step / backward = {result['step_over_backward']:.2f} ({args.out})"
    )


if __name__ == "__main__":
    main()
