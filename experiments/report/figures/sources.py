"""The sources of the docs' figures: the committed files and small functions of a
:class:`~experiments.report.doc_data.Source` that read one figure from them.

The constants name the committed files and folders; each function returns a function of a
``Source`` giving one figure (a mean over seeds, a ratio of two wire cells, a count of the cells
a prediction puts within 20%). :class:`Figure` pairs one with its format.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views import UPSTREAM, step_s
from experiments.report.doc_views_wire import PAIRBENCH, pair_ratio

Fn = Callable[[Source], float]
F0 = "{:,.0f}"


@dataclass(frozen=True)
class Figure:
    """A figure: where it comes from (``fn``), how it is written (``fmt``), and whether the page
    writes its minus sign as U+2212 (``minus``)."""

    fn: Callable[[Source], object]
    fmt: str = "{}"
    minus: bool = False

    def write(self, src: Source) -> str:
        """The figure as the page writes it, read through ``src``."""
        text = self.fmt.format(self.fn(src))
        return "\u2212" + text[1:] if self.minus and text.startswith("-") else text


def diff(a: Fn, b: Fn) -> Fn:
    """``a - b``."""
    return lambda s: a(s) - b(s)


def ratio(a: Fn, b: Fn) -> Fn:
    """``a / b``."""
    return lambda s: a(s) / b(s)


def run(rel_dir: str, key: str = "eval/loss") -> Fn:
    """``key`` of one run's ``summary.json`` (``rel_dir``, the run's folder)."""
    return lambda s: s.run(rel_dir, key)


def paired(base: str, other: str, i: int) -> Fn:
    """Seed ``i``'s ``other - base`` (the seeds both hold, in name order)."""
    return lambda s: s.paired_gap(base, other)[i]


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


BEFORE = "docs/results/hierarchical/before-driver/digits"


def kb(fn: Fn) -> Fn:
    """Bytes as KB (1000 bytes), as the pages write them."""
    return lambda s: fn(s) / 1000


DILOCO_T = f"{GAP}/diloco-H16-outer/final"


LOCAL_T = f"{GAP}/local-sgd-H16-lr2e-3/final"


INT8 = f"{STREAM}/streaming-f4-int8/final"


DILOCO = f"{STREAM}/diloco-H16/final"


def comp(topology: str, compression: str, key: str = "eval/acc") -> Fn:
    """The mean over the seeds of a compression run (``runs/TOPOLOGY_LEVEL_seedN``)."""
    return mean(f"{COMP}/{topology}_{compression}_seed*", key)


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


PAPER = "docs/results/simulate/paper_transformer_fig6/simulate.json"


def calibration(profile: str, method: str, key: str) -> Fn:
    """A field of the simulator's calibration row against the reference paper."""

    def value(s: Source) -> float:
        for i, row in enumerate(s.json(PAPER)["calibration"]):
            if row["profile"] == profile and row["method"] == method:
                return float(s.key(PAPER, f"calibration.{i}.{key}"))
        raise DataError(PAPER, f"no calibration row {profile} {method}")

    return value


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


RERUN = "docs/results/lm_gap/rerun/rerun.json"


CALIBRATION = "docs/results/network/calibration.json"


WORDS = {
    n: w
    for n, w in enumerate(
        ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    )
}


def rerun_stat(stat: str) -> Callable[[Source], object]:
    """Of the reruns (``rerun.json``): ``n``, ``largest`` difference (as ``7e-5``), how many
    differ at all (``differ``), or how many agree to the 6 printed decimals (``same``, as a
    word)."""

    def value(s: Source) -> object:
        rows = s.json(RERUN)
        if stat == "n":
            return len(rows)
        if stat == "differ":
            return sum(r["committed"] != r["rerun"] for r in rows)
        if stat == "largest":
            mantissa, _, exponent = (
                f"{max(abs(r['committed'] - r['rerun']) for r in rows):.0e}".partition("e")
            )
            return f"{mantissa}e{int(exponent)}"
        return WORDS[sum(f"{r['committed']:.6f}" == f"{r['rerun']:.6f}" for r in rows)]

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


SHALLOW = f"{PAIRBENCH}/shallow_5mbit_testbed.json"


def pairs(pick: Callable, files: tuple[str, ...], modes: tuple[str, ...]) -> Fn:
    return lambda s: pick(pair_ratio(f, m)(s) for f in files for m in modes)


def shallow_hosts(s: Source, key: str) -> list[float]:
    """A counter of every host of the shallow-queue pair benchmark."""
    return [float(h[key]) for h in s.key(SHALLOW, "per_host")]


def emulated(shape: str, rate: str, arm: str) -> Fn:
    hosts, procs = (int(x) for x in shape.split("x"))
    return lambda s: float(
        s.row(HIER, hosts=hosts, procs_per_host=procs, rate=rate, arm=arm)["emulated_ratio"]
    )


GOSSIP = ("one-peer-exp", "alternating-exp-ring", "hierarchical")


def emulated_within_20(s: Source) -> int:
    """Decentralized cells at 10 Mb/s whose emulation with hosts is within 20% of the wire."""
    cells = [emulated(sh, "10mbit", a)(s) for sh in ("4x2", "2x4") for a in GOSSIP]
    return sum(abs(c - 1) <= 0.2 for c in cells)


def optimistic(pick: Callable) -> Fn:
    """How far (%) ``hierarchical``'s emulation at 10 Mb/s falls short of the wire."""
    return lambda s: pick(
        100 * (1 - emulated(sh, "10mbit", "hierarchical")(s)) for sh in ("4x2", "2x4")
    )


VALIDATION = "docs/results/simulate/validation"


def predicted_within_20(total: bool) -> Callable[[Source], str]:
    """How many of the paper's predicted (not fitted) points the simulator puts within 20%
    (``total``: how many there are), as a word."""

    def value(s: Source) -> str:
        points = [p for p in s.json(PAPER)["calibration"] if p["role"] == "predicted"]
        n = len(points) if total else sum(abs(p["error"]) <= 0.2 for p in points)
        return WORDS[n]

    return value


def validation_row(s: Source, run: str, n: int, method: str) -> dict[str, Any]:
    """A row of a simulator validation (``validation/RUN/validation.json``)."""
    rel = f"{VALIDATION}/{run}/validation.json"
    for r in s.json(rel)["rows"]:
        if r["n"] == n and r["method"] == method:
            return dict(r)
    raise DataError(rel, f"no row n={n} method={method}")


def validation(run: str, n: int, method: str, key: str) -> Fn:
    """A row's ``key`` (seconds, given in ms) of a simulator validation (``validation.json``)."""
    return lambda s: float(validation_row(s, run, n, method)[key]) * 1e3


A40 = ("a40_ethernet_25g", "allreduce"), ("a40_ethernet_25g", "alternating-exp-ring")


# the CPU sweep's run report (its runs are not committed)
DIGITS = "docs/results/digits/report.md"


OUTER_SUMMARY = "docs/results/outer/summary.md"


def gpt_tiny_params(s: Source) -> int:
    """The tiny GPT's parameter count, as the outer study's summary states it."""
    found = re.search(r"tiny GPT \(lm_quick\): ([\d,]+) parameters", s.text(OUTER_SUMMARY))
    if found is None:
        raise DataError(OUTER_SUMMARY, "no 'tiny GPT (lm_quick): N parameters'")
    return int(found[1].replace(",", ""))


def drops(shape: str, rate: str, arm: str) -> Fn:
    """The drops the wire study's ``tc -s`` counted in one run of its table."""
    return lambda s: s.wire(WIRE, shape, rate, arm, "drops")


def logged(rel: str, step: int, key: str) -> Fn:
    """``key`` as a run's ``metrics.jsonl`` (``rel``) logged it at ``step``."""

    def value(s: Source) -> float:
        for record in s.jsonl(rel):
            if record.get("step") == step and record.get(key) is not None:
                return float(record[key])
        raise DataError(rel, f"no '{key}' logged at step {step}")

    return value
