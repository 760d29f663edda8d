"""The results pages a command writes whole, each regenerated from its committed data.

``make report`` writes a ``report.md`` from committed run folders, the wire study its
``table.md`` from ``table.json``, ``make bench-upstream`` its ``.md`` from its ``.json``, and so
on. :data:`PAGES` names each such page with what writes it, its committed data (globs under the
repository root) and how to write its text again in memory: the generator's own function,
without plots, network or training. ``make check-docs`` regenerates every registered page and
diffs it against the committed one (:func:`check_page`); ``--write`` rewrites it.

Each difference is one line, as for the generated blocks: the page and line, what is written,
what the data gives and where the data is (at most a dozen lines a page, then a count). A data
file that does not parse, or a run the report would skip, fails the page with one line naming
the file. Pages written whole that are not here have no command that writes them from committed
data.

A page whose sweep did not commit its runs when it last ran (the non-IID sweep's pages and the
CPU sweep's ``digits/`` and ``synthetic/report.md``, written from ``multirun/``) is registered
with ``awaiting``, the rerun that commits them (:data:`AWAITING`): until some of its data is
there it is passed over; from then on it is checked as any other.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from experiments.bench import compression_bytes, sharded_testbed, upstream
from experiments.network import calibrate, sim_report, sim_validate, simulate, wire_table
from experiments.network.sim_config import profiles
from experiments.report import gap, link_time, noniid_summary, outer_summary, rerun, trajectory
from experiments.report.build import report_markdown
from experiments.report.doc_data import DataError

__all__ = ["AWAITING", "PAGES", "WholePage", "check_page", "diff", "render"]

_MAX_LINES = 12  # differences shown per page; the rest are counted
_WRITE = "python -m experiments.report.check_docs --write"


@dataclass(frozen=True)
class WholePage:
    """How one page is written whole.

    Args:
        command: The command that writes it (named in the problems).
        data: Its committed data: files or folders, as globs under the root (``*`` and
            ``**``); none for a page computed from the code alone.
        text: The page's text from the data under a root, in memory.
        awaiting: The rerun that commits its data, where that data is not committed yet: the
            page is passed over until some of it is there.
    """

    command: str
    data: tuple[str, ...]
    text: Callable[[Path], str]
    awaiting: str = ""

    @property
    def source(self) -> str:
        """Where the page's figures come from, for the problems."""
        return ", ".join(self.data) or f"`{self.command}`"


def _json(root: Path, rel: str) -> Any:
    return json.loads((root / rel).read_text())


def _compile_overlap(root: Path) -> str:
    from experiments.bench import compile_overlap

    return compile_overlap.page(_json(root, "docs/results/compile-overlap.json"))


def _folders(root: Path, patterns: Sequence[str]) -> list[Path]:
    """The folders each pattern matches, pattern by pattern, each pattern's in name order."""
    return [p for pattern in patterns for p in sorted(root.glob(pattern)) if p.is_dir()]


# --- the pages ------------------------------------------------------------------------------


def _report(
    page: str, *dirs: str, tune: str | None = None, awaiting: str = ""
) -> tuple[str, WholePage]:
    """A ``report.md`` of ``make report`` over the run folders ``dirs``."""
    out = Path(page).parent
    command = f"python -m experiments.report {' '.join(dirs)}"
    command += f"{f' --tune {tune}' if tune else ''} --out {out}"

    def text(root: Path) -> str:
        return report_markdown(_folders(root, dirs), out=root / out, tune=tune, root=root)

    return page, WholePage(command, dirs, text, awaiting)


_L, _O = "docs/results/lm/runs", "docs/results/outer/lm_small/runs"
_G, _S = "docs/results/lm_gap/runs", "docs/results/streaming/runs"
_HEADLINE = (f"{_G}/allreduce-adamw/final", f"{_G}/complete-adamw-lr0.004/final")
_REPORTS = dict([
    _report("docs/results/compression/report.md", "docs/results/compression/runs/*"),
    _report("docs/results/lm/report.md", f"{_L}/*/final"),
    _report("docs/results/lm/tune_lr/report.md", f"{_L}/*-adamw/stage1",
            f"{_L}/one-peer-exp-accum8/stage1", tune="optim.lr"),
    _report("docs/results/lm/tune_accum/report.md", f"{_L}/one-peer-exp-accum*/stage1",
            tune="optim.accum_iter"),
    _report("docs/results/lm_quick/report.md", "docs/results/lm_quick/runs"),
    _report("docs/results/outer/digits/report.md", "docs/results/outer/runs/digits"),
    _report("docs/results/outer/noniid/report.md", "docs/results/outer/runs/noniid"),
    _report("docs/results/outer/lm/report.md", "docs/results/outer/runs/lm"),
    _report("docs/results/outer/lm_small/report.md", f"{_O}/*/final"),
    _report("docs/results/outer/lm_small/tune_outer_lr/report.md", f"{_O}/diloco-*/stage1",
            tune="outer.lr"),
    _report("docs/results/lm_gap/state_sync/report.md", *_HEADLINE,
            f"{_G}/one-peer-exp-adamw-lr0.004/final", f"{_G}/*-v/final"),
    _report("docs/results/lm_gap/batch/report.md", *_HEADLINE, f"{_G}/*-w*/final"),
    _report("docs/results/lm_gap/tune_k/report.md", f"{_G}/*-v/stage1",
            tune="optim.state_sync.exp_avg_sq"),
    _report("docs/results/lm_gap/tune_inner_lr/report.md", f"{_G}/*-H16-lr/stage1",
            tune="optim.lr"),
    _report("docs/results/lm_gap/tune_outer_lr/report.md", f"{_G}/diloco-H16-outer/stage1",
            tune="outer.lr"),
    _report("docs/results/lm_gap/tune_sgd/report.md", f"{_G}/*-sgd/stage1", tune="optim.lr"),
    _report("docs/results/lm_gap/tune_delayed/report.md", f"{_G}/allreduce-delayed/stage1",
            tune="optim.lr"),
    _report("docs/results/lm_gap/tune_batch/report.md", f"{_G}/*-w*/stage1", tune="optim.lr"),
    _report("docs/results/streaming/report.md", f"{_S}/*/final"),
    _report("docs/results/streaming/tune_outer_lr/report.md", f"{_S}/*/stage1",
            tune="outer.lr"),
])  # fmt: skip


_N, _C = "docs/results/noniid", "docs/results/cpu_small/runs"
_NONIID, _CPU_SMALL = "experiments/sweeps/noniid.sh", "experiments/sweeps/cpu_small.sh"
_AWAITING = dict([
    *(_report(f"{_N}/alpha{a}/report.md", f"{_N}/runs/gossip/*_alpha{a}_*",
              f"{_N}/runs/allreduce/*_alpha{a}_*", awaiting=_NONIID) for a in ("0.1", "1.0")),
    _report("docs/results/digits/report.md", f"{_C}/digits", awaiting=_CPU_SMALL),
    _report("docs/results/synthetic/report.md", f"{_C}/synthetic", f"{_C}/synthetic_slow",
            awaiting=_CPU_SMALL),
])  # fmt: skip


def _upstream(name: str) -> tuple[str, WholePage]:
    """A page of ``make bench-upstream``: the versions and settings, then the tables."""
    data = f"docs/results/bench-upstream/{name}.json"

    def text(root: Path) -> str:
        r = _json(root, data)
        head = f"decent_dp (ours): {r['ours']}; torch {r['torch']}; settings {r['settings']}"
        return f"{head}\n\n{upstream.tables(r)}\n"

    return data.removesuffix(".json") + ".md", WholePage("make bench-upstream", (data,), text)


def _simulate(folder: str) -> tuple[str, WholePage]:
    """A ``simulate.md`` of the scale simulator from its ``simulate.json``.

    The fitted efficiencies and the sensitivity table are not in the JSON: they are computed
    again from its inputs (the simulator is deterministic for a seed).
    """
    data = f"{folder}/simulate.json"

    def text(root: Path) -> str:
        saved = _json(root, data)
        cfg = OmegaConf.create(saved["inputs"])
        profs = profiles(cfg)
        simulate.calibrate(cfg, profs)  # sets the fitted efficiencies the inputs table shows
        variants = simulate.sensitivity(cfg)
        return sim_report.format_markdown(saved["rows"], cfg, profs, saved["calibration"], variants)

    return f"{folder}/simulate.md", WholePage(
        "python -m experiments.network.simulate", (data,), text
    )


def _validation(folder: str) -> tuple[str, WholePage]:
    """A ``validation.md`` of the simulator against emulated runs, from its ``validation.json``."""
    data = f"{folder}/validation.json"

    def text(root: Path) -> str:
        saved = _json(root, data)
        return sim_validate._table(saved["rows"], argparse.Namespace(**saved["args"]))

    command = "python -m experiments.network.sim_validate --from-runs"
    return f"{folder}/validation.md", WholePage(command, (data,), text)


def _wire(folder: str) -> tuple[str, WholePage]:
    """A ``table.md`` of the wire study from its ``table.json``."""
    data = f"{folder}/table.json"

    def text(root: Path) -> str:
        return wire_table.markdown(_json(root, data)) + "\n"

    command = "python -m experiments.network.wire_study table"
    if folder != "docs/results/network":
        command += f" --out {folder}"
    return f"{folder}/table.md", WholePage(command, (data,), text)


_H = "docs/results/hierarchical"
_OWN = f"{_H}/own-link"


def _own_link(root: Path) -> str:
    """The wire study's table of the hierarchical runs with the emulated runs of ``own-link/``
    (a link per rank, the emulator before it knew hosts) in place of theirs."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        skip = shutil.ignore_patterns("emulated", "calibrated")
        shutil.copytree(root / _H / "runs", runs, ignore=skip)  # the wire and compute-only runs
        for emulated in sorted((root / _OWN).glob("*/*/*/*/emulated")):
            shutil.copytree(emulated, runs / emulated.relative_to(root / _OWN))
        return wire_table.markdown(wire_table.rows(Path(tmp))) + "\n"


def _outer(root: Path) -> str:
    return outer_summary.markdown(root / "docs/results/outer/runs")


def _noniid(root: Path) -> str:
    return noniid_summary.markdown(root / _N / "runs")


def _calibration(root: Path) -> str:
    return calibrate.markdown(_json(root, "docs/results/network/calibration.json"))


def _bytes(_root: Path) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        compression_bytes.main([])
    return printed.getvalue()


def _study(root: Path) -> str:
    runs = root / "docs/results/sharded/runs"
    printed = io.StringIO()
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(printed):
        sharded_testbed.table(argparse.Namespace(runs=str(runs), out=out))
        return (Path(out) / "study.md").read_text()


_STALL = "docs/results/lm_gap/stall/*/metrics.jsonl"


def _trajectory(root: Path) -> str:
    runs = [p.parent for p in sorted(root.glob(_STALL))]
    return trajectory.table(runs, [16, 32, 48, 64, 96, 128], max_step=128)


# lm_gap.sh's settings: a label, the baseline's runs and the other arm's
_GAPS = (
    ("AdamW, W=8", f"{_G}/allreduce-w8/final", f"{_G}/complete-w8/final"),
    ("AdamW, W=32", *_HEADLINE),
    ("AdamW, W=128", f"{_G}/allreduce-w128/final", f"{_G}/complete-w128/final"),
    ("SGD, W=32", f"{_G}/allreduce-sgd/final", f"{_G}/complete-sgd/final"),
    ("AdamW one step late, W=32", _HEADLINE[0], f"{_G}/allreduce-delayed/final"),
)


def _gap(root: Path) -> str:
    gaps = [
        gap.Gap(label, gap.finals(root / base, "eval/loss"), gap.finals(root / other, "eval/loss"))
        for label, base, other in _GAPS
    ]
    return gap.table(gaps, "eval/loss")


_RERUN = "docs/results/lm_gap/rerun/rerun.json"


def _rerun(root: Path) -> str:
    results = [rerun.Rerun(**r) for r in _json(root, _RERUN)]
    return rerun.report(results, "eval/loss", tol=0.01)


def _link_time(root: Path) -> str:
    arms = link_time.load_arms(root / _S)
    link = link_time.link_name(0.05, 10)  # streaming.sh's LINK_GBPS and LINK_MS
    return link_time.page(arms, link_time.default_target(arms), link)


PAGES: dict[str, WholePage] = {
    **_REPORTS,
    **_AWAITING,
    **dict(_wire(f) for f in ("docs/results/network", _H)),
    f"{_OWN}/table.md": WholePage(
        f"python -m experiments.network.wire_study table over {_H}/runs with the emulated runs "
        f"of {_OWN}", (f"{_H}/runs", f"{_OWN}/digits"), _own_link,
    ),
    "docs/results/outer/summary.md": WholePage(
        "python -m experiments.report.outer_summary docs/results/outer/runs --out "
        "docs/results/outer/summary.md", ("docs/results/outer/runs",), _outer,
    ),
    f"{_N}/summary.md": WholePage(
        f"python -m experiments.report.noniid_summary {_N}/runs --out {_N}/summary.md",
        (f"{_N}/runs",), _noniid, awaiting=_NONIID,
    ),
    "docs/results/network/calibration.md": WholePage(
        "python -m experiments.network.calibrate run", ("docs/results/network/calibration.json",),
        _calibration,
    ),
    **dict(_upstream(name) for name in ("results", "threads2", "gpt", "gpt-profile")),
    **dict(_simulate(f) for f in ("docs/results/simulate",
                                  "docs/results/simulate/paper_transformer_fig6")),
    **dict(_validation(f"docs/results/simulate/validation/{f}") for f in ("balanced", "slow_link")),
    "docs/results/compression/bytes.md": WholePage(
        "python -m experiments.bench.compression_bytes", (), _bytes
    ),
    "docs/results/compile-overlap.md": WholePage(
        "python -m experiments.bench.compile_overlap",
        ("docs/results/compile-overlap.json",),
        _compile_overlap,
    ),
    "docs/results/sharded/study.md": WholePage(
        "python -m experiments.bench.sharded_testbed table",
        ("docs/results/sharded/runs/*x*/*/seed*/summary.json",), _study,
    ),
    "docs/results/lm_gap/stall/trajectory.md": WholePage(
        "python -m experiments.report.trajectory docs/results/lm_gap/stall/*/ --max-step 128",
        (_STALL,), _trajectory,
    ),
    "docs/results/lm_gap/gap/gap.md": WholePage(
        "python -m experiments.report.gap", tuple(dict.fromkeys(d for g in _GAPS for d in g[1:])),
        _gap,
    ),
    "docs/results/lm_gap/rerun/rerun.md": WholePage(
        "python -m experiments.report.rerun", (_RERUN,), _rerun
    ),
    "docs/results/streaming/link/link_time.md": WholePage(
        f"python -m experiments.report.link_time {_S} --gbps 0.05 --latency-ms 10",
        (f"{_S}/*/final", f"{_S}/link/*"), _link_time,
    ),
}  # fmt: skip

# the pages that wait for their sweep's rerun to commit their data
AWAITING: dict[str, str] = {page: w.awaiting for page, w in PAGES.items() if w.awaiting}


# --- regenerating and diffing ---------------------------------------------------------------


def _unparsable(root: Path, data: Sequence[str]) -> DataError | None:
    """The first file of ``data`` (JSON, JSON lines or YAML, folders searched) that does not parse."""
    for pattern in data:
        for top in sorted(root.glob(pattern)):
            files = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
            for file in files:
                rel = file.relative_to(root).as_posix()
                try:
                    if file.suffix == ".json":
                        json.loads(file.read_text())
                    elif file.suffix == ".jsonl":
                        for line in file.read_text().splitlines():
                            if line.strip():
                                json.loads(line)
                    elif file.suffix == ".yaml":
                        yaml.safe_load(file.read_text())
                except (ValueError, yaml.YAMLError) as err:
                    return DataError(rel, f"does not parse ({str(err).splitlines()[0]})")
    return None


def render(page: WholePage, root: Path) -> str:
    """The text ``page``'s command would write from the data under ``root``.

    Raises:
        DataError: A data file or folder is missing, a file does not parse (naming it), or the
            generator refused the data; a warning while reading it (a run the report would
            skip, a malformed metrics line) counts as refusing.
    """
    for pattern in page.data:
        if next(root.glob(pattern), None) is None:
            raise DataError(pattern, "no such file or folder")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            text = page.text(root)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise _unparsable(root, page.data) or DataError(page.source, str(err)) from err
    refused = [w for w in caught if issubclass(w.category, UserWarning)]
    if refused:
        raise _unparsable(root, page.data) or DataError(page.source, str(refused[0].message))
    return text


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _header(lines: Sequence[str], index: int) -> list[str]:
    """The header cells of the table that line ``index`` of ``lines`` is a row of."""
    first = index
    while first > 0 and lines[first - 1].startswith("|"):
        first -= 1
    return _cells(lines[first])


def _line(rel: str, number: int, have: str, want: str, wanted: Sequence[str], at: int,
          source: str) -> list[str]:  # fmt: skip
    """One problem per differing cell of a table row, else one for the line."""
    mine, theirs = _cells(have), _cells(want)
    if not (have.startswith("|") and want.startswith("|") and len(mine) == len(theirs)):
        return [f"{rel}:{number}: '{have}' but {source} gives '{want}'"]
    header = _header(wanted, at)
    return [
        f"{rel}:{number}: '{x}' (row '{theirs[0]}', column "
        f"'{header[col] if col < len(header) else col}') but {source} gives '{y}'"
        for col, (x, y) in enumerate(zip(mine, theirs, strict=True))
        if x != y
    ]


def diff(rel: str, written: str, wanted: str, source: str) -> list[str]:
    """One line per difference between the page as ``written`` and as its data gives it."""
    have, want = written.split("\n"), wanted.split("\n")
    problems: list[str] = []
    matcher = difflib.SequenceMatcher(None, have, want, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        if op == "replace" and i2 - i1 == j2 - j1:
            for k in range(i2 - i1):
                problems += _line(rel, i1 + k + 1, have[i1 + k], want[j1 + k], want, j1 + k, source)
            continue
        problems += [f"{rel}:{i + 1}: '{have[i]}' but {source} gives no such line"
                     for i in range(i1, i2)]  # fmt: skip
        problems += [f"{rel}:{i1 + 1}: {source} gives '{want[j]}' here, which the page lacks"
                     for j in range(j1, j2)]  # fmt: skip
    if len(problems) > _MAX_LINES:
        more = len(problems) - _MAX_LINES
        problems = [*problems[:_MAX_LINES], f"{rel}: {more} more difference(s) ({_WRITE} "
                    "rewrites the page from its data)"]  # fmt: skip
    return problems


def check_page(page: Path, rel: str, data_root: Path, write: bool = False) -> list[str]:
    """Problems of ``page`` (``rel`` under the root) if a command writes it whole, else none.

    With ``write``, the page is first rewritten from its data (unless the data is refused).
    """
    whole = PAGES.get(rel)
    if whole is None:
        return []
    if whole.awaiting and not any(next(data_root.glob(d), None) for d in whole.data):
        return []  # its data is not committed yet
    try:
        wanted = render(whole, data_root)
    except DataError as err:
        return [f"{rel}: written whole by `{whole.command}`: {err}"]
    written = page.read_text()
    if write and written != wanted:
        page.write_text(wanted)
        written = wanted
    return diff(rel, written, wanted, whole.source)
