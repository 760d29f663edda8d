"""What membership costs per step: the elastic wrapper beside the wrapper, on one testbed link.

``sudo python -m experiments.bench.elastic_cost --rate 1gbit --mb 8 --steps 40 --reps 3``
builds a testbed of ``--hosts`` hosts (network namespaces with capped links,
:mod:`experiments.network.testbed`) and, on those same links, trains the same
model with the same data and ``ring`` gossip in two arms, one torchrun per host,
alternating ``--reps`` times (wrapper, elastic, wrapper, elastic, ...):

- ``wrapper``: :class:`decent_dp.DecentralizedDataParallel` on the job's gloo group
  (torchrun's c10d rendezvous on host 0);
- ``elastic``: :class:`decent_dp.elastic.ElasticDataParallel` on a torchft
  lighthouse on host 0, a quorum every ``--quorum-every`` steps (its rendezvous, its
  consensus distance, and the rebuild of the first one), no host lost.

Each host times every step (forward and backward; the wrapper steps inside the
backward pass) of an MLP of about ``--mb`` MiB of parameters on random data;
the first ``--warmup`` steps are left out. An arm's step time is the mean of
its slowest host's steps after the warm-up (quorum steps included, so their
cost is spread over the interval), and ``ratio`` is the elastic arm's over the wrapper's,
per repetition and their median: what the quorums and the elastic bookkeeping
cost a step, the exchange being the same. The JSON goes to ``--out``. The hosts
share this machine's cores, so the milliseconds are this machine's; the ratio
is side by side. ``--worker`` is the per-host entry that torchrun starts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("wrapper", "elastic")
LIGHTHOUSE_PORT = 29510


def _mlp(mb: float) -> nn.Module:
    """Four square layers of together about ``mb`` MiB of float32 parameters."""
    width = max(8, int((mb * 2**20 / 4 / 4) ** 0.5))
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _optim(named: list[tuple[str, torch.Tensor]]) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for _, p in named], lr=1e-3, momentum=0.9)


def _wrap(arm: str, model: nn.Module, args: argparse.Namespace) -> Any:
    """The arm's wrapper; the elastic one joins the lighthouse on host 0."""
    if arm == "wrapper":
        import torch.distributed as dist

        from decent_dp import DecentralizedDataParallel

        dist.init_process_group("gloo")
        return DecentralizedDataParallel(model, _optim, topology="ring")
    from decent_dp.elastic import ElasticDataParallel
    from experiments.network import testbed as tb

    host = int(os.environ.get("TESTBED_HOST", "0"))
    return ElasticDataParallel(
        model,
        _optim,
        topology="ring",
        lighthouse=f"http://{tb.address(0)}:{LIGHTHOUSE_PORT}",
        replica_id=f"h{host}",
        min_replicas=args.hosts,
        timeout_s=60.0,
        quorum_every=args.quorum_every,
        host=tb.address(host),
        log=lambda line: None,
    )


def worker(args: argparse.Namespace) -> None:
    """One host of one arm: time every step, write them to ``--out``/<arm>-<rep>-h<host>.json."""
    torch.manual_seed(0)
    model = _mlp(args.mb)
    width = model[0].in_features
    wrapped = _wrap(args.arm, model, args)
    x, y = torch.randn(args.batch, width), torch.randn(args.batch, width)
    times = []
    try:
        for _ in range(args.steps):
            start = time.perf_counter()
            nn.functional.mse_loss(wrapped(x), y).backward()
            times.append(time.perf_counter() - start)
    finally:
        wrapped.close()
    host = int(os.environ.get("TESTBED_HOST", "0"))
    record = {"arm": args.arm, "rep": args.rep, "host": host, "step_s": times}
    (args.out / f"{args.arm}-{args.rep}-h{host}.json").write_text(json.dumps(record) + "\n")


def step_time(records: list[dict[str, Any]], warmup: int) -> float:
    """The arm's step time: its slowest host's mean step after ``warmup`` (quorums included)."""
    return max(statistics.fmean(r["step_s"][warmup:]) for r in records)


def summarize(records: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Per repetition each arm's step time and the ratio elastic / wrapper, and their medians.

    Args:
        records: Every host's record of every arm and repetition.
        warmup: Steps left out at the start of each.

    Returns:
        ``reps`` (``[{"wrapper": s, "elastic": s, "ratio": r}, ...]``) and the medians
        ``wrapper_step_s``, ``elastic_step_s`` and ``ratio``.
    """
    reps = sorted({r["rep"] for r in records})
    rows = []
    for rep in reps:
        row = {
            arm: step_time([r for r in records if r["rep"] == rep and r["arm"] == arm], warmup)
            for arm in ARMS
        }
        row["ratio"] = row["elastic"] / row["wrapper"]
        rows.append(row)
    return {
        "reps": rows,
        "wrapper_step_s": statistics.median(r["wrapper"] for r in rows),
        "elastic_step_s": statistics.median(r["elastic"] for r in rows),
        "ratio": statistics.median(r["ratio"] for r in rows),
    }


def _run_arm(spec: Any, arm: str, rep: int, args: argparse.Namespace, raw: Path) -> None:
    from experiments.network import testbed as tb

    cmd = [
        "experiments.bench.elastic_cost",
        "--worker",
        f"--arm={arm}",
        f"--rep={rep}",
        f"--hosts={args.hosts}",
        f"--mb={args.mb}",
        f"--steps={args.steps}",
        f"--batch={args.batch}",
        f"--quorum-every={args.quorum_every}",
        f"--out={raw}",
    ]
    tb.launch(
        spec,
        cmd,
        raw / f"{arm}-{rep}",
        torchrun_args=["-m"],
        env={"PYTHONPATH": str(ROOT)},
        timeout_s=args.limit_s,
        quiet=True,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # (flag, type, default, help): the job, then the bench's own settings
    for flag, kind, default, note in (
        ("--hosts", int, 4, "testbed hosts, one process each"),
        ("--rate", str, "1gbit", "each host's link"),
        ("--mb", float, 8.0, "MiB of parameters"),
        ("--steps", int, 40, "steps of each arm and repetition"),
        ("--warmup", int, 10, "first steps left out"),
        ("--batch", int, 32, "samples a step"),
        ("--quorum-every", int, 20, "the elastic arm's quorum interval"),
        ("--reps", int, 3, "repetitions of both arms"),
        ("--limit-s", float, 600.0, "per arm and repetition"),
        (
            "--out",
            Path,
            Path("outputs/elastic_cost"),
            "a .json file, or a folder for cost-RATE.json",
        ),
        ("--runs", Path, None, "the hosts' records and logs (default: beside the JSON)"),
    ):
        p.add_argument(flag, type=kind, default=default, help=note)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return
    from experiments.bench.elastic_faults import _Lighthouse
    from experiments.network import testbed as tb

    reason = tb.missing()
    if reason is not None:
        print(f"elastic_cost: skipped, the testbed needs {reason}", file=sys.stderr)
        return
    out = args.out if args.out.suffix == ".json" else args.out / f"cost-{args.rate}.json"
    raw = args.runs or out.parent / f"{out.stem}-runs"
    raw.mkdir(parents=True, exist_ok=True)
    for old in raw.glob("*-h*.json"):  # a run's records only
        old.unlink()
    spec = tb.Spec(hosts=args.hosts, rate_bps=tb.parse_rate(args.rate), prefix="ddpec")
    lh_args = argparse.Namespace(min_replicas=args.hosts, join_timeout_ms=30000,
                                 heartbeat_timeout_ms=2000)  # fmt: skip
    with tb.testbed(spec) as bed:
        lighthouse = _Lighthouse(lh_args, bed)
        try:
            for rep in range(args.reps):
                for arm in ARMS:
                    _run_arm(bed, arm, rep, args, raw)
        finally:
            lighthouse.close()
    records = [json.loads(f.read_text()) for f in sorted(raw.glob("*-h*.json"))]
    result = {
        "args": {
            k: str(v) for k, v in vars(args).items() if k not in ("worker", "arm", "rep", "runs")
        },
        "load_avg_1m": os.getloadavg()[0],
        **summarize(records, args.warmup),
        "records": records,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"elastic {result['elastic_step_s'] * 1e3:.1f} ms, wrapper "
        f"{result['wrapper_step_s'] * 1e3:.1f} ms a step: ratio {result['ratio']:.3f}; {out}"
    )


if __name__ == "__main__":
    main()
