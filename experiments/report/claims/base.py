"""What a claim is, and the sources its values come from (see :mod:`experiments.report.claims`).

The constants name the committed files and folders; each function returns a function of a
:class:`~experiments.report.doc_data.Source` giving one figure from them; the ``*_row`` helpers
build the claim of one table row.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views import UPSTREAM, step_s

Fn = Callable[[Source], float]


@dataclass(frozen=True)
class Value:
    """Where a figure comes from (``fn``) and how it is written (``fmt``)."""

    fn: Callable[[Source], object]
    fmt: str


@dataclass(frozen=True)
class Claim:
    """A pattern on ``page`` whose groups are the figures of ``values``, in order."""

    page: str
    pattern: str
    values: tuple[Value, ...]


def claim(page: str, pattern: str, *values: Value) -> Claim:
    """A :class:`Claim` (the values as arguments)."""
    return Claim(page, pattern, values)


# Sources, as small functions of a Source.
WIRE = "docs/results/network/table.json"
HIER = "docs/results/hierarchical/table.json"
LM = "docs/results/lm/runs"
GAP = "docs/results/lm_gap/runs"
OUTER = "docs/results/outer/lm_small/runs"
STREAM = "docs/results/streaming/runs"
COMP = "docs/results/compression/runs"


def mean(runs: str, key: str = "eval/loss") -> Fn:
    """The mean over the seeds of ``runs``."""
    return lambda s: s.mean(runs, key)


def sd(runs: str, key: str = "eval/loss") -> Fn:
    """The sample standard deviation over the seeds of ``runs``."""
    return lambda s: s.sd(runs, key)


def diff(a: Fn, b: Fn) -> Fn:
    """``a - b``."""
    return lambda s: a(s) - b(s)


def ratio(a: Fn, b: Fn) -> Fn:
    """``a / b``."""
    return lambda s: a(s) / b(s)


def seed(runs: str, i: int, key: str = "eval/loss") -> Fn:
    """Seed ``i``'s value (the ``i``-th seed folder, in name order)."""
    return lambda s: s.seeds(runs, key)[i]


def gap_mean(base: str, other: str) -> Fn:
    """The mean of ``other - base``, paired seed by seed."""
    return lambda s: statistics.mean(s.paired_gap(base, other))


def gap_sd(base: str, other: str) -> Fn:
    """The sample standard deviation of ``other - base``, paired seed by seed."""
    return lambda s: statistics.stdev(s.paired_gap(base, other))


def sps(shape: str, rate: str, arm: str, file: str = WIRE) -> Fn:
    """Samples/s measured on the wire (``table.json`` of the wire study)."""
    return lambda s: s.wire(file, shape, rate, arm)


def wire_field(shape: str, rate: str, arm: str, field: str, file: str = WIRE) -> Fn:
    """Any field of the wire study's row."""
    return lambda s: s.wire(file, shape, rate, arm, field)


def V(fn: Fn, fmt: str) -> Value:  # noqa: N802 - reads as a constructor in the table below
    """A :class:`Value`."""
    return Value(fn, fmt)


def version(s: Source) -> str:
    """The package's version, as ``pyproject.toml`` declares it."""
    s.read.append("pyproject.toml")
    for line in (s.root / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise DataError("pyproject.toml", "no version")


def within_20(field: str) -> Fn:
    """How many cells of the wire study a prediction (``field``: its ratio) puts within 20%."""

    def count(s: Source) -> int:
        rows = [r[field] for r in s.json(WIRE) if r.get(field) is not None]
        return sum(abs(r - 1) <= 0.2 for r in rows)

    return count


def cells(field: str) -> Fn:
    """How many cells of the wire study a prediction (``field``) covers."""
    return lambda s: sum(r.get(field) is not None for r in s.json(WIRE))


def link_speedup(arm: str) -> Fn:
    """How much sooner than ``allreduce`` an arm reaches DiLoCo's final loss on the slow link."""

    def value(s: Source) -> float:
        arms = {a["name"]: a for a in s.json("docs/results/streaming/link/link_time.json")["arms"]}
        return arms["allreduce-adamw"]["time_to_target"][1] / arms[arm]["time_to_target"][1]

    return value


F3 = "{:.3f}"
F2 = "{:.2f}"
F0 = "{:,.0f}"
RES = "docs/results/README.md"
COMP_PAGE = "docs/results/compression/README.md"
COMP_SUMMARY = "docs/results/compression/summary.md"
NET = "docs/results/network/README.md"
HIER_PAGE = "docs/results/hierarchical/README.md"
LM_PAGE = "docs/results/lm/README.md"
GAP_PAGE = "docs/results/lm_gap/README.md"
STREAM_PAGE = "docs/results/streaming/README.md"
OUTER_PAGE = "docs/results/outer/lm_small/README.md"
BEFORE = "docs/results/hierarchical/before-driver/digits"
H_ARMS = ("hierarchical", "one-peer-exp", "allreduce")


def kb(fn: Fn) -> Fn:
    """Bytes as KB (1000 bytes), as the pages write them."""
    return lambda s: fn(s) / 1000


W32 = (f"{GAP}/allreduce-adamw/final", f"{GAP}/complete-adamw-lr0.004/final")
W8 = (f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final")
W128 = (f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final")
SGD = (f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final")
LATE = (f"{GAP}/allreduce-adamw/final", f"{GAP}/allreduce-delayed/final")
DILOCO_T = f"{GAP}/diloco-H16-outer/final"
LOCAL_T = f"{GAP}/local-sgd-H16-lr2e-3/final"
INT8 = f"{STREAM}/streaming-f4-int8/final"
DILOCO = f"{STREAM}/diloco-H16/final"


# how compression's summary.md names each level (its run folders say ``randk``)
LEVEL = {"none": "none", "bf16": "bf16", "int8": "int8", "randk": r"randk:0\.1"}


def comp(topology: str, compression: str, key: str = "eval/acc") -> Fn:
    """The mean over the seeds of a compression run (``runs/TOPOLOGY_LEVEL_seedN``)."""
    return mean(f"{COMP}/{topology}_{compression}_seed*", key)


# a figure of three decimals, and one with its sign (the pages write minus as U+2212 or -)
NUM3 = r"(\d\.\d{3})"
SIGNED3 = r"([+\u2212-]\d\.\d{3})"


def seed_row(page: str, prefix: str, runs: str, sd_too: bool = True) -> Claim:
    """A table row ``| prefix | seed 0 | seed 1 | seed 2 | mean[ ± sd] |`` from ``runs``' seeds."""
    tail = rf" \| \**{NUM3} ± {NUM3}\**" if sd_too else rf" \| \**{NUM3}\**"
    values = [V(seed(runs, i), F3) for i in range(3)] + [V(mean(runs), F3)]
    if sd_too:
        values.append(V(sd(runs), F3))
    return Claim(page, rf"^\| {prefix} \| {NUM3} \| {NUM3} \| {NUM3}{tail} \|", tuple(values))


def gap_row(page: str, prefix: str, base: str, other: str) -> Claim:
    """A row ``| prefix | gap 0 | gap 1 | gap 2 | mean ± sd |``, ``other - base`` paired by seed."""

    def one(i: int) -> Fn:
        return lambda s: s.paired_gap(base, other)[i]

    values = [V(one(i), "{:+.3f}") for i in range(3)]
    values += [V(gap_mean(base, other), "{:+.3f}"), V(gap_sd(base, other), F3)]
    return Claim(
        page,
        rf"^\| {prefix} \| {SIGNED3} \| {SIGNED3} \| {SIGNED3} \| \**{SIGNED3} ± {NUM3}\** \|",
        tuple(values),
    )


def spread_row(page: str, prefix: str, runs: str, skip: int = 1, inline: bool = False) -> Claim:
    """A row with ``mean ± sd`` and the seeds' values, ``skip`` cells after ``prefix``.

    ``inline``: the seeds in brackets in the same cell (``3.895 ± 0.307 (3.691, 4.249, 3.746)``),
    else in the next cell.
    """
    cells = r" \|[^|\n]*" * skip
    seeds = rf" \({NUM3}, {NUM3}, {NUM3}\)" if inline else rf" \| {NUM3}, {NUM3}, {NUM3}"
    values = [V(mean(runs), F3), V(sd(runs), F3)] + [V(seed(runs, i), F3) for i in range(3)]
    return Claim(page, rf"^\| {prefix}{cells} \| {NUM3} ± {NUM3}{seeds} \|", tuple(values))


def upstream_ms(model: str, procs: int, impl: str) -> Fn:
    """``make bench-upstream``'s median step in ms (``bench-upstream/gpt.json``)."""
    return lambda s: step_s(s, UPSTREAM, model, procs, impl) * 1e3


CHOOSE_25G = "docs/results/cluster/choose_2x8_25gbit_resnet50.json"


def chooser_mb(file: str, topology: str) -> Fn:
    """MB per host link per step of a topology in a committed chooser JSON."""

    def value(s: Source) -> float:
        rows = [r for r in s.json(file)["rows"] if r["topology"] == topology]
        if not rows:
            raise DataError(file, f"no row topology={topology}")
        return rows[0]["host_link_bytes"] / 1e6

    return value


NONIID = "docs/results/noniid/summary.md"
NONIID_PAGE = "docs/results/noniid/README.md"


def noniid(alpha: str, topology: str, optim: str, part: int) -> Fn:
    """From the non-IID sweep's ``summary.md``: the accuracy's mean (``part`` 0), its std (1),
    or the gap to ``allreduce`` in points (2)."""

    def value(s: Source) -> float:
        row = {"alpha": alpha, "topology": topology, "optim": optim}
        if part == 2:
            return float(s.md_cell(NONIID, "gap to allreduce (pts)", **row))
        cell = s.md_cell(NONIID, "eval/acc (mean ± std)", **row)
        return float(cell.split("±")[part])

    return value


def closed(alpha: str, topology: str) -> Fn:
    """The share (%) of the SGD arm's gap to ``allreduce`` that ``qgm_sgd`` closes."""
    return lambda s: (
        100 * (1 - noniid(alpha, topology, "qgm_sgd", 2)(s) / noniid(alpha, topology, "sgd", 2)(s))
    )


def neg(fn: Fn) -> Fn:
    """``-fn``."""
    return lambda s: -fn(s)


NONIID_ROWS = [
    (a, t, o)
    for a in ("0.1", "1.0")
    for t in ("ring", "one-peer-exp", "local-sgd")
    for o in ("sgd", "qgm_sgd")
]


PAPER = "docs/results/simulate/paper_transformer_fig6/simulate.json"


def calibration(profile: str, method: str, key: str) -> Fn:
    """A field of the simulator's calibration row against the reference paper."""

    def value(s: Source) -> float:
        for i, row in enumerate(s.json(PAPER)["calibration"]):
            if row["profile"] == profile and row["method"] == method:
                return float(s.key(PAPER, f"calibration.{i}.{key}"))
        raise DataError(PAPER, f"no calibration row {profile} {method}")

    return value


def one_run(page: str, prefix: str, run_dir: str) -> Claim:
    """A table row ``| prefix | value |``: one run's final ``eval/loss``."""
    return Claim(page, rf"^\| {prefix} \| {NUM3} \|", (V(lambda s: s.run(run_dir), F3),))


BENCH = "docs/results/bench.json"


def bench_vs_ddp(
    model: str, procs: int | None, variant: str | None = None, pick: Callable = min
) -> Fn:
    """``make bench``'s step over torch DDP's: one variant's, or ``pick`` over the gossip
    variants (``decent/...`` but ``local-sgd``), at ``procs`` (None: both)."""

    def value(s: Source) -> float:
        rows = s.json(BENCH)
        ddp = {
            (r["model"], r["world_size"]): r["median_step_s"]
            for r in rows
            if r["variant"] == "torch-ddp"
        }
        ratios = [
            r["median_step_s"] / ddp[r["model"], r["world_size"]]
            for r in rows
            if r["model"] == model
            and (procs is None or r["world_size"] == procs)
            and (
                r["variant"] == variant
                if variant
                else r["variant"].startswith("decent/") and r["variant"] != "decent/local-sgd"
            )
        ]
        if not ratios:
            raise DataError(BENCH, f"no row model={model} procs={procs} variant={variant}")
        return pick(ratios)

    return value


LINK = "docs/results/streaming/link/link_time.json"


def link_arm(arm: str, key: str, index: int | None = None) -> Fn:
    """A field of an arm of the slow-link timing (``link_time.json``)."""

    def value(s: Source) -> float:
        for i, a in enumerate(s.json(LINK)["arms"]):
            if a["name"] == arm:
                got = s.key(LINK, f"arms.{i}.{key}" + ("" if index is None else f".{index}"))
                return float(got)
        raise DataError(LINK, f"no arm {arm}")

    return value


def at(rel_dir: str, value: float, key: str = "optim.lr") -> Fn:
    """The final ``eval/loss`` of the run in ``rel_dir`` whose override ``key`` is ``value``."""
    return lambda s: s.at(rel_dir, key, value)


def grid_row(page: str, prefix: str, rel_dir: str, lrs: tuple[float | None, ...]) -> Claim:
    """A grid row ``| prefix | v1 | v2 | ... |``, a cell per lr (None: an empty cell; a value may
    be bold, the best)."""
    cells = "".join(r" \| \**" + NUM3 + r"\**" if lr is not None else r" \|" for lr in lrs)
    values = tuple(V(at(rel_dir, lr), F3) for lr in lrs if lr is not None)
    return Claim(page, rf"^\| {prefix}{cells} \|", values)


BATCH_LRS = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
W128_LRS = (None, 1e-3, 2e-3, 4e-3, 8e-3, None)
SGD_LRS = (0.125, 0.25, 0.5, 1.0, 2.0)


RERUN = "docs/results/lm_gap/rerun/rerun.json"
CALIBRATION = "docs/results/network/calibration.json"
_WORDS = {
    n: w
    for n, w in enumerate(
        ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    )
}


def rerun_stat(stat: str) -> Callable[[Source], object]:
    """Of the reruns (``rerun.json``): ``n``, ``largest`` difference (as ``7e-5``), or how many
    agree to the 6 printed decimals (``same``, as a word)."""

    def value(s: Source) -> object:
        rows = s.json(RERUN)
        if stat == "n":
            return len(rows)
        if stat == "largest":
            mantissa, _, exponent = (
                f"{max(abs(r['committed'] - r['rerun']) for r in rows):.0e}".partition("e")
            )
            return f"{mantissa}e{int(exponent)}"
        return _WORDS[sum(f"{r['committed']:.6f}" == f"{r['rerun']:.6f}" for r in rows)]

    return value


def calibrated(rate: str, key: str) -> Fn:
    """A term the calibration measured on the testbed's pair exchanges at ``rate``."""
    return lambda s: float(s.key(CALIBRATION, f"rates.{rate}.{key}"))


def report_range(file: str, network: str, column: str, pick: Callable = min) -> Fn:
    """``pick`` of a column of a run report's table (``python -m experiments.report``) over its
    decentralized rows on one network (``""``: none, else the ``(emulated NAME)`` of the row)."""

    def value(s: Source) -> float:
        cells = [
            float(row[column].rstrip("x"))
            for row in s.md_rows(file)
            if not row["run"].startswith("allreduce")
            and (
                f"(emulated {network})" in row["run"] if network else "(emulated" not in row["run"]
            )
        ]
        if not cells:
            raise DataError(file, f"no decentralized row on network '{network or 'none'}'")
        return pick(cells)

    return value


SIMULATE = "docs/results/simulate/simulate.json"


def simulated_speedup(profile: str, methods: tuple[str, ...], pick: Callable = min) -> Fn:
    """``pick`` of the simulator's speedup over all-reduce (``simulate.json``) for ``methods``
    (empty: every topology) on ``profile``, from 2 nodes (16 workers) up."""

    def value(s: Source) -> float:
        speedups = [
            r["speedup_vs_allreduce"]
            for r in s.json(SIMULATE)["rows"]
            if r["profile"] == profile
            and r["fits"]
            and r["n"] >= 16
            and r["method"] != "allreduce"
            and (not methods or r["method"] in methods)
        ]
        if not speedups:
            raise DataError(SIMULATE, f"no row {profile} {methods}")
        return pick(speedups)

    return value


UPSTREAM_RESULTS = "docs/results/bench-upstream/results.json"


def upstream_run(procs: int, impl: str, key: str = "median_step_s") -> Fn:
    """A row of the first ``make bench-upstream`` run (``results.json``), in ms."""

    def value(s: Source) -> float:
        for config in s.json(UPSTREAM_RESULTS)["configs"]:
            for row in config["rows"]:
                if config["procs"] == procs and row["impl"] == impl:
                    return float(row[key]) * 1e3
        raise DataError(UPSTREAM_RESULTS, f"no row procs={procs} impl={impl}")

    return value
