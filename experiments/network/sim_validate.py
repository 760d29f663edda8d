"""Check the scale simulator against network-emulated CPU runs on this machine.

``python -m experiments.network.sim_validate [--world-sizes 2 4] [--out docs/results/simulate/validation]``
runs ``train.py`` under ``torchrun --standalone`` with gloo on CPU, ``logger=none``:

1. two compute runs per world size, before and after the others (the machine's load
   drifts): ``topology=local-sgd`` with a period longer than the run, so the wrapper never
   communicates; their per-step times (``log.every=1``) give the compute time and its
   step-to-step coefficient of variation (the jitter);
2. for ``allreduce``, ``ring`` and ``one-peer-exp``: the same model and data with an
   emulated link (``network=custom``, :mod:`experiments.network.netem`); ``perf/step_s`` after the
   first metrics window is the measured step time.

It then runs :mod:`experiments.network.sim_model` with the measured compute time and jitter and
the emulated link (one worker per node, efficiency 1, no per-call cost, and each
transfer timed from its own launch as the emulator does), and writes ``validation.md``
and ``validation.json`` with predicted against measured step times.
``--from-runs`` skips training and re-reads the run directories.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.report.doc_data import md_table

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("allreduce", "ring", "one-peer-exp")
# No communication: local-sgd averages only every `period` steps, far beyond the run.
NEVER = 1_000_000

__all__ = ["METHODS", "run_train", "step_times", "model_facts", "predict", "main"]


def _common(args: argparse.Namespace) -> list[str]:
    return [
        "logger=none",
        "log.progress=false",
        "log.consensus_sketch=0",
        "log.consensus_every=0",
        "dataset=synthetic",
        f"dataset.num_samples={args.batch * args.world_sizes[-1] * (args.steps + 1)}",
        f"model={args.model}",
        f"train.batch_size={args.batch}",
        f"train.max_steps={args.steps}",
        "topology.local_world_size=1",
        f"topology.bucket_size_in_mb={args.bucket_mb}",
    ]


def run_train(n: int, overrides: Sequence[str], run_dir: Path, timeout: float = 1800) -> Path:
    """One ``torchrun --standalone --nproc_per_node=n train.py`` run into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        "train.py",
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"run {run_dir} failed ({proc.returncode}): {' | '.join(tail)}")
    print(f"  {run_dir.name}: {time.time() - start:.0f} s", flush=True)
    return run_dir


def step_times(run_dir: Path, skip: int = 1) -> list[float]:
    """``perf/step_s`` of every metrics window after the first ``skip`` windows."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    values = [x["perf/step_s"] for x in lines if "perf/step_s" in x]
    if len(values) <= skip:
        raise ValueError(f"{run_dir}: {len(values)} metrics windows, need more than {skip}")
    return values[skip:]


def model_facts(model: str, batch: int, steps: int = 30) -> dict[str, float]:
    """Parameter bytes and the backward's share of a step, timed in this process."""
    import torch

    from experiments.models import build_model

    torch.manual_seed(0)
    net = build_model({"name": model}, num_classes=10, in_channels=3, image_size=32)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    fwd, bwd, tot = [], [], []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if i >= 3:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            tot.append(t3 - t0)
    nbytes = sum(p.numel() * p.element_size() for p in net.parameters())
    return {
        "model_bytes": float(nbytes),
        "backward_frac": statistics.median(bwd) / statistics.median(tot),
    }


def predict(
    method: str,
    n: int,
    compute_s: float,
    cv: float,
    facts: dict[str, float],
    bandwidth_gbps: float,
    latency_ms: float,
    bucket_mb: float,
    steps: int = 400,
    efficiency: float = 1.0,
    topology_kwargs: dict[str, Any] | None = None,
    collective_ms: float = 0.0,
    comm_cpu_s: float = 0.0,
) -> float:
    """Simulated step time of ``method`` on ``n`` emulated workers.

    ``efficiency`` is the share of the line rate a collective's payload gets
    (1 for the emulator's link; what the testbed measured for a real one),
    ``collective_ms`` a fixed cost of each collective call, and ``comm_cpu_s``
    the CPU seconds per step that moving the bytes takes from training on
    shared cores, added to ``compute_s`` (0 where hosts have cores of their own).
    """
    from decent_dp.topo import TopologyReg
    from experiments.network.sim_model import (
        Cluster,
        Jitter,
        Link,
        MonteCarlo,
        Workload,
        simulate_allreduce,
        simulate_gossip,
    )

    link = Link("emulated", bandwidth_gbps, latency_ms, efficiency=efficiency,
                collective_ms=collective_ms)  # fmt: skip
    cluster = Cluster(n, 1, link, link, collective_start="own")
    # the training loop gives torch DDP an explicit bucket_cap_mb: no small first bucket
    work = Workload(facts["model_bytes"], compute_s + comm_cpu_s, facts["backward_frac"], bucket_mb,
                    None)  # fmt: skip
    mc = MonteCarlo(Jitter("lognormal", cv), steps=steps)
    if method == "allreduce":
        return simulate_allreduce(work, cluster, mc).t_iter_s
    rounds = TopologyReg.create(method, n, 1, **(topology_kwargs or {})).rounds
    return simulate_gossip(rounds, work, cluster, mc).t_iter_s


def _table(rows: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# Simulator against network-emulated CPU runs",
        "",
        f"`{args.model}` on synthetic 3x32x32 images, batch {args.batch} per worker, "
        f"{args.steps} steps, wrapper buckets of {args.bucket_mb} MiB; gloo on this machine's "
        f"CPU with one thread per worker; emulated link {args.bandwidth_gbps:g} Gb/s per "
        f"worker, {args.latency_ms:g} ms per hop. Compute and jitter are measured by a run of "
        "the same size that never communicates (local-sgd with an endless period), run before and "
        "after the others.",
        "",
    ]
    header = [
        "n",
        "method",
        "compute (ms)",
        "jitter cv",
        "predicted (ms)",
        "measured (ms)",
        "error",
    ]
    cells = []
    for r in rows:
        ms = [f"{r[k] * 1e3:.1f}" for k in ("compute_s", "predicted_s", "measured_s")]
        cells.append(
            [str(r["n"]), r["method"], ms[0], f"{r['cv']:.2f}", *ms[1:], f"{r['error']:+.1%}"]
        )
    worst = max(rows, key=lambda r: abs(r["error"]))
    lines += [
        md_table(header, ["---:", "---", *["---:"] * 5], cells),
        "",
        f"Largest error {worst['error']:+.1%} ({worst['method']}, n={worst['n']}); "
        f"mean absolute error {statistics.mean(abs(r['error']) for r in rows):.1%}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m experiments.network.sim_validate")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--bucket-mb", type=float, default=0.05)
    parser.add_argument("--bandwidth-gbps", type=float, default=0.005)
    parser.add_argument("--latency-ms", type=float, default=0.5)
    parser.add_argument("--runs", default="outputs/sim_validate", help="run directories")
    parser.add_argument("--out", default="docs/results/simulate/validation")
    parser.add_argument("--from-runs", action="store_true", help="re-read the runs only")
    args = parser.parse_args(argv)
    runs, out = Path(args.runs), Path(args.out)
    common = _common(args)
    net = [
        "network=custom",
        f"network.bandwidth_gbps={args.bandwidth_gbps}",
        f"network.latency_ms={args.latency_ms}",
    ]
    facts = model_facts(args.model, args.batch)
    rows = []
    for n in args.world_sizes:
        base = runs / f"n{n}"
        compute_only = ["topology=local-sgd", f"topology.kwargs.period={NEVER}", "log.every=1"]
        if not args.from_runs:
            print(f"world size {n}:", flush=True)
            run_train(n, [*common, *compute_only], base / "compute")
            for method in METHODS:
                run_train(n, [*common, *net, f"topology={method}", "log.every=10"], base / method)
            # compute again after the emulated runs: the machine's load drifts
            run_train(n, [*common, *compute_only], base / "compute_after")
        per_step = [
            *step_times(base / "compute", skip=5),
            *step_times(base / "compute_after", skip=5),
        ]
        compute = statistics.mean(per_step)
        cv = statistics.pstdev(per_step) / compute
        for method in METHODS:
            measured = statistics.mean(step_times(base / method))
            pred = predict(
                method,
                n,
                compute,
                cv,
                facts,
                args.bandwidth_gbps,
                args.latency_ms,
                args.bucket_mb,
            )
            rows.append(
                {
                    "n": n,
                    "method": method,
                    "compute_s": compute,
                    "cv": cv,
                    "predicted_s": pred,
                    "measured_s": measured,
                    "error": pred / measured - 1.0,
                }
            )
    out.mkdir(parents=True, exist_ok=True)
    text = _table(rows, args)
    (out / "validation.md").write_text(text)
    payload = {"args": vars(args), "model": facts, "rows": rows}
    (out / "validation.json").write_text(json.dumps(payload, indent=1))
    print(text)
    if any(not math.isfinite(r["error"]) for r in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
