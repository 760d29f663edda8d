"""Claims of the pair exchange (``docs/results/network/README.md``), of the emulator against the
wire (``docs/results/hierarchical/README.md``) and of the simulator against its references
(``docs/results/simulate/README.md``) (see :mod:`experiments.report.claims`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from experiments.report.claims.base import (
    _WORDS,
    F0,
    F2,
    HIER,
    HIER_PAGE,
    NET,
    Claim,
    Fn,
    V,
    calibration,
    claim,
    ratio,
)
from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views_wire import PAIRBENCH, pair_ratio

SHALLOW = f"{PAIRBENCH}/shallow_5mbit_testbed.json"
_MODES = ("allreduce-same", "allreduce-ring", "sendrecv-same", "sendrecv-ring")


def _pairs(pick: Callable, files: tuple[str, ...], modes: tuple[str, ...]) -> Fn:
    return lambda s: pick(pair_ratio(f, m)(s) for f in files for m in modes)


def _hosts(s: Source, key: str) -> list[float]:
    """A counter of every host of the shallow-queue pair benchmark."""
    return [float(h[key]) for h in s.key(SHALLOW, "per_host")]


def _emulated(shape: str, rate: str, arm: str) -> Fn:
    hosts, procs = (int(x) for x in shape.split("x"))
    return lambda s: float(
        s.row(HIER, hosts=hosts, procs_per_host=procs, rate=rate, arm=arm)["emulated_ratio"]
    )


_GOSSIP = ("one-peer-exp", "alternating-exp-ring", "hierarchical")


def _within_20(s: Source) -> int:
    """Decentralized cells at 10 Mb/s whose emulation with hosts is within 20% of the wire."""
    cells = [_emulated(sh, "10mbit", a)(s) for sh in ("4x2", "2x4") for a in _GOSSIP]
    return sum(abs(c - 1) <= 0.2 for c in cells)


def _optimistic(pick: Callable) -> Fn:
    """How far (%) ``hierarchical``'s emulation at 10 Mb/s falls short of the wire."""
    return lambda s: pick(
        100 * (1 - _emulated(sh, "10mbit", "hierarchical")(s)) for sh in ("4x2", "2x4")
    )


SIM_PAGE = "docs/results/simulate/README.md"
PAPER = "docs/results/simulate/paper_transformer_fig6/simulate.json"
VALIDATION = "docs/results/simulate/validation"


def _predicted_within_20(total: bool) -> Callable[[Source], str]:
    """How many of the paper's predicted (not fitted) points the simulator puts within 20%
    (``total``: how many there are), as a word."""

    def value(s: Source) -> str:
        points = [p for p in s.json(PAPER)["calibration"] if p["role"] == "predicted"]
        n = len(points) if total else sum(abs(p["error"]) <= 0.2 for p in points)
        return _WORDS[n]

    return value


def _validation(run: str, n: int, method: str, key: str) -> Fn:
    """A row's ``key`` (seconds, given in ms) of a simulator validation (``validation.json``)."""

    def value(s: Source) -> float:
        rel = f"{VALIDATION}/{run}/validation.json"
        for r in s.json(rel)["rows"]:
            if r["n"] == n and r["method"] == method:
                return float(r[key]) * 1e3
        raise DataError(rel, f"no row n={n} method={method}")

    return value


_A40 = ("a40_ethernet_25g", "allreduce"), ("a40_ethernet_25g", "alternating-exp-ring")

_NICQUEUE = tuple(f"nicqueue_{r}" for r in ("5mbit", "50mbit", "500mbit"))

CLAIMS: list[Claim] = [
    claim(
        NET,
        r"`tc -s` counted\s+([\d,]+) to ([\d,]+) drops per host out of about ([\d,]+) packets",
        V(lambda s: min(_hosts(s, "tx_drops")), F0),
        V(lambda s: max(_hosts(s, "tx_drops")), F0),
        V(lambda s: round(statistics.mean(_hosts(s, "tx_packets")), -2), F0),
    ),
    claim(
        NET,
        r"a pair exchange\s+took (\d\.\d\d) to (\d\.\d\d) times S/B",
        V(_pairs(min, ("shallow_5mbit",), _MODES), F2),
        V(_pairs(max, ("shallow_5mbit",), _MODES), F2),
    ),
    claim(
        NET,
        r"no packet was dropped and the same exchange took\s+(\d\.\d\d) to (\d\.\d\d) times S/B",
        V(_pairs(min, _NICQUEUE, ("allreduce-ring",)), F2),
        V(_pairs(max, _NICQUEUE, ("allreduce-ring",)), F2),
    ),
    claim(
        HIER_PAGE,
        r"the shared host link brings (\d) of the (\d)\s+decentralized cells within 20%",
        V(_within_20, F0),
        V(lambda s: 2 * len(_GOSSIP), F0),
    ),
    claim(
        HIER_PAGE,
        r"`hierarchical` stays (\d+)-(\d+)%\s+optimistic",
        V(_optimistic(min), F0),
        V(_optimistic(max), F0),
    ),
    claim(
        HIER_PAGE,
        r"The `L / c` rule\s+fixed that \((\d\.\d\d)\)",
        V(_emulated("2x4", "10mbit", "alternating-exp-ring"), F2),
    ),
    claim(
        HIER_PAGE,
        r"at 100 Mb/s they read (\d\.\d\d) and (\d\.\d\d)",
        V(_emulated("4x2", "100mbit", "alternating-exp-ring"), F2),
        V(_emulated("2x4", "100mbit", "alternating-exp-ring"), F2),
    ),
    # docs/results/simulate/README.md
    claim(
        SIM_PAGE,
        r"^(Two) of the (three) predicted points are within 20%",
        V(lambda s: _predicted_within_20(False)(s).capitalize(), "{}"),
        V(_predicted_within_20(True), "{}"),
    ),
    claim(
        SIM_PAGE,
        r"25 Gb/s is predicted (\d+)% too slow",
        V(lambda s: 100 * calibration(*_A40[1], "error")(s), F0),
    ),
    claim(
        SIM_PAGE,
        r"this\s+one predicts (\d\.\d\d)x, against (\d\.\d\d)x measured",
        V(ratio(calibration(*_A40[0], "predicted_ms"), calibration(*_A40[1], "predicted_ms")), F2),
        V(ratio(calibration(*_A40[0], "measured_ms"), calibration(*_A40[1], "measured_ms")), F2),
    ),
    claim(
        SIM_PAGE,
        r"The fitted efficiency, (\d\.\d{3}),",
        V(calibration(*_A40[0], "efficiency"), "{:.3f}"),
    ),
    claim(
        SIM_PAGE,
        r"the n=2 compute fell from (\d+) to (\d+) ms",
        V(_validation("slow_link", 2, "allreduce", "compute_s"), F0),
        V(_validation("balanced", 2, "allreduce", "compute_s"), F0),
    ),
    claim(
        SIM_PAGE,
        r"yet the\s+step took (\d+) ms",
        V(_validation("balanced", 4, "one-peer-exp", "measured_s"), F0),
    ),
]
