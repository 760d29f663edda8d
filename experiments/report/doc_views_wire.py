"""The docs' tables of the testbed's wire that are not the wire study's step times.

- ``pair-exchange``: ``experiments/network/testbed/pairbench.py``'s exchanges against S/B
  (``docs/results/network/pairbench/*.jsonl``, one line per mode);
- ``emulator-hosts``: the emulator's predicted over measured step time, a link per rank (the
  runs of ``own-link/``, their ``table.md``) and with hosts (``table.json``'s
  ``emulated_ratio``), on ``docs/results/hierarchical/README.md``;
- ``sim-calibration`` and ``sim-validation``: the scale simulator against the reference
  paper's measured step times (``simulate/paper_transformer_fig6/simulate.json``) and against
  emulated runs (``simulate/validation/*/validation.json``);
- ``sim-sensitivity``: that calibration with one input changed at a time (the table
  ``simulate --sensitivity`` writes into ``paper_transformer_fig6/simulate.md``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from experiments.report.doc_data import DataError, Source, md_table

PAIRBENCH = "docs/results/network/pairbench"
HIER = "docs/results/hierarchical/table.json"
OWN_LINK = "docs/results/hierarchical/own-link/table.md"
EMULATED = "emulated s (ratio)"  # own-link's column of the emulator at the line rate


def pair_ratio(file: str, mode: str) -> Callable[[Source], float]:
    """A pair exchange's median time over S/B: ``mode``'s line of ``pairbench/FILE.jsonl``."""

    def value(s: Source) -> float:
        rel = f"{PAIRBENCH}/{file}.jsonl"
        for row in s.jsonl(rel):
            if row["mode"] == mode:
                return float(row["ratio"])
        raise DataError(rel, f"no mode '{mode}'")

    return value


# (label, mode, file per rate); a file of None leaves the cell empty
_PAIR_RATES = ("5mbit", "50mbit", "500mbit")
_PAIR_ROWS: list[tuple[str, str, tuple[str | None, ...]]] = [
    (
        "`all_reduce` on a 2-rank group, pairs alternating as in `ring` (the library's)",
        "allreduce-ring",
        tuple(f"nicqueue_{r}" for r in _PAIR_RATES),
    ),
    ("the same pair every round", "allreduce-same", tuple(f"nicqueue_{r}" for r in _PAIR_RATES)),
    (
        "the library's, cut into 2 chunks",
        "allreduce-ring/2",
        tuple(f"nicqueue_{r}" for r in _PAIR_RATES),
    ),
    ("the library's, 4 chunks", "allreduce-ring/4", tuple(f"nicqueue_{r}" for r in _PAIR_RATES)),
    (
        "`isend`/`irecv` of the whole tensor (5 Mb/s, NIC queue)",
        "sendrecv-same",
        ("nicqueue_5mbit_modes", None, None),
    ),
    (
        "the library's, with the 50 ms sender queue (drops)",
        "allreduce-ring",
        ("shallow_5mbit", None, None),
    ),
]


def pair_exchange(src: Source) -> str:
    """Each exchange's median time over S/B at 5, 50 and 500 Mb/s (the first cell says S/B)."""
    rows = []
    for label, mode, files in _PAIR_ROWS:
        cells = ["" if f is None else f"{pair_ratio(f, mode)(src):.2f}x" for f in files]
        rows.append([label, *cells])
    rows[0][1] += " S/B"
    return md_table(
        ["exchange", "5 Mb/s", "50 Mb/s", "500 Mb/s"], ["---", "---:", "---:", "---:"], rows
    )


def own_link(
    src: Source, hosts: int, procs: int, rate: str, arm: str
) -> tuple[float, float] | None:
    """The emulated step (s) and its ratio to the wire of one cell of ``own-link/table.md``
    (None: no emulated run), read from the column headed ``emulated s (ratio)``."""
    section, header = "", []
    for line in src.text(OWN_LINK).splitlines():
        if line.startswith("## "):
            section = line
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:2] == ["rate", "arm"]:
            header = cells
        if f"{hosts} hosts x {procs} processes" in section and cells[:2] == [rate, arm]:
            if EMULATED not in header:
                raise DataError(OWN_LINK, f"no column '{EMULATED}' above row {rate} {arm}")
            got = re.search(r"([\d.]+) \(([\d.]+)", cells[header.index(EMULATED)])
            return (float(got[1]), float(got[2])) if got else None
    raise DataError(OWN_LINK, f"no row {hosts}x{procs} {rate} {arm}")


def _ratio_cell(value: float | None, mark: bool = False) -> str:
    if value is None:
        return "–"
    text = f"**{value:.2f}**" if abs(value - 1) <= 0.2 else f"{value:.2f}"
    return f"{text} †" if mark else text


def rate_label(rate: str) -> str:
    """``5mbit`` -> ``5 Mb/s``, ``1gbit`` -> ``1 Gb/s``."""
    for suffix, unit in (("gbit", "Gb/s"), ("mbit", "Mb/s"), ("kbit", "kb/s")):
        if rate.endswith(suffix):
            return f"{rate.removesuffix(suffix)} {unit}"
    return rate


# the hierarchical study's cells: what a view of them shows unless its marker says otherwise
HIER_GRID = {
    "shapes": "4x2,2x4",
    "rates": "10mbit,100mbit",
    "arms": "allreduce,one-peer-exp,alternating-exp-ring,hierarchical",
}


def grid(given: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """The shapes, rates and arms a marker gives a view of the hierarchical study's cells, each
    a list (:data:`HIER_GRID`'s where it gives none); any other argument is a ``TypeError``, as
    a function's own unexpected keyword is."""
    unknown = sorted(set(given) - set(HIER_GRID))
    if unknown:
        raise TypeError(f"unexpected keyword argument '{unknown[0]}'")
    merged = {**HIER_GRID, **given}
    return merged["shapes"].split(","), merged["rates"].split(","), merged["arms"].split(",")


def emulator_hosts(src: Source, before: str = "10mbit", dagger: str = "", **cells: str) -> str:
    """Predicted over measured step time per shape, rate and arm (``shapes``, ``rates``,
    ``arms``: :func:`grid`): a link per rank (``before``'s rates only) and with hosts; bold
    within 20%; ``dagger`` (``ARM@RATE``) marks cells."""
    shapes, rates, arms = grid(cells)
    marked = set(dagger.split(",")) if dagger else set()
    rows = []
    for rate in rates:
        for shape in shapes:
            hosts, procs = (int(x) for x in shape.split("x"))
            for arm in arms:
                row = src.row(HIER, hosts=hosts, procs_per_host=procs, rate=rate, arm=arm)
                own = ""
                if rate in before.split(","):
                    cell = own_link(src, hosts, procs, rate, arm)
                    own = _ratio_cell(None if cell is None else cell[1])
                rows.append(
                    [
                        f"{hosts} x {procs}",
                        rate_label(rate),
                        f"`{arm}`",
                        own,
                        _ratio_cell(float(row["emulated_ratio"]), f"{arm}@{rate}" in marked),
                    ]
                )
    header = ["shape", "link", "arm", "a link per rank (before)", "hosts (`procs_per_host`)"]
    return md_table(header, ["---", "---", "---", "---:", "---:"], rows)


PAPER = "docs/results/simulate/paper_transformer_fig6/simulate.json"


def _pct(error: float) -> str:
    """A relative error as the pages write it: ``+29.0%`` (and ``+0.0%``, never ``-0.0%``)."""
    return f"{round(100 * error, 1) + 0.0:+.1f}%"


def sim_calibration(src: Source, file: str = PAPER) -> str:
    """The simulator against the paper's step times: a row per point (the fitted one says its
    efficiency), then per profile the all-reduce over gossip ratio, measured and predicted."""
    rows = []
    points = src.json(file)["calibration"]
    for p in points:
        role = f"fitted: efficiency {p['efficiency']:.3f}" if p["role"] == "fitted" else p["role"]
        rows.append(
            [
                p["profile"],
                str(p["n"]),
                p["method"],
                f"{p['measured_ms']:.1f}",
                f"{p['predicted_ms']:.1f}",
                _pct(p["error"]),
                role,
            ]
        )
    for profile in dict.fromkeys(p["profile"] for p in points):
        mine = {p["method"]: p for p in points if p["profile"] == profile}
        if "allreduce" not in mine or len(mine) != 2:
            raise DataError(file, f"{profile}: not one all-reduce and one gossip point")
        base = mine.pop("allreduce")
        ((method, other),) = mine.items()
        measured = base["measured_ms"] / other["measured_ms"]
        predicted = base["predicted_ms"] / other["predicted_ms"]
        rows.append(
            [
                profile,
                str(base["n"]),
                f"allreduce / {method}",
                f"{measured:.2f}x",
                f"{predicted:.2f}x",
                _pct(predicted / measured - 1),
                "ratio",
            ]
        )
    header = ["profile", "n", "method", "measured (ms)", "predicted (ms)", "error", "role"]
    return md_table(header, ["---", "---:", "---", "---:", "---:", "---:", "---"], rows)


PAPER_MD = "docs/results/simulate/paper_transformer_fig6/simulate.md"
_NO_FIT = re.compile(r"no fit: the all-reduce takes ([\d.]+ ms) even at line rate.*")


def sensitivity_rows(src: Source, file: str = PAPER_MD) -> list[list[str]]:
    """The rows of the sensitivity table that ``simulate --sensitivity`` wrote into
    ``simulate.md``: the variant, the fitted efficiency (or why there is no fit), then the
    error of each calibration point."""
    lines = src.text(file).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## Sensitivity")), None)
    if start is None:
        raise DataError(file, "no '## Sensitivity' section")
    first = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("|")), len(lines))
    rows = []
    for line in lines[first + 2 :]:  # past the header and the alignment row
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    if not rows:
        raise DataError(file, "an empty sensitivity table")
    return rows


def sim_sensitivity(src: Source, file: str = PAPER_MD) -> str:
    """The sensitivity table of ``simulate.md``, its columns named by cluster and a variant
    without a fit saying only the all-reduce's time at line rate."""
    rows = [
        [row[0], _NO_FIT.sub(r"no fit: all-reduce \1 at line rate", row[1]), *row[2:]]
        for row in sensitivity_rows(src, file)
    ]
    header = ["variant", "fitted efficiency", "A40 allreduce", "A40 alternating-exp-ring"]
    header += ["A100 allreduce", "A100 alternating-exp-ring"]
    return md_table(header, ["---", *["---:"] * 5], rows)


def sim_validation(src: Source, file: str) -> str:
    """The simulator against emulated runs (``sim_validate``'s ``validation.json``), a row per
    world size and method."""
    rows = [
        [
            str(r["n"]),
            r["method"],
            f"{r['compute_s'] * 1e3:.1f}",
            f"{r['cv']:.2f}",
            f"{r['predicted_s'] * 1e3:.1f}",
            f"{r['measured_s'] * 1e3:.1f}",
            _pct(r["error"]),
        ]
        for r in src.json(file)["rows"]
    ]
    header = ["n", "method", "compute (ms)", "jitter cv", "predicted (ms)", "measured (ms)"]
    header.append("error")
    return md_table(header, ["---:", "---", *["---:"] * 5], rows)


VIEWS: dict[str, Callable[..., str]] = {
    "pair-exchange": pair_exchange,
    "emulator-hosts": emulator_hosts,
    "sim-sensitivity": sim_sensitivity,
    "sim-calibration": sim_calibration,
    "sim-validation": sim_validation,
}
