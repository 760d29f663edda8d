"""The emulator's and the simulator's calibration terms, measured on the testbed's wire.

``python -m experiments.network.calibrate run`` (as root) times the library's pair
exchange (an ``all_reduce`` on 2-rank groups, pairs alternating as in ``ring``:
:mod:`experiments.network.testbed.pairbench`) on 4 testbed hosts, for several
payload sizes at each link rate, and the same exchanges over loopback. It
writes ``calibration.json`` (default ``docs/results/network/``) with, per rate,
a straight line through the medians, ``t = collective_ms + S / (efficiency * B)``:

- ``efficiency``: the share of the line rate a payload gets (headers, ACKs);
- ``collective_ms``: what each exchange costs beyond its bytes;

and, per rate, the CPU that moving bytes costs the whole machine
(``/proc/stat`` over the exchanges less the idle machine's, per MB the ranks
sent, the median over the payloads of 213 KB and more; it differs by rate,
since the kernel's cost follows packets and timers, not bytes alone):

- ``stack_cpu_ms_per_mb``: the testbed's cost beyond loopback's for the same
  payloads, the term the emulator burns (its own runs move their bytes over
  loopback already);
- ``comm_cpu_ms_per_mb``: the testbed's whole cost, the term the simulator adds
  to a compute time measured without any communication.

The terms are measured here and never fitted to the training runs they are
then checked against (``wire_study table``). ``emulator_overrides`` and
``simulator_terms`` read them for a given link rate (the nearest measured rate).

The intercept ``collective_ms`` already holds the wire's own latency (the veth
pairs' ``VETH_LATENCY_MS`` one way, twice in a pair exchange): the calibrated
emulator and simulator therefore count no latency per hop (``latency_ms=0``), and
a pair's or a ring's fixed cost is the fitted intercept, not the intercept plus
``2 (k-1)`` hops of latency counted a second time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from experiments.report.doc_data import md_table

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "results" / "network"
PAIRBENCH = "experiments/network/testbed/pairbench.py"
MODE = "allreduce-ring"
SIZES = (16_384, 53_248, 212_992, 851_968)  # int8's payload, the digits CNN's, and around them
RATES = ("5mbit", "10mbit", "100mbit", "1gbit")
HOSTS = 4
BULK = 212_992  # payloads from this size up give the CPU per byte
VETH_LATENCY_MS = 0.05  # one way, measured with ping between two testbed hosts: no added delay

__all__ = [
    "VETH_LATENCY_MS",
    "fit_line",
    "load",
    "nearest",
    "emulator_overrides",
    "simulator_terms",
    "main",
]


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``t = a + b x`` through ``(x, t)`` points; returns ``(a, b)``.

    Raises:
        ValueError: Fewer than two distinct ``x``.
    """
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        raise ValueError(f"a line needs two distinct sizes, got {sorted(set(xs))}")
    mx, mt = statistics.fmean(xs), statistics.fmean(t for _, t in points)
    b = sum((x - mx) * (t - mt) for x, t in points) / sum((x - mx) ** 2 for x in xs)
    return mt - b * mx, b


def _rows(lines: str) -> list[dict[str, Any]]:
    out = []
    for line in lines.splitlines():
        line = line.strip()
        if line.startswith("{") and '"median_s"' in line:
            out.append(json.loads(line))
    return out


def _bench_args(size: int, reps: int, rate_bps: float | None) -> list[str]:
    args = [PAIRBENCH, "--bytes", str(size), "--reps", str(reps), "--modes", MODE, "--cpu"]
    return args + (["--rate-bps", str(rate_bps)] if rate_bps else [])


def measure_wire(
    rates: Sequence[str], sizes: Sequence[int], reps: int, prefix: str
) -> list[dict[str, Any]]:
    """Pair exchanges on ``HOSTS`` testbed hosts at every rate and size.

    Brings the testbed down at the end, also on SIGTERM or SIGINT (then raising
    :class:`experiments.network.testbed.Interrupted`), after stopping the hosts' launchers.
    """
    from experiments.network import testbed as tb

    rows: list[dict[str, Any]] = []
    jobs = [(r, s) for r in rates for s in sizes]
    tmp = Path(tempfile.mkdtemp(prefix="calibrate-"))
    with tb.teardown_on_signals():
        try:
            for rate, size in tqdm(jobs, desc="calibrate: wire", unit="run"):
                spec = tb.Spec(HOSTS, 1, tb.parse_rate(rate), 50.0, prefix)
                tb.up(spec)
                out = tmp / f"{rate}-{size}"
                args = _bench_args(size, reps, spec.rate_bps)
                tb.launch(spec, args, out, timeout_s=600, quiet=True)
                got = _rows((out / "testbed" / "host0.log").read_text(errors="replace"))
                rows += [
                    {**g, "where": "wire", "rate": rate, "rate_bps": spec.rate_bps} for g in got
                ]
        finally:
            tb.down(prefix)
            shutil.rmtree(tmp, ignore_errors=True)
    return rows


def measure_loopback(sizes: Sequence[int], reps: int) -> list[dict[str, Any]]:
    """The same exchanges among 4 local processes over loopback (the emulator's transport)."""
    rows: list[dict[str, Any]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for size in tqdm(sizes, desc="calibrate: loopback", unit="run"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={HOSTS}", *_bench_args(size, reps, None)]  # fmt: skip
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"pairbench on loopback failed: {proc.stderr.strip()[-300:]}")
        rows += [{**g, "where": "loopback"} for g in _rows(proc.stdout)]
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The calibration from the measured rows (see the module docstring)."""
    wire = [r for r in rows if r["where"] == "wire"]
    loop = {
        r["bytes"]: r["cpu_ms_per_mb"]
        for r in rows
        if r["where"] == "loopback" and "cpu_ms_per_mb" in r
    }
    rates: dict[str, Any] = {}
    for rate in sorted(
        {r["rate"] for r in wire}, key=lambda x: next(r["rate_bps"] for r in wire if r["rate"] == x)
    ):
        mine = [r for r in wire if r["rate"] == rate]
        bps = mine[0]["rate_bps"]
        a, b = fit_line([(r["bytes"] * 8 / bps, r["median_s"]) for r in mine])
        fitted = {r["bytes"]: a + b * r["bytes"] * 8 / bps for r in mine}
        # the CPU a byte costs, from the bulk payloads (small ones are mostly per-call cost)
        bulk = [r for r in mine if r["bytes"] >= BULK and "cpu_ms_per_mb" in r]
        comm = max(0.0, statistics.median(r["cpu_ms_per_mb"] for r in bulk)) if bulk else 0.0
        extra = [r["cpu_ms_per_mb"] - loop.get(r["bytes"], 0.0) for r in bulk]
        rates[rate] = {
            "rate_bps": bps,
            "efficiency": min(1.0, 1.0 / b) if b > 0 else 1.0,
            "collective_ms": max(0.0, a * 1e3),
            "worst_fit_error": max(abs(fitted[r["bytes"]] / r["median_s"] - 1) for r in mine),
            "comm_cpu_ms_per_mb": comm,
            "stack_cpu_ms_per_mb": max(0.0, statistics.median(extra)) if extra else 0.0,
        }
    loop_bulk = [c for size, c in loop.items() if size >= BULK]
    return {
        "mode": MODE,
        "hosts": HOSTS,
        "cores": os.cpu_count(),
        "rates": rates,
        "loopback_cpu_ms_per_mb": statistics.median(loop_bulk) if loop_bulk else 0.0,
        "rows": list(rows),
    }


def load(out: Path = OUT) -> dict[str, Any] | None:
    """``calibration.json`` under ``out``, or ``None`` when it was never measured."""
    path = Path(out) / "calibration.json"
    return json.loads(path.read_text()) if path.exists() else None


def nearest(calib: dict[str, Any], rate_bps: float) -> dict[str, Any]:
    """The per-rate terms measured at the rate nearest ``rate_bps`` (on a log scale)."""
    return min(calib["rates"].values(), key=lambda r: abs(math.log(r["rate_bps"] / rate_bps)))


def emulator_overrides(calib: dict[str, Any], rate_bps: float) -> list[str]:
    """``network.*`` overrides that give ``network=custom`` the testbed's measured terms.

    ``latency_ms`` is 0: the fitted ``collective_ms`` holds the wire's latency.
    """
    at = nearest(calib, rate_bps)
    return [
        "network.latency_ms=0",
        f"network.efficiency={at['efficiency']:.4f}",
        f"network.collective_ms={at['collective_ms']:.4f}",
        f"network.stack_cpu_ms_per_mb={at['stack_cpu_ms_per_mb']:.4f}",
    ]


def simulator_terms(calib: dict[str, Any], rate_bps: float) -> dict[str, float]:
    """The simulator's terms at a rate: ``latency_ms`` (0: ``collective_ms`` holds it),
    ``efficiency``, ``collective_ms``, ``comm_cpu_ms_per_mb`` and the machine's ``cores``."""
    at = nearest(calib, rate_bps)
    return {
        "latency_ms": 0.0,
        "efficiency": at["efficiency"],
        "collective_ms": at["collective_ms"],
        "comm_cpu_ms_per_mb": at["comm_cpu_ms_per_mb"],
        "cores": calib["cores"],
    }


def markdown(calib: dict[str, Any]) -> str:
    """The calibration as a short markdown page."""
    lines = [
        "# Calibration terms, measured on the testbed",
        "",
        f"`python -m experiments.network.calibrate run`: `{MODE}` pair exchanges on {calib['hosts']} "
        f"hosts, a line `t = collective_ms + S / (efficiency * B)` through each rate's medians; "
        f"{calib['cores']} cores.",
        "",
    ]
    header = ["rate", "efficiency", "collective_ms", "worst fit error", "CPU ms per MB"]
    header.append("beyond loopback")
    fits = []
    for rate, r in calib["rates"].items():
        fit = [f"{r['efficiency']:.3f}", f"{r['collective_ms']:.2f}", f"{r['worst_fit_error']:.1%}"]
        cpu = [f"{r['comm_cpu_ms_per_mb']:.1f}", f"{r['stack_cpu_ms_per_mb']:.1f}"]
        fits.append([rate, *fit, *cpu])
    lines += [
        md_table(header, ["---", *["---:"] * 5], fits),
        "",
        "CPU per MB: the whole machine's busy time over the exchanges less its idle rate, per MB the "
        f"ranks sent, the median over payloads from {BULK:,} bytes (loopback: "
        f"{calib['loopback_cpu_ms_per_mb']:.1f} ms). The emulator burns what the testbed costs beyond "
        "loopback (`stack_cpu_ms_per_mb`); the simulator adds the whole cost to its compute time.",
        "",
    ]
    rows = []
    for r in calib["rows"]:
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "–"
        cpu = f"{r['cpu_ms_per_mb']:.1f}" if "cpu_ms_per_mb" in r else "–"
        where = [r["where"], r.get("rate", "–"), f"{r['bytes']:,}", f"{r['median_s']:.4f}"]
        rows.append([*where, ratio, cpu])
    header = ["where", "rate", "bytes", "median s", "x S/B", "CPU ms per MB"]
    lines.append(md_table(header, ["---", "---", *["---:"] * 4], rows))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.network.calibrate")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure on the testbed and over loopback (as root)")
    r.add_argument("--rates", nargs="+", default=list(RATES))
    r.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    r.add_argument("--reps", type=int, default=8)
    r.add_argument("--prefix", default="ddpcal", help="the testbed's name prefix (default ddpcal)")
    r.add_argument("--out", default=str(OUT))
    s = sub.add_parser("show", help="rewrite calibration.md from calibration.json")
    s.add_argument("--out", default=str(OUT))
    ns = parser.parse_args(argv)
    out = Path(ns.out)
    if ns.command == "run":
        from experiments.network import testbed as tb

        why = tb.missing()
        if why is not None:
            print(f"calibrate: {why}", file=sys.stderr)
            return 1
        bad = [s for s in ns.sizes if s <= 0 or s % 4]
        if bad:
            print(
                f"calibrate: --sizes {bad[0]} is invalid; sizes are positive multiples of 4 bytes",
                file=sys.stderr,
            )
            return 2
        try:
            with tb.teardown_on_signals():  # the loopback's torchrun ends with it too
                rows = measure_wire(ns.rates, ns.sizes, ns.reps, ns.prefix)
                rows += measure_loopback(ns.sizes, ns.reps)
        except tb.Interrupted as exc:
            print(f"calibrate: {exc}; the testbed is down", file=sys.stderr)
            return 128 + exc.signum
        out.mkdir(parents=True, exist_ok=True)
        (out / "calibration.json").write_text(json.dumps(summarize(rows), indent=1) + "\n")
    calib = load(out)
    if calib is None:
        print(
            f"calibrate: no calibration.json under {out}; run 'calibrate run' first",
            file=sys.stderr,
        )
        return 1
    (out / "calibration.md").write_text(markdown(calib))
    print(markdown(calib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
