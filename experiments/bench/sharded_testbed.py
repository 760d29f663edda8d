"""Sharded replicas on the testbed: gossip between replicas against HSDP's all-reduce.

``python -m experiments.bench.sharded_testbed run`` trains the tiny GPT of
``experiment=lm_quick`` with ``train.shard_size=S`` on the testbed
(:mod:`experiments.network.testbed`: hosts as network namespaces, each host's
link capped both ways), one replica of ``S`` ranks per host, so that FSDP's
all-gathers and reduce-scatters stay on the host's loopback and only the
traffic between replicas crosses the links. Arms: the wrapper's gossip between
the replicas (``ring``, ``one-peer-exp``) and torch's HSDP (``topology=allreduce``:
the same FSDP model, gradients all-reduced between the replicas), each for every
seed, the same steps and tokens. ``... table`` writes the measured table
(tokens/s, bytes sent per host link per step, final evaluation loss at equal
tokens) as ``study.md`` and ``study.json``. Needs root (network namespaces) and
a token folder (``--data``, see ``experiment=lm_quick``).

With 2 replicas, ``ring`` and ``one-peer-exp`` pair the same two replicas at
every step: the same algorithm, run twice.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from experiments.report.doc_data import md_table

ARMS = ("ring", "one-peer-exp", "allreduce")
DEFAULT_OUT = Path("docs/results/sharded")


def run(args: argparse.Namespace) -> None:
    """Every arm and seed, one testbed run each, into ``--runs/<hosts>x<S>/<arm>/seed<k>``."""
    for arm in args.arms.split(","):
        for seed in range(args.seeds):
            out = Path(args.runs) / f"{args.hosts}x{args.shard_size}" / arm / f"seed{seed}"
            if (out / "summary.json").exists():
                continue  # done by an earlier call
            cmd = [
                sys.executable,
                "-m",
                "experiments.network.testbed",
                "--prefix",
                args.prefix,
                "run",
                "--hosts",
                str(args.hosts),
                "--procs-per-host",
                str(args.shard_size),
                "--rate",
                args.rate,
                "--out",
                str(out),
                "--timeout-s",
                str(args.timeout_s),
                "--",
                "experiment=lm_quick",
                f"dataset.root={args.data}",
                f"train.shard_size={args.shard_size}",
                f"topology={arm}",
                f"train.max_steps={args.steps}",
                f"train.seed={seed}",
                "log.progress=false",
            ]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)


def _arm_rows(root: Path) -> list[dict[str, Any]]:
    rows = []
    for summary in sorted(root.glob("*x*/*/seed*/summary.json")):
        s = json.loads(summary.read_text())
        shape, arm = summary.parts[-4], summary.parts[-3]
        wire = s.get("wire") or {}
        rows.append(
            {
                "shape": shape,
                "arm": arm,
                "seed": summary.parts[-2],
                "tokens": s["tokens"],
                "tokens_per_s": s["perf/tokens_per_s"],
                "eval_loss": s["eval/loss"],
                "tx_bytes_per_host_per_step": wire.get("tx_bytes_per_step"),
                # the wrapper's count; the allreduce arm's is the framework's estimate for
                # torch DDP of the whole model, which HSDP is not: left out
                "comm_bytes_per_step_per_rank": (
                    None if arm == "allreduce" else s.get("comm/bytes_per_step")
                ),
                "rate_bps": wire.get("rate_bps"),
            }
        )
    return rows


def _band(values: list[float]) -> str:
    mean = statistics.mean(values)
    if len(values) < 2:
        return f"{mean:.4g}"
    return f"{mean:.4g} ± {statistics.stdev(values):.2g}"


def table(args: argparse.Namespace) -> None:
    """``study.md`` and ``study.json`` from the runs under ``--runs``."""
    rows = _arm_rows(Path(args.runs))
    if not rows:
        raise SystemExit(f"no runs under {args.runs}")
    header = ["hosts x shards", "arm", "seeds", "tokens", "tokens/s"]
    header += ["bytes sent per host link per step", "wrapper's bytes per rank per step"]
    header.append("final eval loss")
    cells = []
    for shape in sorted({r["shape"] for r in rows}):
        for arm in ARMS:
            mine = [r for r in rows if r["shape"] == shape and r["arm"] == arm]
            if not mine:
                continue
            comm = mine[0]["comm_bytes_per_step_per_rank"]
            bands = [
                _band([r[k] for r in mine]) for k in ("tokens_per_s", "tx_bytes_per_host_per_step")
            ]
            loss = _band([r["eval_loss"] for r in mine])
            counts = [shape, arm, str(len(mine)), str(mine[0]["tokens"])]
            cells.append([*counts, *bands, "-" if comm is None else f"{comm:.4g}", loss])
    text = md_table(header, ["---"] * len(header), cells)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "study.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "study.md").write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run every arm and seed on the testbed (root)")
    r.add_argument("--hosts", type=int, default=2)
    r.add_argument("--shard-size", type=int, default=2, help="ranks per replica = per host")
    r.add_argument("--arms", default=",".join(ARMS))
    r.add_argument("--seeds", type=int, default=2)
    r.add_argument("--steps", type=int, default=64)
    r.add_argument("--rate", default="100mbit")
    r.add_argument("--data", required=True, help="the token folder (experiment=lm_quick's)")
    r.add_argument("--prefix", default="shard", help="the testbed's name prefix")
    r.add_argument("--timeout-s", type=float, default=900.0)
    r.add_argument("--runs", default="outputs/sharded_testbed")
    t = sub.add_parser("table", help="the measured table of the runs")
    t.add_argument("--runs", default="outputs/sharded_testbed")
    t.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
