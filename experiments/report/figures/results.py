"""The figures of the README, the results page, and the wire and hierarchical pages (see
:mod:`experiments.report.figures`).

Ids: ``wire.SHAPE.RATE.ARM.STAT`` (the wire study, ``docs/results/network/table.json``),
``wire.MODEL.within-20`` / ``.cells`` (a prediction against the wire), ``hier.SHAPE.RATE...``
(the hierarchical study's ``table.json`` and runs), ``digits.*`` and ``synthetic.*`` (ranges over
the CPU sweeps' run reports), ``lm-quick.*`` (the untuned ``lm_quick`` runs). Most figures of the results page are the studies' own ids, declared
with their pages.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views_wire import OWN_LINK, own_link, rate_label
from experiments.report.figures.families import each, extremes, picked, slot_cells, table
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
    return picked(prefix, "{:.2f}", lambda pick: report_range(file, network, column, pick))


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
    return extremes(prefix, fmt, lambda s: [fn(t)(s) for t in QUICK_GOSSIP])


def _quick_gap(topology: str) -> Fn:
    return diff(_quick_mean(topology), _quick_mean("allreduce"))


HIER_RUNS = "docs/results/hierarchical/runs/digits"
SHAPES = ("4x2", "2x4")
RATES = ("10mbit", "100mbit")
# what each arm sends per host link per step at 4 x 2, in models: 1, 4/3 and the ring's 7/4
SHARE = {"hierarchical": 1.0, "one-peer-exp": 4 / 3, "allreduce": 7 / 4}


def _logged_median(rel: str, key: str) -> Fn:
    """The median of ``key`` over a run's logged windows after the first (``metrics.jsonl``)."""

    def value(s: Source) -> float:
        values = [float(r[key]) for r in s.jsonl(rel) if r.get(key) is not None]
        if len(values) < 2:
            raise DataError(rel, f"fewer than two windows logging '{key}'")
        return statistics.median(values[1:])

    return value


def _wait(shape: str, rate: str, before: bool) -> Fn:
    """``hierarchical``'s wait for the exchange per step, before the phase driver or after."""
    root = BEFORE if before else HIER_RUNS
    return _logged_median(f"{root}/{shape}/{rate}/hierarchical/wire/metrics.jsonl", "comm/wait_s")


def _wait_fall(s: Source) -> list[float]:
    """How much (%) the phase driver cut ``hierarchical``'s wait, per shape and rate."""
    return [
        100 * (1 - _wait(sh, r, False)(s) / _wait(sh, r, True)(s)) for sh in SHAPES for r in RATES
    ]


def _own_link_slower(shape: str) -> Fn:
    """How much longer the own-link column's ``allreduce`` emulation at 100 Mb/s took than the
    one with hosts (the change does not touch ``allreduce``: the machine was slower)."""
    hosts, procs = (int(x) for x in shape.split("x"))

    def value(s: Source) -> float:
        cell = own_link(s, hosts, procs, "100mbit", "allreduce")
        if cell is None:
            raise DataError(OWN_LINK, f"no emulated allreduce at {shape} 100mbit")
        return cell[0] / wire_field(shape, "100mbit", "allreduce", "emulated_step_s", HIER)(s)

    return value


CAL = "calibrated_ratio"
WIRE_RUNS = "docs/results/network/runs/digits"


def _cell(model: str, shape: str, rate: str, arm: str, field: str) -> Fn:
    """A field of one row of the wire study's ``table.json``, of any model."""
    hosts, procs = (int(x) for x in shape.split("x"))
    return lambda s: float(
        s.row(WIRE, model=model, hosts=hosts, procs_per_host=procs, rate=rate, arm=arm)[field]
    )


def _gbit_misses(s: Source) -> list[float]:
    """The steps (ms) of the cells at 4 x 1 and 1 Gb/s that the calibrated emulator misses."""
    return [
        1e3 * float(r["step_s"])
        for r in s.json(WIRE)
        if (r["model"], r["hosts"], r["procs_per_host"], r["rate"]) == ("digits", 4, 1, "1gbit")
        and r.get(CAL) is not None
        and abs(r[CAL] - 1) > 0.2
    ]


def _spread(s: Source) -> float:
    """The widest spread (±%) of a cell measured several times: half its range over its mid."""
    rows = [r for r in s.json(WIRE) if (r.get("wire_runs") or 1) > 1]
    if not rows:
        raise DataError(WIRE, "no cell measured more than once")
    return max(
        100 * (r["step_max_s"] - r["step_min_s"]) / (r["step_max_s"] + r["step_min_s"])
        for r in rows
    )


def _bytes_4x1(arm: str) -> Fn:
    return wire_field("4x1", "10mbit", arm, BYTES)


def _sps_change(s: Source) -> list[float]:
    """How much (%) samples/s moved with the phase driver, per shape and rate."""
    return [
        100 * (sps(sh, r, "hierarchical", HIER)(s) / _before(sh, r)(s) - 1)
        for sh in SHAPES
        for r in RATES
    ]


def _model_bytes(s: Source) -> float:
    """The model's bytes as the library counts one payload (``one-peer-exp``'s bytes per step)."""
    return s.wire(HIER, "4x2", "10mbit", "one-peer-exp", "lib_bytes_per_step")


def _predicted(arm: str) -> Fn:
    """The bytes an arm's training sends per host link per step at 4 x 2, with 5% for TCP/IP
    headers, to the hundred."""
    return lambda s: round(_model_bytes(s) * SHARE[arm] * 1.05, -2)


def _hundreds(fn: Fn) -> Fn:
    return lambda s: round(fn(s), -2)


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
    **extremes(
        "digits.acc",
        "{:.3f}",
        lambda s: [float(r["final eval/acc"]) for r in s.md_rows(DIGITS)],
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
    "wire.calibrated.misses": Figure(
        lambda s: cells("calibrated_ratio")(s) - within_20("calibrated_ratio")(s), "{:.0f}"
    ),
    # the calibrated emulator's misses, cell by cell (the GPT's is lm_quick's)
    **{
        f"wire.{'' if model == 'digits' else 'lm-quick.'}{shape}.{rate}.{arm}."
        f"{field.removesuffix('_ratio').replace('_', '-')}": Figure(
            _cell(model, shape, rate, arm, field), "{:.2f}"
        )
        for model, shape, rate, arm, field in (
            *(("digits", "4x1", "1gbit", a, CAL) for a in ("allreduce", "complete", "ring-int8")),
            ("digits", "4x1", "10mbit", "ring-int8", CAL),
            ("digits", "4x1", "100mbit", "diloco", CAL),
            ("lm_quick", "4x1", "100mbit", "local-sgd", CAL),
            *(("digits", sh, "100mbit", "hierarchical", CAL) for sh in ("4x2", "2x4")),
            *(
                ("digits", "4x2", "100mbit", a, CAL)
                for a in ("alternating-exp-ring", "one-peer-exp")
            ),
            ("digits", "4x1", "100mbit", "allreduce", "simulated_cal_ratio"),
        )
    },
    **extremes(
        "wire.4x1.1gbit.cal-misses.step-ms",
        "{:.0f}",
        lambda s: _gbit_misses(s),
    ),
    "wire.repeats.spread-pct": Figure(_spread, "{:.0f}"),
    **{
        f"wire.4x1.10mbit.{arm}.kb": Figure(kb(_bytes_4x1(arm)), "{:,.0f}")
        for arm in ("ring", "local-sgd")
    },
    "wire.4x1.5mbit.ring.optim-ms": Figure(
        lambda s: (
            1e3
            * _logged_median(f"{WIRE_RUNS}/4x1/5mbit/ring/wire/metrics.jsonl", "comm/optim_s")(s)
        ),
        "{:.1f}",
    ),
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
    **{
        f"hier.4x2.10mbit.{arm}.{name}": Figure(fn, "{:,.0f}")
        for arm in SHARE
        for name, fn in (
            ("predicted-bytes", _predicted(arm)),
            ("rest-bytes", _hundreds(diff(_bytes(arm, HIER), _predicted(arm)))),
        )
    },
    "hier.4x2.10mbit.one-peer-exp-over-hierarchical.predicted-bytes": Figure(
        diff(_predicted("one-peer-exp"), _predicted("hierarchical")), "{:,.0f}"
    ),
    # every 5 steps the averaged model and the consensus distance each all-reduce the model
    "hier.4x2.eval-bytes": Figure(
        _hundreds(lambda s: 2 * 7 / 4 * _model_bytes(s) * 1.05 / 5), "{:,.0f}"
    ),
    **{
        f"hier.{shape}.{rate}.hierarchical.{name}": Figure(_wait(shape, rate, before), "{:.3f}")
        for shape in SHAPES
        for rate in RATES
        for name, before in (("before-wait-s", True), ("wait-s", False))
    },
    **extremes(
        "hier.driver.wait-fall-pct",
        "{:.0f}",
        lambda s: _wait_fall(s),
    ),
    **extremes(
        "hier.driver.sps-change-pct",
        "{:+.0f}",
        lambda s: _sps_change(s),
    ),
    "hier.10mbit.model-s": Figure(lambda s: 8 * _model_bytes(s) / 10e6, "{:.2f}"),
    **{
        f"hier.{shape}.10mbit.hierarchical.step-s": Figure(
            wire_field(shape, "10mbit", "hierarchical", "step_s", HIER), "{:.3f}"
        )
        for shape in SHAPES
    },
    **{
        f"hier.{shape}.compute-step-s": Figure(
            _logged_median(f"{HIER_RUNS}/{shape}/compute/metrics.jsonl", "perf/step_s"), "{:.3f}"
        )
        for shape in SHAPES
    },
    **{
        f"hier.own-link.{shape}.allreduce-100mbit-slower": Figure(_own_link_slower(shape), "{:.1f}")
        for shape in SHAPES
    },
    "hier.4x2.10mbit.hierarchical-vs-one-peer-exp": Figure(
        _vs("4x2", "10mbit", "hierarchical", "one-peer-exp", HIER), "{:.2f}"
    ),
}


def _within(model: str) -> str:
    return "{{" + f"wire.{model}.within-20" + "}} of {{" + f"wire.{model}.cells" + "}}"


TABLES: dict[str, str] = {
    "wire.models": table(
        "model | within 20% of the wire",
        "---|---:",
        [
            ["emulator, line rate", _within("emulated") + " cells"],
            ["emulator, calibrated", f"**{_within('calibrated')}**"],
            ["simulator, line rate", _within("simulated")],
            ["simulator, calibrated", _within("simulated-cal")],
        ],
    ),
    "hier.bytes": table(
        "arm | wire bytes per step | of which training (prediction x 1.05 for TCP/IP headers)"
        " | the rest",
        "---|---:|---:|---:",
        [
            [
                label,
                "{{" + p + ".wire-bytes}}",
                "{{" + p + ".predicted-bytes}} " + f"({share})",
                "{{" + p + ".rest-bytes}}",
            ]
            for label, arm, share in (
                ("`hierarchical`", "hierarchical", "1 S"),
                ("`one-peer-exp`", "one-peer-exp", "4/3 S"),
                ("`allreduce` (torch DDP)", "allreduce", "7/4 S"),
            )
            for p in [f"hier.4x2.10mbit.{arm}"]
        ],
    ),
    "hier.driver": table(
        "shape | link | before: samples/s | after | before: `comm/wait_s` per step | after",
        "---|---|---:|---:|---:|---:",
        [
            [
                shape.replace("x", " x "),
                rate_label(rate),
                *slot_cells(
                    f"hier.{shape}.{rate}.hierarchical", "before-sps sps before-wait-s wait-s"
                ),
            ]
            for shape in SHAPES
            for rate in RATES
        ],
    ),
}
