"""The report's tables: one row per configuration (mean ± std over seeds), one per run."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from experiments.report.configs import Config, Section
from experiments.report.doc_data import md_table
from experiments.report.runs import Run, count

__all__ = ["HOSTS_DIFFER", "config_table", "host_note", "reference", "run_table"]

HOSTS_DIFFER = "n/a (hosts differ)"

# fields a row already shows in its own columns (the name, world size, dataset, model)
_SHOWN = {"topology", "network", "world_size", "dataset", "model"}


def _f(value: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def _count(value: float | None) -> str:
    return "n/a" if value is None else count(value)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _stat(values: Sequence[float], spec: str) -> str:
    """``mean ± sample std`` over seeds, the bare value for one seed."""
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:{spec}}"
    return f"{statistics.fmean(values):{spec}} ± {statistics.stdev(values):{spec}}"


def reference(section: Section, config: Config, network: bool) -> list[Config]:
    """The ``allreduce`` configurations ``config`` is compared with.

    Those with the same world size, dataset and model (and network when ``network``); of
    several, the ones sharing the most other fields with ``config`` (the same optimizer).
    """
    keys = ["world_size", "dataset", "model"] + (["network"] if network else [])
    same = [
        c
        for c in section.configs
        if c.is_allreduce and all(c.fields.get(k) == config.fields.get(k) for k in keys)
    ]

    def shared(other: Config) -> int:
        return sum(
            1 for k, v in config.fields.items() if k != "topology" and other.fields.get(k) == v
        )

    best = max(map(shared, same), default=0)
    return [c for c in same if shared(c) == best]


def _ratio(section: Section, config: Config, key: str) -> float | None:
    """Mean ``key`` (a per-run mean) over that of the reference allreduce runs."""
    mine = _mean(config.means(key))
    ref = _mean([v for c in reference(section, config, network=True) for v in c.means(key)])
    return mine / ref if mine is not None and ref else None


def _one_host(runs: Sequence[Run]) -> bool:
    return len({r.host for r in runs}) == 1


def _with_refs(section: Section, config: Config) -> list[Run]:
    """``config``'s runs and those of the allreduce runs its ratios divide by."""
    return [*config.runs, *(r for c in reference(section, config, network=True) for r in c.runs)]


def host_note(section: Section) -> list[str]:
    """One line when the section's runs come from more than one host, else nothing."""
    found = sorted({r.host for r in section.runs})
    if len(found) < 2:
        return []
    return [
        f"The runs come from {len(found)} hosts ({'; '.join(found)}). Throughput is only "
        f"compared within one: a time, throughput or speed-up cell that would mix hosts reads "
        f"{HOSTS_DIFFER} (the run table gives each run's own), and the plots against time "
        "and of throughput put runs of different hosts side by side.",
        "",
    ]


def _reached(config: Config, target: float) -> str:
    times = [t for t in (r.time_to(target) for r in config.runs) if t is not None]
    if not times:
        return "not reached"
    cell = f"{statistics.fmean(times):.1f} s"
    return (
        cell
        if len(times) == len(config.runs)
        else f"{cell} ({len(times)}/{len(config.runs)} seeds)"
    )


def _factor_columns(section: Section) -> list[tuple[str, Callable[[Config], str]]]:
    """Columns for the factors the row name and fixed columns do not already show."""
    return [(f.title, f.value) for f in section.factors if not set(f.keys) & _SHOWN]


def _table(head: Sequence[str], text: set[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The table's lines: the columns of names (``text`` and the fixed ones) left, numbers right."""
    left = text | {"configuration", "dataset", "model", "dir"}
    align = ["l" if h in left else "r" for h in head]
    return md_table(head, align, rows, padded=True).split("\n")


def config_table(section: Section, target: float) -> list[str]:
    """One row per configuration of ``section``; vision and language-model columns differ.

    Args:
        section: The section.
        target: The accuracy of the time-to-accuracy column (vision).

    Returns:
        Markdown lines.
    """
    extra = _factor_columns(section)
    if section.kind == "lm":
        head = ["configuration", *(t for t, _ in extra), "world size", "model", "dataset", "seeds",
                "final eval/loss (nats)", "gap to allreduce (nats)", "eval/ppl", "eval/loss_local",
                "tokens/s", "tokens/s vs allreduce", "tokens"]  # fmt: skip
    else:
        head = ["configuration", *(t for t, _ in extra), "world size", "dataset", "seeds",
                "final eval/acc", "eval/acc_local", f"time to acc {target:g}", "samples/s",
                "speedup vs allreduce", "consensus distance (mean)",
                "consensus distance (final)"]  # fmt: skip
    rows = []
    for config in section.configs:
        first = config.runs[0].summary
        one, with_refs = _one_host(config.runs), _one_host(_with_refs(section, config))
        cells = [config.name, *(value(config) for _, value in extra)]
        cells.append(str(first.get("world_size", "n/a")))
        if section.kind == "lm":
            loss = _mean(config.finals("eval/loss"))
            refs = reference(section, config, network=False)
            ref = _mean([v for c in refs for v in c.finals("eval/loss")])
            gap = loss - ref if loss is not None and ref is not None else None
            cells += [
                str(first.get("model", "n/a")), str(first.get("dataset", "n/a")),
                str(len(config.runs)), _stat(config.finals("eval/loss"), ".4f"),
                _f(gap, "+.4f"), _stat(config.finals("eval/ppl"), ".2f"),
                _stat(config.finals("eval/loss_local"), ".4f"),
                _stat(config.means("perf/tokens_per_s"), ".0f") if one else HOSTS_DIFFER,
                _f(_ratio(section, config, "perf/tokens_per_s"), ".2f", "x")
                if with_refs else HOSTS_DIFFER,
                _count(_mean(config.finals("tokens"))),
            ]  # fmt: skip
        else:
            cells += [
                str(first.get("dataset", "n/a")), str(len(config.runs)),
                _stat(config.finals("eval/acc"), ".4f"),
                _stat(config.finals("eval/acc_local"), ".4f"),
                _reached(config, target) if one else HOSTS_DIFFER,
                _stat(config.means("perf/samples_per_s"), ".1f") if one else HOSTS_DIFFER,
                _f(_ratio(section, config, "perf/samples_per_s"), ".2f", "x")
                if with_refs else HOSTS_DIFFER,
                _f(_mean(config.means("consensus/distance")), ".3e"),
                _f(_mean(config.lasts("consensus/distance")), ".3e"),
            ]  # fmt: skip
        rows.append(cells)
    return _table(head, {t for t, _ in extra}, rows)


def _where(run: Run, out: Path) -> str:
    try:
        return f"`{os.path.relpath(run.path, out)}`"
    except ValueError:  # another drive on Windows
        return f"`{run.path}`"


def run_table(section: Section, target: float, out: Path) -> list[str]:
    """One row per run, configuration by configuration, with its seed and directory.

    Args:
        section: The section.
        target: The accuracy of the time-to-accuracy column (vision).
        out: The report's directory, which the run directories are given relative to.

    Returns:
        Markdown lines.
    """
    extra = _factor_columns(section)
    first = ["configuration", *(t for t, _ in extra), "seed", "world size", "dataset"]
    if section.kind == "lm":
        head = [*first, "final eval/loss", "eval/ppl", "eval/loss_local", "tokens/s", "tokens",
                "dir"]  # fmt: skip
    else:
        head = [*first, "final eval/acc",
                "eval/acc_local", f"time to acc {target:g}", "samples/s",
                "consensus distance (mean)", "consensus distance (final)", "dir"]  # fmt: skip
    rows = []
    for config in section.configs:
        for run in config.runs:
            s = run.summary
            cells = [config.name, *(value(config) for _, value in extra), str(run.seed),
                     str(s.get("world_size", "n/a")), str(s.get("dataset", "n/a"))]  # fmt: skip
            if section.kind == "lm":
                cells += [
                    _f(run.final("eval/loss"), ".4f"), _f(run.final("eval/ppl"), ".2f"),
                    _f(run.final("eval/loss_local"), ".4f"),
                    _f(run.mean("perf/tokens_per_s"), ".0f"), _count(run.final("tokens")),
                ]  # fmt: skip
            else:
                reached = run.time_to(target)
                cells += [
                    _f(run.final("eval/acc"), ".4f"), _f(run.final("eval/acc_local"), ".4f"),
                    "not reached" if reached is None else f"{reached:.1f} s",
                    _f(run.mean("perf/samples_per_s"), ".1f"),
                    _f(run.mean("consensus/distance"), ".3e"),
                    _f(run.last("consensus/distance"), ".3e"),
                ]  # fmt: skip
            rows.append([*cells, _where(run, out)])
    return _table(head, {t for t, _ in extra}, rows)
