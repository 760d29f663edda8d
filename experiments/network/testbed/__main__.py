"""``python -m experiments.network.testbed up|down|status|run``: the testbed's command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .hosts import PREFIX, Spec, TestbedError, current, down, link_stats, parse_rate, testbed, up
from .launch import launch
from .stop import Interrupted


def _spec(ns: argparse.Namespace) -> Spec:
    return Spec(
        hosts=ns.hosts,
        procs_per_host=ns.procs_per_host,
        rate_bps=parse_rate(ns.rate),
        queue_ms=ns.queue_ms,
        prefix=ns.prefix,
        nic_queue_ms=ns.nic_queue_ms,
    )


def _add_shape(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument(
        "--nic-queue-ms",
        type=float,
        default=None,
        help="a host interface's queue in ms at the line rate (default: a NIC's 1000 frames)",
    )
    p.add_argument("--hosts", type=int, required=required, default=None, help="number of hosts")
    p.add_argument("--procs-per-host", type=int, default=1, help="processes per host (default 1)")
    p.add_argument(
        "--rate", default="100mbit", help="each host's link rate, both ways (default 100mbit)"
    )
    p.add_argument(
        "--queue-ms", type=float, default=50.0, help="a link queue's length in ms (default 50)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.network.testbed",
        description="A real multi-host network on this machine: hosts as network namespaces "
        "on one bridge, each link capped both ways by tbf. Needs root.",
    )
    parser.add_argument(
        "--prefix", default=PREFIX, help=f"name prefix of everything built (default {PREFIX})"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_shape(sub.add_parser("up", help="build the testbed (idempotent)"), required=True)
    sub.add_parser("down", help="remove everything `up` built (idempotent)")
    sub.add_parser("status", help="the testbed that is up and each host's link counters")
    run = sub.add_parser(
        "run",
        help="run train.py on every host (torchrun per host, c10d rendezvous on host 0); "
        "with --hosts, build the testbed first and tear it down after",
    )
    _add_shape(run, required=False)
    run.add_argument("--out", default=None, help="output folder (default outputs/testbed/<time>)")
    run.add_argument("--port", type=int, default=29400, help="rendezvous port on host 0")
    run.add_argument(
        "--timeout-s", type=float, default=None, help="stop every host after this long"
    )
    run.add_argument(
        "--script", default="train.py", help="the script torchrun runs (default train.py)"
    )
    run.add_argument("--torchrun-arg", action="append", default=[], help="extra torchrun argument")
    run.add_argument("overrides", nargs="*", help="the script's arguments, after --")
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        if ns.command == "up":
            spec = up(_spec(ns))
            print(
                f"testbed up: {spec.hosts} hosts x {spec.procs_per_host} procs, {spec.rate_bps} bit/s links"
            )
        elif ns.command == "down":
            removed = down(ns.prefix)
            print(f"testbed down: removed {len(removed)} namespaces")
        elif ns.command == "status":
            spec = current(ns.prefix)
            print(json.dumps({"spec": spec.__dict__, "links": link_stats(spec)}, indent=2))
        else:
            out = Path(ns.out or f"outputs/testbed/{time.strftime('%Y-%m-%d/%H-%M-%S')}")
            args = [ns.script, *ns.overrides]
            kwargs = {"port": ns.port, "timeout_s": ns.timeout_s, "torchrun_args": ns.torchrun_arg}
            if ns.hosts is None:
                result = launch(current(ns.prefix), args, out, **kwargs)
            else:
                with testbed(_spec(ns)) as spec:
                    result = launch(spec, args, out, **kwargs)
            tx = sum(h["tx_bytes"] for h in result["per_host"]) / len(result["per_host"])
            print(f"testbed run: {result['elapsed_s']:.1f} s, {tx:,.0f} bytes sent per host; {out}")
    except TestbedError as exc:
        print(f"testbed: error: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:  # SIGTERM or SIGINT inside testbed(): torn down
        print(f"testbed: {exc}; torn down", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print("testbed: interrupted; torn down", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
