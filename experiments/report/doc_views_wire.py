"""The docs' tables of the testbed's wire that are not the wire study's step times.

- ``pair-exchange``: ``experiments/network/testbed/pairbench.py``'s exchanges against S/B
  (``docs/results/network/pairbench/*.jsonl``, one line per mode);
- ``emulator-hosts``: the emulator's predicted over measured step time, a link per rank (the
  runs of ``own-link/``, their ``table.md``) and with hosts (``table.json``'s
  ``emulated_ratio``), on ``docs/results/hierarchical/README.md``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from experiments.report.doc_data import DataError, Source, md_table

PAIRBENCH = "docs/results/network/pairbench"
HIER = "docs/results/hierarchical/table.json"
OWN_LINK = "docs/results/hierarchical/own-link/table.md"


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


def _own_link(src: Source, hosts: int, procs: int, rate: str, arm: str) -> float | None:
    """The emulator's ratio of one cell of ``own-link/table.md`` (None: no emulated run)."""
    section = ""
    for line in src.text(OWN_LINK).splitlines():
        if line.startswith("## "):
            section = line
        cells = [c.strip() for c in line.strip("|").split("|")]
        if f"{hosts} hosts x {procs} processes" in section and cells[:2] == [rate, arm]:
            got = re.search(r"\(([\d.]+)", cells[-2])
            return float(got[1]) if got else None
    raise DataError(OWN_LINK, f"no row {hosts}x{procs} {rate} {arm}")


def _ratio_cell(value: float | None, mark: bool = False) -> str:
    if value is None:
        return "–"
    text = f"**{value:.2f}**" if abs(value - 1) <= 0.2 else f"{value:.2f}"
    return f"{text} †" if mark else text


def emulator_hosts(
    src: Source,
    shapes: str = "4x2,2x4",
    rates: str = "10mbit,100mbit",
    arms: str = "allreduce,one-peer-exp,alternating-exp-ring,hierarchical",
    before: str = "10mbit",
    dagger: str = "",
) -> str:
    """Predicted over measured step time per shape, rate and arm: a link per rank (``before``'s
    rates only) and with hosts; bold within 20%; ``dagger`` (``ARM@RATE``) marks cells."""
    marked = set(dagger.split(",")) if dagger else set()
    rows = []
    for rate in rates.split(","):
        for shape in shapes.split(","):
            hosts, procs = (int(x) for x in shape.split("x"))
            for arm in arms.split(","):
                with_hosts = float(
                    src.row(HIER, hosts=hosts, procs_per_host=procs, rate=rate, arm=arm)[
                        "emulated_ratio"
                    ]
                )
                own = (
                    _ratio_cell(_own_link(src, hosts, procs, rate, arm))
                    if rate in before.split(",")
                    else ""
                )
                rows.append(
                    [
                        f"{hosts} x {procs}",
                        src_rate(rate),
                        f"`{arm}`",
                        own,
                        _ratio_cell(with_hosts, f"{arm}@{rate}" in marked),
                    ]
                )
    header = ["shape", "link", "arm", "a link per rank (before)", "hosts (`procs_per_host`)"]
    return md_table(header, ["---", "---", "---", "---:", "---:"], rows)


def src_rate(rate: str) -> str:
    """``10mbit`` -> ``10 Mb/s``."""
    return rate.replace("mbit", " Mb/s").replace("gbit", " Gb/s")


VIEWS: dict[str, Callable[..., str]] = {
    "pair-exchange": pair_exchange,
    "emulator-hosts": emulator_hosts,
}
