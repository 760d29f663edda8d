"""The docs' table of packed workers against one process per worker, from its committed file.

- ``packed-bench``: ``python -m experiments.bench.packed_throughput``'s rows
  (``docs/results/packed/bench.json``, one row per task, worker count and arm, medians over
  the repeats): samples/s, tokens/s, peak memory (the sum of the processes' ``VmHWM``, and
  of their anonymous memory), wall time and the ratios of the pairs measured back to back,
  then a line on the machine and the load;
- ``packed-commands``: the exact command lines of one worker count's first repeat.

:func:`rows_table` is also what the bench prints, so the terminal and the page agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from experiments.report.doc_data import DataError, Source, md_table

PACKED = "docs/results/packed/bench.json"
_ARM_ORDER = {"packed": 0, "processes": 1}
_KEYS = ("task", "workers", "arm", "samples_per_s", "peak_mb", "wall_s")


def _rate(value: float) -> str:
    # the GPT's packed rates are tens of samples/s: keep a decimal where it matters
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _x(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:.2f}x" if key in row else "–"


def rows_table(rows: list[dict[str, Any]]) -> str:
    """A row per task, worker count and arm: samples/s, tokens/s, memory, wall s, ratios.

    Args:
        rows: The bench's ``rows`` (see :mod:`experiments.bench.packed_throughput`).

    Returns:
        A markdown table, ordered by task, worker count, then packed before processes.
    """
    ordered = sorted(rows, key=lambda r: (r["task"], r["workers"], _ARM_ORDER.get(r["arm"], 2)))
    out = []
    for r in ordered:
        tokens = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "–"
        out.append(
            [
                r["task"],
                str(r["workers"]),
                r["arm"],
                _rate(r["samples_per_s"]),
                tokens,
                f"{r['peak_mb']:,.0f}",
                f"{r['anon_peak_mb']:,.0f}" if "anon_peak_mb" in r else "–",
                f"{r['wall_s']:.1f}",
                _x(r, "ratio"),
                _x(r, "memory_ratio"),
            ]
        )
    header = ["task", "N", "arm", "samples/s", "tokens/s", "peak MB (VmHWM)", "anon MB", "wall s"]
    header += ["packed / processes, samples/s", "packed / processes, peak MB"]
    return md_table(header, ["---", "---:", "---", *["---:"] * 7], out)


def _data(src: Source, file: str) -> dict[str, Any]:
    data = src.json(file)
    rows = data.get("rows") if isinstance(data, dict) else None
    if not rows:
        raise DataError(file, "no rows")
    for i, row in enumerate(rows):
        missing = [k for k in _KEYS if k not in row]
        if missing:
            raise DataError(file, f"rows.{i} has no {', '.join(missing)}")
    return data


def machine_line(data: dict[str, Any]) -> str:
    """Where and when the bench ran: cores, CPU, torch, threads, the load at its start."""
    m = data.get("machine", {})
    load = m.get("load_avg") or [float("nan")]
    loads = [r["load_avg_1m"] for r in data.get("runs", []) if "load_avg_1m" in r]
    span = f", {min(loads):.1f} to {max(loads):.1f} as the runs started" if loads else ""
    return (
        f"> {m.get('cores', '?')} cores ({m.get('cpu', '?')}), torch {m.get('torch', '?')}, "
        f"{m.get('torch_threads', '?')} intra-op threads in the packed process; 1-minute load "
        f"average {load[0]:.1f} at the start{span}; {data.get('started', '?')} to "
        f"{data.get('finished', '?')}"
    )


def packed_bench(src: Source, file: str = PACKED) -> str:
    """The bench's rows from ``file`` as :func:`rows_table` formats them, then the machine."""
    data = _data(src, file)
    return f"{rows_table(data['rows'])}\n\n{machine_line(data)}"


def packed_commands(src: Source, file: str = PACKED, workers: str = "4") -> str:
    """The exact command lines of the first repeat at ``workers`` workers, a line per run."""
    runs = [
        r
        for r in _data(src, file).get("runs", [])
        if r.get("repeat") == 0 and str(r.get("workers")) == workers
    ]
    if not runs:
        raise DataError(file, f"no run of repeat 0 with workers={workers}")
    return "\n".join(["```", *(r["command"] for r in runs), "```"])


VIEWS: dict[str, Callable[..., str]] = {
    "packed-bench": packed_bench,
    "packed-commands": packed_commands,
}
