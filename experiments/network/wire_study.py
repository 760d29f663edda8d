"""Every topology's speed measured on the testbed's wire, beside the emulator's and the simulator's.

``python -m experiments.network.wire_study run`` trains each arm on the testbed
(:mod:`experiments.network.testbed`) for every link rate, then the same
configuration on loopback under the emulator (``network=custom`` at the same
rate), and once more without communication (the compute time the simulator
needs). With ``--calibrated`` the emulated runs also get the terms that
``python -m experiments.network.calibrate run`` measured on the testbed
(``calibration.json``: efficiency, a cost per collective and the network
stack's CPU), and go beside the line-rate ones as ``calibrated/``. It keeps
each run's small files under ``--out`` (default ``docs/results/network/runs``). ``python -m experiments.network.wire_study table``
turns them into ``table.md``, ``table.json`` and the plots beside them.

Example (as root; the sweep script is ``experiments/sweeps/network.sh``)::

    python -m experiments.network.wire_study run --model digits --hosts 4 \\
        --rates 10mbit 100mbit 1gbit --arms allreduce ring one-peer-exp
    python -m experiments.network.wire_study table
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from experiments.network import calibrate
from experiments.network import testbed as tb
from experiments.network.sim_validate import NEVER, run_train
from experiments.network.wire_table import LOCAL_SGD_PERIOD, write_table

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "results" / "network"
QUIET = ["logger=none", "log.progress=false", "log.consensus_sketch=0", "log.consensus_every=0"]

MODELS: dict[str, list[str]] = {
    "digits": ["train.max_steps=60", "log.every=10"],
    "lm_quick": ["experiment=lm_quick", "train.max_steps=40", "log.every=10"],
}
ARMS: dict[str, list[str]] = {
    "allreduce": ["topology=allreduce"],
    "complete": ["topology=complete"],
    "ring": ["topology=ring"],
    "one-peer-exp": ["topology=one-peer-exp"],
    "alternating-exp-ring": ["topology=alternating-exp-ring"],
    "hierarchical": ["topology=hierarchical"],
    "local-sgd": ["topology=local-sgd", f"topology.kwargs.period={LOCAL_SGD_PERIOD}"],
    "diloco": ["topology=local-sgd", f"topology.kwargs.period={LOCAL_SGD_PERIOD}", "outer=diloco"],
    "streaming-diloco": [
        "topology=local-sgd", f"topology.kwargs.period={LOCAL_SGD_PERIOD}", "outer=diloco", "outer.fragments=4",
        "topology.bucket_size_in_mb=0.05",
    ],
    "ring-int8": ["topology=ring", "compression=int8"],
    "ring-bf16": ["topology=ring", "compression=bf16"],
}  # fmt: skip
SMALL_FILES = ("summary.json", "metrics.jsonl", "testbed.json")


def cell_dir(out: Path, model: str, hosts: int, pph: int, rate: str) -> Path:
    """Where one (model, hosts x procs, rate) cell's runs go."""
    return out / "runs" / model / f"{hosts}x{pph}" / rate


def _keep(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in SMALL_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)


def run(ns: argparse.Namespace) -> int:
    """Every arm at every rate on the testbed, then emulated, then once without communication.

    Tears the testbed down at the end, also on SIGTERM or SIGINT (then raising
    :class:`experiments.network.testbed.Interrupted`), after stopping the hosts' launchers.
    """
    out = Path(ns.out)
    base = [*QUIET, *MODELS[ns.model], *ns.extra]
    if ns.procs_per_host > 1:
        base.append(f"topology.local_world_size={ns.procs_per_host}")
    calibrated = ns.calibrated and not ns.no_emulated
    calib = calibrate.load(out) if calibrated else None
    if calibrated and calib is None:
        raise SystemExit(f"wire_study: --calibrated needs {out / 'calibration.json'}; run "
                         "'python -m experiments.network.calibrate run' first")  # fmt: skip
    kinds = [] if ns.no_emulated else ["emulated", "calibrated"] if calibrated else ["emulated"]
    jobs = [(rate, arm) for rate in ns.rates for arm in ns.arms]
    bar = tqdm(jobs, desc="wire study", unit="cell")
    with tb.teardown_on_signals():  # SIGTERM, SIGINT: the hosts stopped, the testbed down
        tmp = Path(tempfile.mkdtemp(prefix="wire-study-"))
        try:
            for rate, arm in bar:
                bar.set_postfix_str(f"{rate} {arm}")
                spec = tb.Spec(
                    ns.hosts, ns.procs_per_host, tb.parse_rate(rate), ns.queue_ms, ns.prefix
                )
                dst = cell_dir(out, ns.model, ns.hosts, ns.procs_per_host, rate) / arm
                have = {
                    k
                    for k in ("wire", *kinds)
                    if (dst / k / "summary.json").exists() and not ns.again
                }
                wire = not ns.only_emulated and "wire" not in have
                # a cell measured again on the wire is emulated again beside it: the machine drifts
                todo = [k for k in kinds if wire or k not in have]
                if wire:
                    tb.up(spec)
                    run_dir = tmp / f"{rate}-{arm}"
                    try:
                        tb.launch(spec, ["train.py", *base, *ARMS[arm]], run_dir,
                                  timeout_s=ns.timeout_s, quiet=True)  # fmt: skip
                    except tb.TestbedError as exc:
                        tqdm.write(f"{rate} {arm}: on the wire: {exc}")
                    _keep(run_dir, dst / "wire")
                for kind in todo:
                    emu = tmp / f"{rate}-{arm}-{kind}"
                    emulator = ["network=custom", f"network.bandwidth_gbps={spec.rate_bps / 1e9}",
                                f"network.procs_per_host={ns.emulator_procs_per_host or ns.procs_per_host}"]  # fmt: skip
                    if kind == "calibrated":  # latency 0: the fitted collective_ms holds it
                        assert calib is not None  # loaded above whenever calibrated/ is to run
                        emulator += calibrate.emulator_overrides(calib, spec.rate_bps)
                    else:
                        emulator.append(f"network.latency_ms={calibrate.VETH_LATENCY_MS}")
                    try:
                        run_train(ns.hosts * ns.procs_per_host, [*base, *ARMS[arm], *emulator], emu,
                                  ns.timeout_s)  # fmt: skip
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        tqdm.write(f"{rate} {arm}: {kind}: {exc}")
                    _keep(emu, dst / kind)
            compute = cell_dir(out, ns.model, ns.hosts, ns.procs_per_host, "compute")
            if not (compute / "summary.json").exists() or (ns.again and not ns.only_emulated):
                # no communication: local-sgd whose period is longer than the run
                overrides = [*base, "topology=local-sgd", f"topology.kwargs.period={NEVER}"]
                run_train(ns.hosts * ns.procs_per_host, overrides, tmp / "compute", ns.timeout_s)
                _keep(tmp / "compute", compute)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            tb.down(ns.prefix)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.network.wire_study")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train every arm on the testbed, emulated, and compute-only")
    r.add_argument("--model", choices=sorted(MODELS), default="digits")
    r.add_argument("--hosts", type=int, default=4)
    r.add_argument("--procs-per-host", type=int, default=1)
    r.add_argument("--rates", nargs="+", default=["10mbit", "100mbit", "1gbit"])
    r.add_argument("--arms", nargs="+", default=list(ARMS), choices=sorted(ARMS))
    r.add_argument("--queue-ms", type=float, default=50.0)
    r.add_argument("--prefix", default="ddpws", help="the testbed's name prefix (default ddpws)")
    r.add_argument("--timeout-s", type=float, default=900.0)
    r.add_argument("--no-emulated", action="store_true", help="skip the emulated runs")
    r.add_argument(
        "--only-emulated",
        action="store_true",
        help="only the emulated runs (beside wire runs already there)",
    )
    r.add_argument(
        "--emulator-procs-per-host",
        type=int,
        default=None,
        help="the emulator's hosts (network.procs_per_host; default --procs-per-host, 1: a link per rank)",
    )
    r.add_argument(
        "--calibrated",
        action="store_true",
        help="also emulate with calibration.json's measured terms, into calibrated/",
    )
    r.add_argument("--again", action="store_true", help="rerun cells whose runs exist")
    r.add_argument("--out", default=str(OUT))
    r.add_argument("extra", nargs="*", help="more train.py overrides, after --")
    t = sub.add_parser("table", help="table.md, table.json and plots from the runs")
    t.add_argument("--out", default=str(OUT))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.command == "run":
        why = tb.missing()
        if why is not None:
            print(f"wire_study: {why}", file=sys.stderr)
            return 1
        try:
            return run(ns)
        except tb.Interrupted as exc:
            print(f"wire_study: {exc}; the testbed is down", file=sys.stderr)
            return 128 + exc.signum
    write_table(Path(ns.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
