"""Figures in the docs' prose, each tied to the committed file it comes from.

A :class:`Claim` names a page and a pattern; each of the pattern's groups captures one figure as
written, and the claim's :class:`Value` of the same position says where it comes from (a function
of a :class:`~experiments.report.doc_data.Source`) and how it is rounded (a format string). The
check (``make check-docs``) compares the two, and fails where the pattern is no longer on its
page. Tables generated from data are not claims: they are views (``doc_views``).

To add a figure: write the sentence, then a claim whose pattern matches it with the number as a
group, e.g. ``r"ends at (\\d\\.\\d{3}) nats"`` with ``Value(mean(DIR), "{:.3f}")``.
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
_H_ARMS = ("hierarchical", "one-peer-exp", "allreduce")


def kb(fn: Fn) -> Fn:
    """Bytes as KB (1000 bytes), as the pages write them."""
    return lambda s: fn(s) / 1000


_W32 = (f"{GAP}/allreduce-adamw/final", f"{GAP}/complete-adamw-lr0.004/final")
_W8 = (f"{GAP}/allreduce-w8/final", f"{GAP}/complete-w8/final")
_W128 = (f"{GAP}/allreduce-w128/final", f"{GAP}/complete-w128/final")
_SGD = (f"{GAP}/allreduce-sgd/final", f"{GAP}/complete-sgd/final")
_LATE = (f"{GAP}/allreduce-adamw/final", f"{GAP}/allreduce-delayed/final")
_DILOCO_T = f"{GAP}/diloco-H16-outer/final"
_LOCAL_T = f"{GAP}/local-sgd-H16-lr2e-3/final"
_INT8 = f"{STREAM}/streaming-f4-int8/final"
_DILOCO = f"{STREAM}/diloco-H16/final"


_LEVEL = {"none": "none", "bf16": "bf16", "int8": "int8", "randk": r"randk:0\.1"}


def _comp(topology: str, compression: str, key: str = "eval/acc") -> Fn:
    return mean(f"{COMP}/{topology}_{compression}_seed*", key)


_N = r"(\d\.\d{3})"
_G = r"([+\u2212-]\d\.\d{3})"


def seed_row(page: str, prefix: str, runs: str, sd_too: bool = True) -> Claim:
    """A table row ``| prefix | seed 0 | seed 1 | seed 2 | mean[ ± sd] |`` from ``runs``' seeds."""
    tail = rf" \| \**{_N} ± {_N}\**" if sd_too else rf" \| \**{_N}\**"
    values = [V(seed(runs, i), F3) for i in range(3)] + [V(mean(runs), F3)]
    if sd_too:
        values.append(V(sd(runs), F3))
    return Claim(page, rf"^\| {prefix} \| {_N} \| {_N} \| {_N}{tail} \|", tuple(values))


def gap_row(page: str, prefix: str, base: str, other: str) -> Claim:
    """A row ``| prefix | gap 0 | gap 1 | gap 2 | mean ± sd |``, ``other - base`` paired by seed."""

    def one(i: int) -> Fn:
        return lambda s: s.paired_gap(base, other)[i]

    values = [V(one(i), "{:+.3f}") for i in range(3)]
    values += [V(gap_mean(base, other), "{:+.3f}"), V(gap_sd(base, other), F3)]
    return Claim(
        page, rf"^\| {prefix} \| {_G} \| {_G} \| {_G} \| \**{_G} ± {_N}\** \|", tuple(values)
    )


def spread_row(page: str, prefix: str, runs: str, skip: int = 1, inline: bool = False) -> Claim:
    """A row with ``mean ± sd`` and the seeds' values, ``skip`` cells after ``prefix``.

    ``inline``: the seeds in brackets in the same cell (``3.895 ± 0.307 (3.691, 4.249, 3.746)``),
    else in the next cell.
    """
    cells = r" \|[^|\n]*" * skip
    seeds = rf" \({_N}, {_N}, {_N}\)" if inline else rf" \| {_N}, {_N}, {_N}"
    values = [V(mean(runs), F3), V(sd(runs), F3)] + [V(seed(runs, i), F3) for i in range(3)]
    return Claim(page, rf"^\| {prefix}{cells} \| {_N} ± {_N}{seeds} \|", tuple(values))


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


_NONIID_ROWS = [
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
    return Claim(page, rf"^\| {prefix} \| {_N} \|", (V(lambda s: s.run(run_dir), F3),))


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
    cells = "".join(r" \| \**" + _N + r"\**" if lr is not None else r" \|" for lr in lrs)
    values = tuple(V(at(rel_dir, lr), F3) for lr in lrs if lr is not None)
    return Claim(page, rf"^\| {prefix}{cells} \|", values)


_BATCH_LRS = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
_W128_LRS = (None, 1e-3, 2e-3, 4e-3, 8e-3, None)
_SGD_LRS = (0.125, 0.25, 0.5, 1.0, 2.0)


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


CLAIMS: list[Claim] = [
    # README.md
    claim("README.md", r"This is decent-dp (\d+\.\d+\.\d+)\.", V(version, "{}")),
    # docs/results/README.md: the wire
    claim(
        RES,
        r"`network=custom` predicts (\d+) of these (\d+) cells within 20%\s+\((\d+) at the line",
        V(within_20("calibrated_ratio"), "{}"),
        V(cells("calibrated_ratio"), "{}"),
        V(within_20("emulated_ratio"), "{}"),
    ),
    claim(
        RES,
        r"its link carries ([\d,]+) bytes per step less than flat",
        V(
            diff(
                wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step", HIER),
                wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step", HIER),
            ),
            F0,
        ),
    ),
    # docs/results/README.md: language models
    claim(
        RES,
        r"`accum_iter` 8 ended at (\d\.\d{3}) with seed 0",
        V(lambda s: s.run(f"{LM}/one-peer-exp-accum8/stage1/0"), F3),
    ),
    claim(
        RES,
        r"`complete` is level with\s+`allreduce` \(([−-]\d\.\d{3}) ± (\d\.\d{3})\)",
        V(gap_mean(*_SGD), "{:+.3f}"),
        V(gap_sd(*_SGD), F3),
    ),
    claim(
        RES,
        r"ends \+(\d\.\d{3}) ± (\d\.\d{3}) behind; `complete` keeps a\s+quarter of each point "
        r"fresh and loses (\d\.\d{3})",
        V(gap_mean(*_LATE), F3),
        V(gap_sd(*_LATE), F3),
        V(gap_mean(*_W32), F3),
    ),
    claim(
        RES,
        r"`exp_avg_sq` every 16 steps\s+(\d\.\d{3}) over 3 seeds; both moments every step "
        r"(\d\.\d{3}) on seed 0, against (\d\.\d{3})\), nor does giving\s+each worker "
        r"`allreduce`'s own `v` \((\d\.\d{3})\)",
        V(mean(f"{GAP}/complete-v/final"), F3),
        V(seed(f"{GAP}/complete-mv/stage1", 0), F3),
        V(seed(f"{GAP}/complete-adamw-lr0.004/final", 0), F3),
        V(lambda s: s.run(f"{GAP}/complete-lagged-v1/stage1/lr2e-3"), F3),
    ),
    claim(
        RES,
        r"`complete` is\s+\+(\d\.\d{3}) ± (\d\.\d{3}) behind `allreduce`, within 0.05, and at "
        r"(\d\.\d{3}) it beats `allreduce` at 32 windows\s+by (\d\.\d{3})\. At 128 windows the "
        r"gap stays \+(\d\.\d{3}) ± (\d\.\d{3})",
        V(gap_mean(*_W8), F3),
        V(gap_sd(*_W8), F3),
        V(mean(_W8[1]), F3),
        V(diff(mean(_W32[0]), mean(_W8[1])), F3),
        V(gap_mean(*_W128), F3),
        V(gap_sd(*_W128), F3),
    ),
    # docs/results/README.md: compression
    claim(
        RES,
        r"`compression=int8` sends (\d\.\d{3})x the bytes",
        V(
            ratio(
                _comp("ring", "int8", "comm/bytes_per_step"),
                _comp("ring", "none", "comm/bytes_per_step"),
            ),
            F3,
        ),
    ),
    claim(
        RES,
        r"\(`ring` (\d\.\d{4}) both, `one-peer-exp` (\d\.\d{4}) against (\d\.\d{4}), 3 seeds",
        V(_comp("ring", "int8"), "{:.4f}"),
        V(_comp("one-peer-exp", "int8"), "{:.4f}"),
        V(_comp("one-peer-exp", "none"), "{:.4f}"),
    ),
    claim(
        RES,
        r"at (\d\.\d\d)x \(`ring`\) and (\d\.\d\d)x \(`one-peer-exp`\) the",
        V(
            ratio(
                _comp("ring", "int8", "perf/samples_per_s"),
                _comp("ring", "none", "perf/samples_per_s"),
            ),
            F2,
        ),
        V(
            ratio(
                _comp("one-peer-exp", "int8", "perf/samples_per_s"),
                _comp("one-peer-exp", "none", "perf/samples_per_s"),
            ),
            F2,
        ),
    ),
    claim(
        RES,
        r"(\d\.\d\d)x at 10 Mb/s and (\d\.\d\d)x at 5 Mb/s",
        V(ratio(sps("4x1", "10mbit", "ring-int8"), sps("4x1", "10mbit", "ring")), F2),
        V(ratio(sps("4x1", "5mbit", "ring-int8"), sps("4x1", "5mbit", "ring")), F2),
    ),
    # docs/results/README.md: outer optimizers
    claim(
        RES,
        r"`allreduce` ends at (\d\.\d\d)\. DiLoCo",
        V(mean(f"{OUTER}/allreduce-adamw/final"), F2),
    ),
    claim(
        RES,
        r"by (\d\.\d\d) nats on average at H=16 and (\d\.\d\d) at H=64",
        V(diff(mean(f"{OUTER}/diloco-H16/final"), mean(f"{OUTER}/local-sgd-H16/final")), F2),
        V(diff(mean(f"{OUTER}/diloco-H64/final"), mean(f"{OUTER}/local-sgd-H64/final")), F2),
    ),
    claim(
        RES,
        r"`local-sgd` ends at (\d\.\d{3}) ± (\d\.\d{3}), with seed 1's\s+stall gone, and DiLoCo at "
        r"(\d\.\d{3}) ± (\d\.\d{3}), its seed 1 still (\d\.\d\d) above",
        V(mean(_LOCAL_T), F3),
        V(sd(_LOCAL_T), F3),
        V(mean(_DILOCO_T), F3),
        V(sd(_DILOCO_T), F3),
        V(
            lambda s: s.seeds(_DILOCO_T)[1] - (s.seeds(_DILOCO_T)[0] + s.seeds(_DILOCO_T)[2]) / 2,
            F2,
        ),
    ),
    claim(
        RES,
        r"still behind plain averaging on each seed, by (\d\.\d\d) on average",
        V(diff(mean(_DILOCO_T), mean(_LOCAL_T)), F2),
    ),
    claim(
        RES,
        r"ends at\s+(\d\.\d\d) ± (\d\.\d\d)\. That is ahead of DiLoCo at the same inner lr "
        r"\((\d\.\d\d)\) on each seed, by (\d\.\d\d) on\s+average, at (\d\.\d{3}) of its peak and "
        r"(\d\.\d{3}) of its mean bytes; it is \*\*behind\*\* DiLoCo with its\s+inner lr tuned "
        r"\((\d\.\d{3}) ± (\d\.\d{3})\), by (\d\.\d\d)\. In float32 it ends at (\d\.\d\d)",
        V(mean(_INT8), F2),
        V(sd(_INT8), F2),
        V(mean(_DILOCO), F2),
        V(diff(mean(_DILOCO), mean(_INT8)), F2),
        V(
            ratio(
                mean(_INT8, "comm/peak_bytes_per_step"), mean(_DILOCO, "comm/peak_bytes_per_step")
            ),
            F3,
        ),
        V(ratio(mean(_INT8, "comm/bytes_per_step"), mean(_DILOCO, "comm/bytes_per_step")), F3),
        V(mean(_DILOCO_T), F3),
        V(sd(_DILOCO_T), F3),
        V(diff(mean(_INT8), mean(_DILOCO_T)), F2),
        V(mean(f"{STREAM}/streaming-f4/final"), F2),
    ),
    claim(
        RES,
        r"DiLoCo's final loss\s+(\d\.\d\d) times sooner than `allreduce`",
        V(link_speedup("streaming-f4-int8"), F2),
    ),
    claim(
        RES,
        r"ends at (\d\.\d{3}) ± (\d\.\d{3}), behind the unscaled (\d\.\d{3}) ± (\d\.\d{3})",
        V(mean(f"{STREAM}/slowmo-ope-f4-scaled/final"), F3),
        V(sd(f"{STREAM}/slowmo-ope-f4-scaled/final"), F3),
        V(mean(f"{STREAM}/slowmo-ope-f4/final"), F3),
        V(sd(f"{STREAM}/slowmo-ope-f4/final"), F3),
    ),
    # docs/results/network/README.md
    claim(
        NET,
        r"at every rate: (\d\.\d\d)x at\s+5 Mb/s \((\d+) against (\d+) samples/s\), (\d\.\d\d)x at "
        r"10 Mb/s, (\d\.\d\d)x at 100 Mb/s and\s+(\d\.\d\d)x at 1 Gb/s",
        V(ratio(sps("4x1", "5mbit", "ring"), sps("4x1", "5mbit", "allreduce")), F2),
        V(sps("4x1", "5mbit", "ring"), F0),
        V(sps("4x1", "5mbit", "allreduce"), F0),
        V(ratio(sps("4x1", "10mbit", "ring"), sps("4x1", "10mbit", "allreduce")), F2),
        V(ratio(sps("4x1", "100mbit", "ring"), sps("4x1", "100mbit", "allreduce")), F2),
        V(ratio(sps("4x1", "1gbit", "ring"), sps("4x1", "1gbit", "allreduce")), F2),
    ),
    claim(
        NET,
        r"is (\d\.\d)x uncompressed `ring` at 5 Mb/s and\s+(\d\.\d)x at 10 Mb/s",
        V(ratio(sps("4x1", "5mbit", "ring-int8"), sps("4x1", "5mbit", "ring")), "{:.1f}"),
        V(ratio(sps("4x1", "10mbit", "ring-int8"), sps("4x1", "10mbit", "ring")), "{:.1f}"),
    ),
    claim(
        NET,
        r"`ring` is (\d\.\d\d)x `allreduce` \(([\d,]+) against (\d+)\)",
        V(ratio(sps("8x1", "10mbit", "ring"), sps("8x1", "10mbit", "allreduce")), F2),
        V(sps("8x1", "10mbit", "ring"), F0),
        V(sps("8x1", "10mbit", "allreduce"), F0),
    ),
    claim(
        NET,
        r"at 4 x 2, 10 Mb/s: `hierarchical`\s+(\d+) KB, flat `one-peer-exp` (\d+) KB, `allreduce` (\d+) KB",
        *(V(kb(wire_field("4x2", "10mbit", a, "wire_bytes_per_step")), F0) for a in _H_ARMS),
    ),
    claim(
        NET,
        r"`one-peer-exp` carries (\d+) KB per step more than `hierarchical`",
        V(
            kb(
                diff(
                    wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step"),
                    wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step"),
                )
            ),
            F0,
        ),
    ),
    claim(
        NET,
        r"it beats flat `one-peer-exp` \((\d\.\d\d)x at 4 x 2\)",
        V(ratio(sps("4x2", "10mbit", "hierarchical"), sps("4x2", "10mbit", "one-peer-exp")), F2),
    ),
    claim(
        NET,
        r"\(`one-peer-exp` (\d\.\d{3})-(\d\.\d{3}) s\)",
        V(wire_field("4x1", "100mbit", "one-peer-exp", "step_min_s"), F3),
        V(wire_field("4x1", "100mbit", "one-peer-exp", "step_max_s"), F3),
    ),
    claim(
        NET,
        r"\| emulator, line rate \| (\d+) of (\d+) cells \|\n\| emulator, calibrated \| \*\*(\d+) of (\d+)\*\* \|"
        r"\n\| simulator, line rate \| (\d+) of (\d+) \|\n\| simulator, calibrated \| (\d+) of (\d+) \|",
        V(within_20("emulated_ratio"), "{}"),
        V(cells("emulated_ratio"), "{}"),
        V(within_20("calibrated_ratio"), "{}"),
        V(cells("calibrated_ratio"), "{}"),
        V(within_20("simulated_ratio"), "{}"),
        V(cells("simulated_ratio"), "{}"),
        V(within_20("simulated_cal_ratio"), "{}"),
        V(cells("simulated_cal_ratio"), "{}"),
    ),
    # docs/results/hierarchical/README.md
    claim(
        HIER_PAGE,
        r"`hierarchical` is (\d\.\d\d)x \(2 x 4\) to (\d\.\d\d)x \(4 x 2\) `allreduce` and ahead of "
        r"flat\s+`one-peer-exp` \((\d\.\d\d)x at 4 x 2\)",
        V(
            ratio(
                sps("2x4", "10mbit", "hierarchical", HIER), sps("2x4", "10mbit", "allreduce", HIER)
            ),
            F2,
        ),
        V(
            ratio(
                sps("4x2", "10mbit", "hierarchical", HIER), sps("4x2", "10mbit", "allreduce", HIER)
            ),
            F2,
        ),
        V(
            ratio(
                sps("4x2", "10mbit", "hierarchical", HIER),
                sps("4x2", "10mbit", "one-peer-exp", HIER),
            ),
            F2,
        ),
    ),
    *(
        claim(
            HIER_PAGE,
            rf"\| {label} \| ([\d,]+) \|",
            V(wire_field("4x2", "10mbit", arm, "wire_bytes_per_step", HIER), F0),
        )
        for label, arm in (
            ("`hierarchical`", "hierarchical"),
            ("`one-peer-exp`", "one-peer-exp"),
            (r"`allreduce` \(torch DDP\)", "allreduce"),
        )
    ),
    claim(
        HIER_PAGE,
        r"The two decentralized arms differ by ([\d,]+) bytes per step",
        V(
            diff(
                wire_field("4x2", "10mbit", "one-peer-exp", "wire_bytes_per_step", HIER),
                wire_field("4x2", "10mbit", "hierarchical", "wire_bytes_per_step", HIER),
            ),
            F0,
        ),
    ),
    # docs/results/lm/README.md
    claim(
        LM_PAGE,
        r"ends at (\d\.\d{3}) with seed 0, against (\d\.\d{3}) with `accum_iter` 1 and (\d\.\d{3}) with 4",
        V(lambda s: s.run(f"{LM}/one-peer-exp-accum8/stage1/0"), F3),
        V(lambda s: s.run(f"{LM}/one-peer-exp-accum/stage1/0"), F3),
        V(lambda s: s.run(f"{LM}/one-peer-exp-accum/stage1/1"), F3),
    ),
    claim(
        LM_PAGE,
        r"It is (\d\.\d\d) nats behind AdamW at 4e-3",
        V(
            diff(
                mean(f"{LM}/one-peer-exp-accum/final"),
                mean(f"{LM}/one-peer-exp-adamw-lr0.004/final"),
            ),
            F2,
        ),
    ),
    claim(
        LM_PAGE,
        r"from seed 0 \((\d\.\d{3}) and (\d\.\d{3}), interior",
        V(lambda s: s.run(f"{LM}/complete-adamw/stage1/3"), F3),
        V(lambda s: s.run(f"{LM}/one-peer-exp-adamw/stage1/3"), F3),
    ),
    # docs/results/lm_gap/README.md
    claim(
        GAP_PAGE,
        r"seed 1 at 4e-3 gave (\d\.\d+), the committed value",
        V(seed(f"{GAP}/local-sgd-H16-lr/final", 1), "{!r}"),
    ),
    seed_row(GAP_PAGE, r"`allreduce` \| \u2013", f"{GAP}/allreduce-adamw/final", sd_too=False),
    seed_row(GAP_PAGE, r"`complete` \| off", f"{GAP}/complete-adamw-lr0.004/final", sd_too=False),
    seed_row(
        GAP_PAGE,
        r"`complete`, v shared \| 16 \(best of seed 0\)",
        f"{GAP}/complete-v/final",
        sd_too=False,
    ),
    seed_row(
        GAP_PAGE, r"`one-peer-exp` \| off", f"{GAP}/one-peer-exp-adamw-lr0.004/final", sd_too=False
    ),
    seed_row(GAP_PAGE, r"2e-3", _LOCAL_T),
    seed_row(GAP_PAGE, r"2e-3 \(best of seed 0\)", _DILOCO_T),
    seed_row(GAP_PAGE, r"`allreduce`", f"{GAP}/allreduce-sgd/final"),
    seed_row(GAP_PAGE, r"`complete`", f"{GAP}/complete-sgd/final"),
    gap_row(GAP_PAGE, r"gap, paired by seed", *_SGD),
    gap_row(GAP_PAGE, r"8 windows, 2048 steps", *_W8),
    gap_row(GAP_PAGE, r"32 windows, 512 steps", *_W32),
    gap_row(GAP_PAGE, r"128 windows, 128 steps", *_W128),
    *(
        claim(
            GAP_PAGE,
            rf"^\| {w} \| {gb} \| {st} \| {wu} \| 4\.19M \| {_N} ± {_N} \({lr}\) \| {_N} ± {_N} \({lr}\) \|",
            V(mean(a), F3),
            V(sd(a), F3),
            V(mean(c), F3),
            V(sd(c), F3),
        )
        for w, gb, st, wu, lr, (a, c) in (
            ("8", "32", "2048", "128", "8e-3", _W8),
            (r"32 \(`lm_small`\)", "128", "512", "32", "4e-3", _W32),
            ("128", "512", "128", "8", "2e-3", _W128),
        )
    ),
    claim(
        GAP_PAGE,
        rf"3 seeds: {_N}, {_N}, {_N}, \*\*{_N} ± {_N}\*\*, a gap of\s+\*\*\+{_N} ± {_N}\*\*",
        *(V(seed(_LATE[1], i), F3) for i in range(3)),
        V(mean(_LATE[1]), F3),
        V(sd(_LATE[1]), F3),
        V(gap_mean(*_LATE), F3),
        V(gap_sd(*_LATE), F3),
    ),
    # docs/results/streaming/README.md
    *(
        spread_row(STREAM_PAGE, prefix, f"{STREAM}/{name}/final")
        for prefix, name in (
            ("`allreduce`", "allreduce-adamw"),
            ("DiLoCo, F=1", "diloco-H16"),
            ("streaming DiLoCo, F=4, float32", "streaming-f4"),
            ("streaming DiLoCo, F=4, int8", "streaming-f4-int8"),
            ("streaming SlowMo over `one-peer-exp`, F=4", "slowmo-ope-f4"),
            (
                r"the same, SlowMo's own update scaled by the inner lr \(`outer.scale_by_inner_lr=true`\)",
                "slowmo-ope-f4-scaled",
            ),
        )
    ),
    claim(
        STREAM_PAGE,
        r"ahead of this page's DiLoCo \(inner lr 4e-3, (\d\.\d{3})\) on each seed, by (\d\.\d\d) nats on "
        r"average\. It\s+is \*\*not\*\* ahead of DiLoCo with its inner lr tuned: at 2e-3 DiLoCo ends at "
        r"(\d\.\d{3}) ± (\d\.\d{3})\s+\(\[[^\]]*\]\([^)]*\)\), (\d\.\d\d) below",
        V(mean(_DILOCO), F3),
        V(diff(mean(_DILOCO), mean(_INT8)), F2),
        V(mean(_DILOCO_T), F3),
        V(sd(_DILOCO_T), F3),
        V(diff(mean(_INT8), mean(_DILOCO_T)), F2),
    ),
    claim(
        STREAM_PAGE,
        r"Over 3 seeds it ends at (\d\.\d{3}) ± (\d\.\d{3}), behind",
        V(mean(f"{STREAM}/slowmo-ope-f4-scaled/final"), F3),
        V(sd(f"{STREAM}/slowmo-ope-f4-scaled/final"), F3),
    ),
    # docs/results/outer/lm_small/README.md
    *(
        spread_row(OUTER_PAGE, prefix, f"{OUTER}/{name}/final", inline=True)
        for prefix, name in (
            ("`local-sgd` H=16", "local-sgd-H16"),
            ("DiLoCo H=16, outer lr 0.5", "diloco-H16"),
            ("`local-sgd` H=64", "local-sgd-H64"),
            ("DiLoCo H=64, outer lr 0.5", "diloco-H64"),
        )
    ),
    claim(
        OUTER_PAGE,
        r"`local-sgd` ends at (\d\.\d{3}) ± (\d\.\d{3}) and DiLoCo at (\d\.\d{3}) ± (\d\.\d{3})",
        V(mean(_LOCAL_T), F3),
        V(sd(_LOCAL_T), F3),
        V(mean(_DILOCO_T), F3),
        V(sd(_DILOCO_T), F3),
    ),
    # docs/results/README.md: lm_quick
    claim(
        RES,
        r"unigram entropy is (\d\.\d{3}) nats; every run",
        V(lambda s: s.run("docs/results/lm_quick/runs/0", "unigram_entropy"), F3),
    ),
    # docs/performance.md: make bench-upstream
    *(
        claim(
            "docs/performance.md",
            rf"^\| {model} \| {procs} \| {topo} \| (\d+\.\d) \| (\d+\.\d) \| (\d+\.\d) \| \**(\d\.\d\d)\** \|",
            V(upstream_ms(model, procs, "ours"), "{:.1f}"),
            V(upstream_ms(model, procs, "0.2.3"), "{:.1f}"),
            V(upstream_ms(model, procs, "torch-ddp"), "{:.1f}"),
            V(ratio(upstream_ms(model, procs, "ours"), upstream_ms(model, procs, "0.2.3")), F2),
        )
        for model, procs, topo in (
            ("gpt", 2, "ring"),
            ("gpt", 4, "one-peer-exp"),
            ("mlp", 2, "ring"),
            ("mlp", 4, "one-peer-exp"),
        )
    ),
    # docs/cluster.md
    claim(
        "docs/cluster.md",
        r"\((\d+) of (\d+) cells within 20%,\s+predicted/measured (\d\.\d\d) to (\d\.\d\d),",
        V(within_20("simulated_cal_ratio"), "{}"),
        V(cells("simulated_cal_ratio"), "{}"),
        V(
            lambda s: min(
                r["simulated_cal_ratio"] for r in s.json(WIRE) if r.get("simulated_cal_ratio")
            ),
            F2,
        ),
        V(
            lambda s: max(
                r["simulated_cal_ratio"] for r in s.json(WIRE) if r.get("simulated_cal_ratio")
            ),
            F2,
        ),
    ),
    claim(
        "docs/cluster.md",
        r"`complete` and (\d+) MB per host link\s+against (\d+) MB",
        V(chooser_mb(CHOOSE_25G, "hierarchical"), F0),
        V(chooser_mb(CHOOSE_25G, "complete"), F0),
    ),
    # docs/results/noniid/README.md and the non-IID section of docs/results/README.md
    *(
        claim(
            NONIID_PAGE,
            rf"^\| {a} \| {t}(?: \(H=8\))? \| {o} \| (\d+\.\d\d) ± (\d+\.\d\d) \| ([\u2212-]\d+\.\d\d) \|",
            V(noniid(a, t, o, 0), F2),
            V(noniid(a, t, o, 1), F2),
            V(noniid(a, t, o, 2), F2),
        )
        for a, t, o in _NONIID_ROWS
    ),
    *(
        claim(
            NONIID_PAGE,
            rf"^\| {a} \| allreduce \| sgd \| (\d+\.\d\d) ± (\d+\.\d\d) \| 0 \|",
            V(noniid(a, "allreduce", "sgd", 0), F2),
            V(noniid(a, "allreduce", "sgd", 1), F2),
        )
        for a in ("0.1", "1.0")
    ),
    claim(
        NONIID_PAGE,
        r"(\d+)% of it on the\s+ring \((\d+\.\d) → (\d+\.\d) points\), (\d+)% on one-peer-exp "
        r"\((\d+\.\d) → (\d+\.\d) points\) and (\d+)% for local SGD with\s+H = 8 "
        r"\((\d+\.\d) → (\d+\.\d) points\)",
        *(
            v
            for t in ("ring", "one-peer-exp", "local-sgd")
            for v in (
                V(closed("0.1", t), F0),
                V(neg(noniid("0.1", t, "sgd", 2)), "{:.1f}"),
                V(neg(noniid("0.1", t, "qgm_sgd", 2)), "{:.1f}"),
            )
        ),
    ),
    claim(
        NONIID_PAGE,
        r"\(std (\d+\.\d) → (\d+\.\d) on the ring,\s+(\d+\.\d) → (\d+\.\d) for local SGD\)",
        V(noniid("0.1", "ring", "sgd", 1), "{:.1f}"),
        V(noniid("0.1", "ring", "qgm_sgd", 1), "{:.1f}"),
        V(noniid("0.1", "local-sgd", "sgd", 1), "{:.1f}"),
        V(noniid("0.1", "local-sgd", "qgm_sgd", 1), "{:.1f}"),
    ),
    *(
        claim(
            page,
            r"ring and one-peer-exp \((\d\.\d\d) and (\d\.\d\d)\)",
            V(neg(noniid("1.0", "ring", "sgd", 2)), F2),
            V(neg(noniid("1.0", "one-peer-exp", "sgd", 2)), F2),
        )
        for page in (NONIID_PAGE,)
    ),
    claim(
        RES,
        r"\(alpha 1\.0\):\*\* plain momentum is about 1 point behind all-reduce on the ring and "
        r"one-peer-exp\s+\((\d\.\d\d) and (\d\.\d\d) points\) and (\d\.\d\d) with local SGD; QGM "
        r"is (\d\.\d\d) to (\d\.\d\d) points",
        V(neg(noniid("1.0", "ring", "sgd", 2)), F2),
        V(neg(noniid("1.0", "one-peer-exp", "sgd", 2)), F2),
        V(neg(noniid("1.0", "local-sgd", "sgd", 2)), F2),
        V(
            diff(
                noniid("1.0", "one-peer-exp", "sgd", 2), noniid("1.0", "one-peer-exp", "qgm_sgd", 2)
            ),
            F2,
        ),
        V(diff(noniid("1.0", "ring", "sgd", 2), noniid("1.0", "ring", "qgm_sgd", 2)), F2),
    ),
    claim(
        NONIID_PAGE,
        r"and QGM is (\d\.\d\d) to (\d\.\d\d) points \*worse\* there",
        V(
            diff(
                noniid("1.0", "one-peer-exp", "sgd", 2), noniid("1.0", "one-peer-exp", "qgm_sgd", 2)
            ),
            F2,
        ),
        V(diff(noniid("1.0", "ring", "sgd", 2), noniid("1.0", "ring", "qgm_sgd", 2)), F2),
    ),
    claim(
        RES,
        r"Ring: (\d+)% of the gap \((\d+\.\d) to (\d+\.\d) points\)\.\n\s+- One-peer-exp: (\d+)% "
        r"\((\d+\.\d) to (\d+\.\d) points\)\.\n\s+- Local SGD: (\d+)% \((\d+\.\d) to (\d+\.\d) points\)",
        *(
            v
            for t in ("ring", "one-peer-exp", "local-sgd")
            for v in (
                V(closed("0.1", t), F0),
                V(neg(noniid("0.1", t, "sgd", 2)), "{:.1f}"),
                V(neg(noniid("0.1", t, "qgm_sgd", 2)), "{:.1f}"),
            )
        ),
    ),
    claim(
        RES,
        r"on the ring the standard deviation falls from (\d\.\d) to (\d\.\d) points",
        V(noniid("0.1", "ring", "sgd", 1), "{:.1f}"),
        V(noniid("0.1", "ring", "qgm_sgd", 1), "{:.1f}"),
    ),
    # docs/results/compression/summary.md (written by the sweep) and README.md
    *(
        claim(
            COMP_SUMMARY,
            rf"^\| {t} \| {_LEVEL[c]} \| 3 \| (\d\.\d{{4}}) ± (\d\.\d{{4}}) \| ([+-]\d\.\d\d) \| ([\d,]+) \| "
            r"(\d\.\d{3})x \| (\d+) ± (\d+) \| (\d\.\d\d)x \|",
            V(_comp(t, c), "{:.4f}"),
            V(sd(f"{COMP}/{t}_{c}_seed*", "eval/acc"), "{:.4f}"),
            V(lambda s, t=t, c=c: 100 * (_comp(t, c)(s) - _comp(t, "none")(s)), "{:+.2f}"),
            V(_comp(t, c, "comm/bytes_per_step"), F0),
            V(
                ratio(_comp(t, c, "comm/bytes_per_step"), _comp(t, "none", "comm/bytes_per_step")),
                F3,
            ),
            V(_comp(t, c, "perf/samples_per_s"), "{:.0f}"),
            V(sd(f"{COMP}/{t}_{c}_seed*", "perf/samples_per_s"), "{:.0f}"),
            V(ratio(_comp(t, c, "perf/samples_per_s"), _comp(t, "none", "perf/samples_per_s")), F2),
        )
        for t in ("ring", "one-peer-exp")
        for c in ("none", "bf16", "int8", "randk")
    ),
    claim(
        COMP_PAGE,
        r"\*\*int8 meets the goal\*\*: (\d\.\d{3})x the bytes of uncompressed gossip \(([\d,]+) against "
        r"([\d,]+)\s+bytes per step\)",
        V(
            ratio(
                _comp("ring", "int8", "comm/bytes_per_step"),
                _comp("ring", "none", "comm/bytes_per_step"),
            ),
            F3,
        ),
        V(_comp("ring", "int8", "comm/bytes_per_step"), F0),
        V(_comp("ring", "none", "comm/bytes_per_step"), F0),
    ),
    claim(
        COMP_PAGE,
        r"on `ring`\s+\((\d\.\d{4}) both\) and (\d\.\d\d) points lower on `one-peer-exp` \((\d\.\d{4}) against "
        r"(\d\.\d{4})\)",
        V(_comp("ring", "int8"), "{:.4f}"),
        V(
            lambda s: 100 * (_comp("one-peer-exp", "none")(s) - _comp("one-peer-exp", "int8")(s)),
            F2,
        ),
        V(_comp("one-peer-exp", "int8"), "{:.4f}"),
        V(_comp("one-peer-exp", "none"), "{:.4f}"),
    ),
    claim(
        COMP_PAGE,
        r"link sets the step time: (\d+) to (\d+) samples/s uncompressed,\s+(\d\.\d)x with bf16, "
        r"(\d\.\d\d) to (\d\.\d\d)x with int8",
        V(_comp("one-peer-exp", "none", "perf/samples_per_s"), "{:.0f}"),
        V(_comp("ring", "none", "perf/samples_per_s"), "{:.0f}"),
        V(
            ratio(
                _comp("ring", "bf16", "perf/samples_per_s"),
                _comp("ring", "none", "perf/samples_per_s"),
            ),
            "{:.1f}",
        ),
        V(
            ratio(
                _comp("ring", "int8", "perf/samples_per_s"),
                _comp("ring", "none", "perf/samples_per_s"),
            ),
            F2,
        ),
        V(
            ratio(
                _comp("one-peer-exp", "int8", "perf/samples_per_s"),
                _comp("one-peer-exp", "none", "perf/samples_per_s"),
            ),
            F2,
        ),
    ),
    # docs/network-and-simulation.md: the simulator against the reference paper
    *(
        claim(
            "docs/network-and-simulation.md",
            rf"^\| {label} \| {method} \| (\d+\.\d) \| (\d+\.\d) \| {tail}",
            V(calibration(profile, method, "measured_ms"), "{:.1f}"),
            V(calibration(profile, method, "predicted_ms"), "{:.1f}"),
            *(
                (V(lambda s, p=profile, m=method: 100 * calibration(p, m, "error")(s), "{:+.1f}"),)
                if tail != "fitted"
                else ()
            ),
        )
        for label, profile, method, tail in (
            ("A40, 25 GbE", "a40_ethernet_25g", "allreduce", "fitted"),
            ("A40, 25 GbE", "a40_ethernet_25g", "alternating-exp-ring", r"\*\*([+-]\d+\.\d)%\*\*"),
            ("A100, InfiniBand", "a100_infiniband_hdr", "allreduce", r"([+-]\d+\.\d)%"),
            ("A100, InfiniBand", "a100_infiniband_hdr", "alternating-exp-ring", r"([+-]\d+\.\d)%"),
        )
    ),
    claim(
        "docs/network-and-simulation.md",
        r"The predicted speedup on 25 GbE is (\d\.\d\d)x, against (\d\.\d\d)x measured",
        V(
            ratio(
                calibration("a40_ethernet_25g", "allreduce", "predicted_ms"),
                calibration("a40_ethernet_25g", "alternating-exp-ring", "predicted_ms"),
            ),
            F2,
        ),
        V(
            ratio(
                calibration("a40_ethernet_25g", "allreduce", "measured_ms"),
                calibration("a40_ethernet_25g", "alternating-exp-ring", "measured_ms"),
            ),
            F2,
        ),
    ),
    claim(
        "docs/network-and-simulation.md",
        r"Only the Ethernet efficiency is fitted \((\d\.\d{3}),",
        V(calibration("a40_ethernet_25g", "allreduce", "efficiency"), F3),
    ),
    # docs/results/lm_gap/README.md: one-seed arms
    *(
        one_run(GAP_PAGE, prefix, f"{GAP}/{run}")
        for prefix, run in (
            (r"`complete`, v shared \| 1", "complete-v/stage1/0"),
            (r"`complete`, v shared \| 4", "complete-v/stage1/1"),
            (r"`one-peer-exp`, v shared \| 1", "one-peer-exp-v/stage1/0"),
            (r"`one-peer-exp`, v shared \| 4", "one-peer-exp-v/stage1/1"),
            (r"`one-peer-exp`, v shared \| 16", "one-peer-exp-v/stage1/2"),
            (r"`complete` \| none", "complete-adamw-lr0.004/final/seed0"),
            (r"`complete` \| `exp_avg_sq`", "complete-v/stage1/0"),
            (r"`complete` \| `exp_avg`", "complete-m/stage1/0"),
            (r"`complete` \| `exp_avg` and `exp_avg_sq`", "complete-mv/stage1/0"),
            (r"`allreduce` \| \u2013", "allreduce-adamw/final/seed0"),
            (r"AdamW \(the baseline\) \| 4e-3", "complete-adamw-lr0.004/final/seed0"),
            (
                r"LaggedVAdamW, nothing shared \(the lag and clip alone\) \| 4e-3",
                "complete-lagged-v0/stage1/0",
            ),
            (r"LaggedVAdamW, `v` from the mean gradient \| 4e-3", "complete-lagged-v1/stage1/0"),
            (
                r"LaggedVAdamW, `v` from the mean gradient \| 2e-3",
                "complete-lagged-v1/stage1/lr2e-3",
            ),
            (
                r"LaggedVAdamW, `v` from the mean gradient \| 1e-3",
                "complete-lagged-v1/stage1/lr0.001",
            ),
            (
                r"LaggedVAdamW, `v` from the mean gradient, `m` shared \| 4e-3",
                "complete-lagged-m1/stage1/0",
            ),
            (
                r"LaggedVAdamW, `v` from the mean gradient, `m` shared \| 2e-3",
                "complete-lagged-m1/stage1/lr2e-3",
            ),
        )
    ),
    claim(
        "docs/cluster.md",
        r"gossip (\+\d+\.\d)% on 25 GbE, (-\d+\.\d)% on\s+InfiniBand",
        V(
            lambda s: 100 * calibration("a40_ethernet_25g", "alternating-exp-ring", "error")(s),
            "{:+.1f}",
        ),
        V(
            lambda s: 100 * calibration("a100_infiniband_hdr", "alternating-exp-ring", "error")(s),
            "{:+.1f}",
        ),
    ),
    # docs/performance.md: make bench
    claim(
        "docs/performance.md",
        r"the wrapper runs at (\d\.\d\d)-(\d\.\d\d)x torch DDP\s+on the MLP at 4 processes \(one-peer-exp "
        r"(\d\.\d\d)x\) and (\d\.\d\d)-(\d\.\d\d)x at 2, and at\s+(\d\.\d\d)-(\d\.\d\d)x on ResNet-18",
        V(bench_vs_ddp("mlp", 4), F2),
        V(bench_vs_ddp("mlp", 4, pick=max), F2),
        V(bench_vs_ddp("mlp", 4, "decent/one-peer-exp"), F2),
        V(bench_vs_ddp("mlp", 2), F2),
        V(bench_vs_ddp("mlp", 2, pick=max), F2),
        V(bench_vs_ddp("resnet18", None), F2),
        V(bench_vs_ddp("resnet18", None, pick=max), F2),
    ),
    # docs/results/streaming/README.md: the slow link
    claim(
        STREAM_PAGE,
        r"\| time to (\d\.\d{3}) \(DiLoCo's final mean\) \|",
        V(lambda s: float(s.key(LINK, "target")), F3),
    ),
    *(
        claim(
            STREAM_PAGE,
            rf"^\| {label} \| (\d\.\d{{3}}) \| ([\d,]+) \| (\d+) s \(step (\d+)\) \| (\d\.\d\d)× \|",
            V(link_arm(arm, "step_s"), F3),
            V(link_arm(arm, "tokens_per_s"), F0),
            V(link_arm(arm, "time_to_target", 1), "{:.0f}"),
            V(link_arm(arm, "time_to_target", 0), "{:.0f}"),
            V(
                ratio(
                    link_arm("allreduce-adamw", "time_to_target", 1),
                    link_arm(arm, "time_to_target", 1),
                ),
                F2,
            ),
        )
        for label, arm in (
            ("`allreduce`", "allreduce-adamw"),
            ("DiLoCo, F=1", "diloco-H16"),
            ("streaming, F=4, float32", "streaming-f4"),
            ("streaming, F=4, int8", "streaming-f4-int8"),
            ("SlowMo over `one-peer-exp`, F=4", "slowmo-ope-f4"),
        )
    ),
    # docs/results/lm_gap/README.md: the learning-rate grids (seed 0)
    grid_row(GAP_PAGE, "`allreduce`, 8 windows", f"{GAP}/allreduce-w8/stage1", _BATCH_LRS),
    grid_row(GAP_PAGE, "`complete`, 8 windows", f"{GAP}/complete-w8/stage1", _BATCH_LRS),
    grid_row(GAP_PAGE, "`allreduce`, 128 windows", f"{GAP}/allreduce-w128/stage1", _W128_LRS),
    grid_row(GAP_PAGE, "`complete`, 128 windows", f"{GAP}/complete-w128/stage1", _W128_LRS),
    grid_row(
        GAP_PAGE,
        "`allreduce`, AdamW one step late",
        f"{GAP}/allreduce-delayed/stage1",
        _BATCH_LRS[:5],
    ),
    grid_row(
        GAP_PAGE,
        r"`allreduce` \(\[\.\./lm\]\(\.\./lm/README\.md\)\)",
        f"{LM}/allreduce-adamw/stage1",
        (None, 1e-3, 2e-3, 4e-3, 8e-3),
    ),
    grid_row(GAP_PAGE, "`allreduce`", f"{GAP}/allreduce-sgd/stage1", _SGD_LRS),
    grid_row(GAP_PAGE, "`complete`", f"{GAP}/complete-sgd/stage1", _SGD_LRS),
    claim(
        GAP_PAGE,
        rf"^\| 5e-4 \| {_N} \| \| \| \|\n\| 1e-3 \| {_N} \| \| \| \|\n(?:.*\n){{2}}\| 8e-3 \| {_N} \|",
        *(V(at(f"{GAP}/local-sgd-H16-lr/stage1", lr), F3) for lr in (5e-4, 1e-3, 8e-3)),
    ),
    seed_row(GAP_PAGE, r"4e-3 \(allreduce's, committed\)", f"{OUTER}/local-sgd-H16/final"),
    claim(
        GAP_PAGE,
        rf"^\| 1e-3 \| {_N} \| \| \| \|\n.*\n\| 4e-3 \(allreduce's, committed\) \| {_N} \| \| \| \|\n"
        rf"\| 8e-3 \| {_N} \|",
        *(V(at(f"{GAP}/diloco-H16-lr/stage1", lr), F3) for lr in (1e-3, 4e-3, 8e-3)),
    ),
    claim(
        GAP_PAGE,
        rf"0\.3 → {_N}, \*\*0\.5 → {_N}\*\*,\s+0\.7 → {_N}, 1\.0 → {_N}\.",
        *(
            V(at(f"{GAP}/diloco-H16-outer/stage1", lr, "outer.lr"), F3)
            for lr in (0.3, 0.5, 0.7, 1.0)
        ),
    ),
    # docs/results/outer/lm_small/README.md: the outer lr grids
    claim(
        OUTER_PAGE,
        rf"At H=16 it gave {_N}, \*\*{_N}\*\*, {_N}\s+and {_N}; at H=64 \(8 outer rounds\), {_N}, \*\*{_N}\*\*, "
        rf"{_N} and {_N}\.",
        *(
            V(at(f"{OUTER}/diloco-H{h}/stage1", lr, "outer.lr"), F3)
            for h in (16, 64)
            for lr in (0.3, 0.5, 0.7, 1.0)
        ),
    ),
    # the reruns, on the lm_gap page and the results page
    claim(
        GAP_PAGE,
        r"All (\d+) land within 0\.01 nats of the committed value; the\s+largest difference is (\d+e-\d+) "
        r"\(`local-sgd`\), (\w+) are exact to the printed digit",
        V(rerun_stat("n"), "{}"),
        V(rerun_stat("largest"), "{}"),
        V(rerun_stat("same"), "{}"),
    ),
    # docs/results/network/README.md: the calibration's terms
    claim(
        NET,
        r"efficiency (\d\.\d\d) / (\d\.\d\d) / (\d\.\d) and a cost per\s+collective of (\d) / (\d\.\d) / "
        r"(\d\.\d) ms at 10 / 100 / 1000 Mb/s, and the network stack's CPU, (\d+)-(\d+) ms per\s+MB sent beyond "
        r"loopback's at 10 and 100 Mb/s and (\d+) ms at 1 Gb/s",
        V(calibrated("10mbit", "efficiency"), F2),
        V(calibrated("100mbit", "efficiency"), F2),
        V(calibrated("1gbit", "efficiency"), "{:.1f}"),
        V(calibrated("10mbit", "collective_ms"), "{:.0f}"),
        V(calibrated("100mbit", "collective_ms"), "{:.1f}"),
        V(calibrated("1gbit", "collective_ms"), "{:.1f}"),
        V(calibrated("10mbit", "stack_cpu_ms_per_mb"), "{:.0f}"),
        V(calibrated("100mbit", "stack_cpu_ms_per_mb"), "{:.0f}"),
        V(calibrated("1gbit", "stack_cpu_ms_per_mb"), "{:.0f}"),
    ),
    # docs/results/hierarchical/README.md: before and after the phase driver
    *(
        claim(
            HIER_PAGE,
            rf"^\| {h} x {p} \| {label} \| ([\d,]+) \| ([\d,]+) \|",
            V(
                lambda s, h=h, p=p, r=r: s.run(
                    f"{BEFORE}/{h}x{p}/{r}/hierarchical/wire", "perf/samples_per_s"
                ),
                F0,
            ),
            V(sps(f"{h}x{p}", r, "hierarchical", HIER), F0),
        )
        for h, p in ((4, 2), (2, 4))
        for label, r in (("10 Mb/s", "10mbit"), ("100 Mb/s", "100mbit"))
    ),
]
