"""The figures of the pair exchange, the emulator with hosts and the simulator (see :mod:`experiments.report.figures`)."""

from __future__ import annotations

import statistics

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
    ratio,
    shallow_hosts,
    validation,
)

FIGURES: dict[str, Figure] = {
    "net.exchange-tc-s-counted": Figure(lambda s: min(shallow_hosts(s, "tx_drops")), "{:,.0f}"),
    "net.tc-s-counted-to": Figure(lambda s: max(shallow_hosts(s, "tx_drops")), "{:,.0f}"),
    "net.host-out-of-about": Figure(
        lambda s: round(statistics.mean(shallow_hosts(s, "tx_packets")), -2), "{:,.0f}"
    ),
    "net.a-pair-exchange-took": Figure(
        pairs(
            min,
            ("shallow_5mbit",),
            ("allreduce-same", "allreduce-ring", "sendrecv-same", "sendrecv-ring"),
        ),
        "{:.2f}",
    ),
    "net.pair-exchange-took-to": Figure(
        pairs(
            max,
            ("shallow_5mbit",),
            ("allreduce-same", "allreduce-ring", "sendrecv-same", "sendrecv-ring"),
        ),
        "{:.2f}",
    ),
    "net.the-same-exchange-took": Figure(
        pairs(min, ("nicqueue_5mbit", "nicqueue_50mbit", "nicqueue_500mbit"), ("allreduce-ring",)),
        "{:.2f}",
    ),
    "net.same-exchange-took-to": Figure(
        pairs(max, ("nicqueue_5mbit", "nicqueue_50mbit", "nicqueue_500mbit"), ("allreduce-ring",)),
        "{:.2f}",
    ),
    "hier.shared-host-link-brings": Figure(emulated_within_20, "{:,.0f}"),
    "hier.link-brings-of-the": Figure(lambda s: 2 * len(GOSSIP), "{:,.0f}"),
    "hier.from-none-hierarchical-stays": Figure(optimistic(min), "{:,.0f}"),
    "hier.from-none-hierarchical-stays-2": Figure(optimistic(max), "{:,.0f}"),
    "hier.c-rule-fixed-that": Figure(emulated("2x4", "10mbit", "alternating-exp-ring"), "{:.2f}"),
    "hier.mb-s-they-read": Figure(emulated("4x2", "100mbit", "alternating-exp-ring"), "{:.2f}"),
    "hier.s-they-read-and": Figure(emulated("2x4", "100mbit", "alternating-exp-ring"), "{:.2f}"),
    "sim.alternating-exp-ring-ratio": Figure(lambda s: predicted_within_20(False)(s).capitalize()),
    "sim.ratio-two-of-the": Figure(predicted_within_20(True)),
    "sim.gb-s-is-predicted": Figure(lambda s: 100 * calibration(*A40[1], "error")(s), "{:,.0f}"),
    "sim.s-this-one-predicts": Figure(
        ratio(
            calibration("a40_ethernet_25g", "allreduce", "predicted_ms"),
            calibration("a40_ethernet_25g", "alternating-exp-ring", "predicted_ms"),
        ),
        "{:.2f}",
    ),
    "sim.this-one-predicts-against": Figure(
        ratio(
            calibration("a40_ethernet_25g", "allreduce", "measured_ms"),
            calibration("a40_ethernet_25g", "alternating-exp-ring", "measured_ms"),
        ),
        "{:.2f}",
    ),
    "sim.type-the-fitted-efficiency": Figure(
        calibration("a40_ethernet_25g", "allreduce", "efficiency"), "{:.3f}"
    ),
    "sim.n-compute-fell-from": Figure(
        validation("slow_link", 2, "allreduce", "compute_s"), "{:,.0f}"
    ),
    "sim.compute-fell-from-to": Figure(
        validation("balanced", 2, "allreduce", "compute_s"), "{:,.0f}"
    ),
    "sim.yet-the-step-took": Figure(
        validation("balanced", 4, "one-peer-exp", "measured_s"), "{:,.0f}"
    ),
}

TABLES: dict[str, str] = {}
