"""The figures of the pair exchange, the emulator with hosts and the simulator (see
:mod:`experiments.report.figures`).

Ids: ``pairbench.*`` (the testbed's pair-exchange benchmark), ``hier.emulated.*`` (the emulator
with hosts against the wire), ``sim.paper.*``, ``sim.sensitivity.*`` and ``sim.validation.*`` (the scale
simulator).
"""

from __future__ import annotations

import statistics

from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views_wire import PAPER_MD, sensitivity_rows
from experiments.report.figures.families import extremes, picked
from experiments.report.figures.sources import (
    A40,
    GOSSIP,
    Figure,
    calibration,
    emulated,
    emulated_within_20,
    optimistic,
    pairs,
    predicted_within_20,
    shallow_hosts,
    validation,
    validation_row,
)

SHALLOW = ("shallow_5mbit",)
NICQUEUE = ("nicqueue_5mbit", "nicqueue_50mbit", "nicqueue_500mbit")
MODES = ("allreduce-same", "allreduce-ring", "sendrecv-same", "sendrecv-ring")

RUNS = ("slow_link", "balanced")


def _sensitivity(s: Source, variant: str, column: int) -> float:
    """A point's error (%) in one variant of the simulator's sensitivity table."""
    for row in sensitivity_rows(s):
        if row[0] == variant:
            return float(row[column].split("%")[0])
    raise DataError(PAPER_MD, f"no sensitivity variant '{variant}'")


FIGURES: dict[str, Figure] = {
    **extremes(
        "pairbench.shallow-5mbit.drops-per-host",
        "{:,.0f}",
        lambda s: shallow_hosts(s, "tx_drops"),
    ),
    "pairbench.shallow-5mbit.packets-per-host": Figure(
        lambda s: round(statistics.mean(shallow_hosts(s, "tx_packets")), -2), "{:,.0f}"
    ),
    **picked(
        "pairbench.shallow-5mbit.ratio",
        "{:.2f}",
        lambda pick: pairs(pick, SHALLOW, MODES),
    ),
    **picked(
        "pairbench.nicqueue.allreduce-ring.ratio",
        "{:.2f}",
        lambda pick: pairs(pick, NICQUEUE, ("allreduce-ring",)),
    ),
    "hier.emulated.10mbit.within-20": Figure(emulated_within_20, "{:,.0f}"),
    "hier.emulated.10mbit.gossip-cells": Figure(lambda s: 2 * len(GOSSIP), "{:,.0f}"),
    **picked(
        "hier.emulated.10mbit.hierarchical-short-pct",
        "{:,.0f}",
        lambda pick: optimistic(pick),
    ),
    **{
        f"hier.emulated.{shape}.{rate}.alternating-exp-ring": Figure(
            emulated(shape, rate, "alternating-exp-ring"), "{:.2f}"
        )
        for shape, rate in (("2x4", "10mbit"), ("4x2", "100mbit"), ("2x4", "100mbit"))
    },
    "sim.paper.predicted-within-20": Figure(lambda s: predicted_within_20(False)(s).capitalize()),
    "sim.paper.predicted-points": Figure(predicted_within_20(True)),
    "sim.paper.a40.alternating-exp-ring.error-pct": Figure(
        lambda s: 100 * calibration(*A40[1], "error")(s), "{:,.0f}"
    ),
    "sim.sensitivity.infiniband-100g.a100-allreduce-pct": Figure(
        lambda s: _sensitivity(s, "InfiniBand 100 Gb/s", 4), "{:+.0f}"
    ),
    # where the link decides: every link-bound run, and the balanced link's at 2 workers
    "sim.validation.link-bound.error-pct.max": Figure(
        lambda s: max(
            abs(100 * validation_row(s, run, n, m)["error"])
            for run, ns in (("slow_link", (2, 4)), ("balanced", (2,)))
            for n in ns
            for m in ("allreduce", "ring", "one-peer-exp")
        ),
        "{:.0f}",
    ),
    "sim.validation.compute-drift.max": Figure(
        lambda s: max(
            max(c) / min(c)
            for n in (2, 4)
            for c in [[validation_row(s, run, n, "allreduce")["compute_s"] for run in RUNS]]
        ),
        "{:.1f}",
    ),
    "sim.validation.balanced.n4.one-peer-exp.vs-compute": Figure(
        lambda s: (
            validation_row(s, "balanced", 4, "one-peer-exp")["measured_s"]
            / validation_row(s, "balanced", 4, "one-peer-exp")["compute_s"]
        ),
        "{:.1f}",
    ),
    **{
        f"sim.validation.{run.replace('_', '-')}.n{n}.{method}.{key.replace('_s', '-ms')}": Figure(
            validation(run, n, method, key), "{:,.0f}"
        )
        for run, n, method, key in (
            ("slow_link", 2, "allreduce", "compute_s"),
            ("balanced", 2, "allreduce", "compute_s"),
            ("balanced", 4, "one-peer-exp", "measured_s"),
        )
    },
}

TABLES: dict[str, str] = {}
