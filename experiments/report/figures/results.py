"""The figures of the README, the results page, and the wire and hierarchical pages (see
:mod:`experiments.report.figures`).

Ids: ``wire.SHAPE.RATE.ARM.STAT`` (the wire study, ``docs/results/network/table.json``),
``wire.MODEL.within-20`` / ``.cells`` (a prediction against the wire), ``hier.SHAPE.RATE...``
(the hierarchical study's ``table.json``), ``digits.*`` and ``synthetic.*`` (ranges over the
CPU sweeps' run reports). Most figures of the results page are the studies' own ids, declared
with their pages.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from experiments.report.doc_data import DataError, Source
from experiments.report.figures.families import each, slots
from experiments.report.figures.sources import (
    BEFORE,
    DIGITS,
    HIER,
    WIRE,
    Figure,
    Fn,
    calibrated,
    cells,
    diff,
    drops,
    kb,
    ratio,
    report_range,
    sps,
    version,
    wire_field,
    within_20,
)

SYNTHETIC = "docs/results/synthetic/report.md"
BYTES = "wire_bytes_per_step"


def _range(
    prefix: str, file: str, network: str, column: str = "speedup vs allreduce"
) -> dict[str, Figure]:
    """``prefix.min`` and ``prefix.max`` of a run report's column over its decentralized rows."""
    return each(
        prefix,
        "{:.2f}",
        min=report_range(file, network, column),
        max=report_range(file, network, column, max),
    )


def _vs(shape: str, rate: str, arm: str, base: str, file: str = WIRE) -> Fn:
    return ratio(sps(shape, rate, arm, file), sps(shape, rate, base, file))


def _bytes(arm: str, file: str) -> Fn:
    return wire_field("4x2", "10mbit", arm, BYTES, file)


def _calibration(key: str, fmts: tuple[str, str, str]) -> dict[str, Figure]:
    return {
        f"wire.calibration.{rate}.{key.replace('_', '-')}": Figure(calibrated(rate, key), fmt)
        for rate, fmt in zip(("10mbit", "100mbit", "1gbit"), fmts, strict=True)
    }


def _before(shape: str, rate: str) -> Callable:
    return lambda s: s.run(f"{BEFORE}/{shape}/{rate}/hierarchical/wire", "perf/samples_per_s")


LM_QUICK = "docs/results/lm_quick/runs"
QUICK_GOSSIP = ("complete", "one-peer-exp", "base-k", "ring", "local-sgd")


def _quick(s: Source, topology: str, key: str) -> list[float]:
    """``key`` of each ``lm_quick`` run of ``topology`` (its seeds)."""
    runs = [
        f.parent.parent.name
        for f in sorted((s.root / LM_QUICK).glob("*/.hydra/overrides.yaml"))
        if f"- topology={topology}" in f.read_text().splitlines()
    ]
    if not runs:
        raise DataError(LM_QUICK, f"no run with topology={topology}")
    return [s.run(f"{LM_QUICK}/{r}", key) for r in runs]


def _quick_mean(topology: str, key: str = "eval/loss") -> Fn:
    return lambda s: statistics.mean(_quick(s, topology, key))


def _quick_range(prefix: str, fmt: str, fn: Callable[[str], Fn]) -> dict[str, Figure]:
    """``prefix.min`` and ``.max`` of ``fn(topology)`` over the decentralized topologies."""
    return each(
        prefix,
        fmt,
        min=lambda s: min(fn(t)(s) for t in QUICK_GOSSIP),
        max=lambda s: max(fn(t)(s) for t in QUICK_GOSSIP),
    )


def _quick_gap(topology: str) -> Fn:
    return diff(_quick_mean(topology), _quick_mean("allreduce"))


FIGURES: dict[str, Figure] = {
    "readme.version": Figure(version),
    # the wire study's models against the wire
    **{
        f"wire.{model}.{name}": Figure(fn(f"{model.replace('-', '_')}_ratio"))
        for model in ("emulated", "calibrated", "simulated", "simulated-cal")
        for name, fn in (("within-20", within_20), ("cells", cells))
    },
    "wire.4x2.10mbit.one-peer-exp.drops": Figure(drops("4x2", "10mbit", "one-peer-exp"), "{:.0f}"),
    # the CPU sweeps' run reports
    **each(
        "digits.acc",
        "{:.3f}",
        min=lambda s: min(float(r["final eval/acc"]) for r in s.md_rows(DIGITS)),
        max=lambda s: max(float(r["final eval/acc"]) for r in s.md_rows(DIGITS)),
    ),
    **_range("digits.speedup.loopback", DIGITS, ""),
    **_range("digits.speedup.ethernet-25g", DIGITS, "ethernet_25g"),
    **_range("synthetic.speedup.loopback", SYNTHETIC, ""),
    **_range("synthetic.speedup.ethernet-25g", SYNTHETIC, "ethernet_25g"),
    **_range("synthetic.speedup.custom", SYNTHETIC, "custom"),
    "lm-quick.one-peer-exp.wall-s.max": Figure(
        lambda s: max(_quick(s, "one-peer-exp", "wall_time_s")), "{:.0f}"
    ),
    **{
        f"lm-quick.{t}.gap": Figure(_quick_gap(t), "{:.3f}")
        for t in ("complete", "one-peer-exp", "ring")
    },
    # how far each decentralized arm misses the 0.05-nat target
    **_quick_range(
        "lm-quick.gap-over-target", "{:.2f}", lambda t: lambda s: _quick_gap(t)(s) - 0.05
    ),
    **_quick_range("lm-quick.consensus", "{:.2f}", lambda t: _quick_mean(t, "consensus/distance")),
    **_quick_range(
        "lm-quick.speedup",
        "{:.2f}",
        lambda t: ratio(
            _quick_mean(t, "perf/tokens_per_s"), _quick_mean("allreduce", "perf/tokens_per_s")
        ),
    ),
    "lm-quick.unigram-entropy": Figure(
        lambda s: s.run("docs/results/lm_quick/runs/0", "unigram_entropy"), "{:.3f}"
    ),
    # the wire study
    **{
        f"wire.4x1.{rate}.ring-vs-allreduce": Figure(
            _vs("4x1", rate, "ring", "allreduce"), "{:.2f}"
        )
        for rate in ("5mbit", "10mbit", "100mbit", "1gbit")
    },
    **{
        f"wire.4x1.{rate}.int8-speedup": Figure(_vs("4x1", rate, "ring-int8", "ring"), "{:.2f}")
        for rate in ("5mbit", "10mbit")
    },
    **{
        f"wire.{shape}.{rate}.{arm}.sps": Figure(sps(shape, rate, arm), "{:,.0f}")
        for shape, rate in (("4x1", "5mbit"), ("8x1", "10mbit"))
        for arm in ("ring", "allreduce")
    },
    "wire.8x1.10mbit.ring-vs-allreduce": Figure(
        _vs("8x1", "10mbit", "ring", "allreduce"), "{:.2f}"
    ),
    **{
        f"wire.4x2.10mbit.{arm}.kb": Figure(kb(_bytes(arm, WIRE)), "{:,.0f}")
        for arm in ("hierarchical", "one-peer-exp", "allreduce")
    },
    "wire.4x2.10mbit.one-peer-exp-over-hierarchical.kb": Figure(
        kb(diff(_bytes("one-peer-exp", WIRE), _bytes("hierarchical", WIRE))), "{:,.0f}"
    ),
    "wire.4x2.10mbit.hierarchical-vs-one-peer-exp": Figure(
        _vs("4x2", "10mbit", "hierarchical", "one-peer-exp"), "{:.2f}"
    ),
    **_calibration("efficiency", ("{:.2f}", "{:.2f}", "{:.1f}")),
    **_calibration("collective_ms", ("{:.0f}", "{:.1f}", "{:.1f}")),
    **_calibration("stack_cpu_ms_per_mb", ("{:.0f}", "{:.0f}", "{:.0f}")),
    **each(
        "wire.4x1.100mbit.one-peer-exp",
        "{:.3f}",
        step_min_s=wire_field("4x1", "100mbit", "one-peer-exp", "step_min_s"),
        step_max_s=wire_field("4x1", "100mbit", "one-peer-exp", "step_max_s"),
    ),
    # the hierarchical study
    **{
        f"hier.4x2.10mbit.{arm}.wire-bytes": Figure(_bytes(arm, HIER), "{:,.0f}")
        for arm in ("hierarchical", "one-peer-exp", "allreduce")
    },
    "hier.4x2.10mbit.one-peer-exp-over-hierarchical.bytes": Figure(
        diff(_bytes("one-peer-exp", HIER), _bytes("hierarchical", HIER)), "{:,.0f}"
    ),
    **{
        f"hier.{shape}.{rate}.hierarchical.{name}": Figure(fn, "{:,.0f}")
        for shape in ("4x2", "2x4")
        for rate in ("10mbit", "100mbit")
        for name, fn in (
            ("before-sps", _before(shape, rate)),
            ("sps", sps(shape, rate, "hierarchical", HIER)),
        )
    },
    **{
        f"hier.{shape}.10mbit.hierarchical-vs-allreduce": Figure(
            _vs(shape, "10mbit", "hierarchical", "allreduce", HIER), "{:.2f}"
        )
        for shape in ("2x4", "4x2")
    },
    "hier.4x2.10mbit.hierarchical-vs-one-peer-exp": Figure(
        _vs("4x2", "10mbit", "hierarchical", "one-peer-exp", HIER), "{:.2f}"
    ),
}

TABLES: dict[str, str] = {
    "wire.models": "\n".join(
        [
            "| model | within 20% of the wire |",
            "|---|---:|",
            "| emulator, line rate | {{wire.emulated.within-20}} of {{wire.emulated.cells}} cells |",
            "| emulator, calibrated | **{{wire.calibrated.within-20}} of {{wire.calibrated.cells}}** |",
            "| simulator, line rate | {{wire.simulated.within-20}} of {{wire.simulated.cells}} |",
            "| simulator, calibrated | {{wire.simulated-cal.within-20}} of {{wire.simulated-cal.cells}} |",
        ]
    ),
    "hier.bytes": "\n".join(
        [
            "| arm | wire bytes per step | of which training (prediction x 1.05 for TCP/IP headers) | the rest |",
            "|---|---:|---:|---:|",
            "| `hierarchical` | {{hier.4x2.10mbit.hierarchical.wire-bytes}} | 223,600 (1 S) | 158,600 |",
            "| `one-peer-exp` | {{hier.4x2.10mbit.one-peer-exp.wire-bytes}} | 298,200 (4/3 S) | 159,000 |",
            "| `allreduce` (torch DDP) | {{hier.4x2.10mbit.allreduce.wire-bytes}} | 391,400 (7/4 S) | 17,400 |",
        ]
    ),
    "hier.driver": "\n".join(
        [
            "| shape | link | before: samples/s | after | before: `comm/wait_s` per step | after |",
            "|---|---|---:|---:|---:|---:|",
            *(
                f"| {shape.replace('x', ' x ')} | {label} | {slots(f'hier.{shape}.{rate}.hierarchical', 'before-sps sps')} | {wait} |"
                for shape, rate, label, wait in (
                    ("4x2", "10mbit", "10 Mb/s", "0.191 | 0.147"),
                    ("4x2", "100mbit", "100 Mb/s", "0.028 | 0.022"),
                    ("2x4", "10mbit", "10 Mb/s", "0.196 | 0.161"),
                    ("2x4", "100mbit", "100 Mb/s", "0.032 | 0.028"),
                )
            ),
        ]
    ),
}
