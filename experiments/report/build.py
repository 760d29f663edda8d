"""``build_report`` and the command line: runs in, ``report.md`` and PNG plots out."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from experiments.report import plots as plots_
from experiments.report.configs import Section, make_section
from experiments.report.runs import METRICS_FILE, SUMMARY_FILE, load_all, num
from experiments.report.tables import config_table, host_note, run_table
from experiments.report.trend import gap_trend_table

__all__ = ["build_report", "main", "report_markdown", "PLOTS", "LM_PLOTS", "REPORT_FILE"]

REPORT_FILE = "report.md"
PLOTS = {
    "consensus": "consensus_vs_step.png",
    "loss": "loss_vs_time.png",
    "acc": "acc_vs_epoch.png",
    "throughput": "throughput.png",
}
LM_PLOTS = {"tokens": "loss_vs_tokens.png", "time": "loss_vs_time.png"}
_HEADINGS = {"vision": "Vision runs", "lm": "Language-model runs"}
_NOTES = {
    "vision": (
        "Speedup: samples/s over the mean of the `allreduce` runs with the same world size, "
        "dataset, model and network. Consensus distance: (1/n) Σ_i ‖x_i − x̄‖²."
    ),
    "lm": (
        "Gap: the final `eval/loss` (of the averaged model) minus that of the `allreduce` runs "
        "with the same world size, dataset and model, in nats per token (positive: worse). "
        "tokens/s vs allreduce: over the `allreduce` runs that also share the network."
    ),
}


def _shown(path: str | Path, root: Path | None) -> str:
    """``path`` as given, or relative to ``root`` when there is one."""
    return str(path) if root is None else os.path.relpath(path, root)


def _sources(dirs: Sequence[str | Path], root: Path | None) -> str:
    if len(dirs) <= 4:
        return ", ".join(f"`{_shown(d, root)}`" for d in dirs)
    try:
        common = os.path.commonpath([os.path.abspath(d) for d in dirs])
    except ValueError:  # another drive on Windows
        return f"{len(dirs)} directories"
    return f"{len(dirs)} directories under `{os.path.relpath(common, root)}`"


def _legend_note(section: Section) -> str:
    looks = ["colour", "line style", "marker"]
    parts = [f"{looks[min(i, 2)]}: {f.title}" for i, f in enumerate(section.factors)]
    return "Plots: " + "; ".join(parts) + "."


def _entropy_note(section: Section) -> list[str]:
    values = {
        (str(r.summary.get("dataset")), round(float(r.summary["unigram_entropy"]), 4))
        for r in section.runs
        if num(r.summary.get("unigram_entropy"))
    }
    return [
        f"Unigram entropy of the `{d}` training tokens: {e:.4f} nats (the loss of a model that "
        "ignores the context).\n"
        for d, e in sorted(values)
    ]


def _section(
    section: Section, target: float, out: Path, names: dict[str, str], draw: bool
) -> list[str]:
    alts = plots_.titles(section)
    paths = {key: out / names[key] for key in alts}
    if draw:
        lm = section.kind == "lm"
        plots_.save(plots_.lm_figures(section) if lm else plots_.vision_figures(section), paths)
    lines = [f"## {_HEADINGS[section.kind]}", "", _NOTES[section.kind], ""]
    lines += [*_entropy_note(section), *host_note(section), *config_table(section, target), ""]
    lines.append(_legend_note(section))
    lines.append("")
    trend = gap_trend_table(section) if section.kind == "lm" else []
    if trend:
        lines += [
            "Along training: the mean `eval/loss` over seeds at 1/8, 1/4, 1/2 and all of the "
            "steps, with the gap to `allreduce` at the same step in brackets.",
            "",
            *trend,
            "",
        ]
    for key, path in paths.items():
        lines += [f"![{alts[key]}]({path.name})", ""]
    return lines


def _report(
    dirs: Sequence[str | Path],
    target_acc: float,
    out: str | Path | None,
    tune: str | None,
    metric: str | None,
    draw: bool,
    root: Path | None = None,
) -> tuple[Path, str]:
    """The report's directory and the text of ``report.md``; with ``draw``, the plots (and
    ``tuned.json``) written into that directory. See :func:`build_report`."""
    if not dirs:
        raise ValueError("no directory given; pass sweep or run directories")
    if not (num(target_acc) and 0 < target_acc <= 1):
        raise ValueError(f"target_acc={target_acc!r} is invalid; it must be in (0, 1]")
    if metric is not None and tune is None:
        raise ValueError(f"metric={metric!r} is only used with tune=KEY; give the key to tune")
    runs, skipped = load_all(dirs)
    for path, why in skipped:
        warnings.warn(f"skipping run {path}: {why}", stacklevel=3)
    if not runs:
        raise ValueError(
            f"no usable run (a directory with {SUMMARY_FILE} and {METRICS_FILE}) under "
            f"{', '.join(str(d) for d in dirs)}"
        )
    # a diverged run has no final evaluation: only tuning counts it (as the worst value)
    diverged = [r for r in runs if r.diverged]
    tuned = None
    if tune is not None:
        # imported here: ``python -m experiments.report.tune`` must find it not yet imported
        from experiments.report import tune as tune_

        tuned = tune_.tune_runs(runs, tune, metric)  # before any file is written
    sections = [
        make_section(kind, picked)
        for kind in ("vision", "lm")
        if (picked := [r for r in runs if r.is_lm == (kind == "lm") and not r.diverged])
    ]
    out_dir = Path(out) if out is not None else Path(dirs[0])
    if draw:
        out_dir.mkdir(parents=True, exist_ok=True)
    configs = sum(len(s.configs) for s in sections)
    lines = [
        "# Run report",
        "",
        f"{len(runs) - len(diverged)} run(s) in {configs} configuration(s) from "
        f"{_sources(dirs, root)}; {len(skipped)} skipped"
        f"{f', {len(diverged)} diverged' if diverged else ''}. Runs that differ only in their seed form one configuration: "
        "its row gives the mean ± sample standard deviation over its seeds, and its plot line "
        "is the mean over the seeds with a band from their minimum to their maximum.",
    ]
    if skipped:
        lines += ["", "Skipped (missing or malformed files):", ""]
        lines += [f"- `{_shown(p, root)}`: {why}" for p, why in skipped]
    if diverged:
        lines += ["", "Diverged (a non-finite loss stopped them; left out of the tables):", ""]
        lines += [
            f"- `{_shown(r.path, root)}`: at step {r.summary.get('diverged_step')}"
            for r in diverged
        ]
    lines.append("")
    if tuned is not None:
        lines += tune_.report_section(tuned, out_dir if draw else None)
    for section in sections:
        names = dict(LM_PLOTS if section.kind == "lm" else PLOTS)
        if section.kind == "lm" and len(sections) > 1:  # beside the vision plots' names
            names = {k: f"lm_{v}" for k, v in names.items()}
        lines += _section(section, target_acc, out_dir, names, draw)
    lines += ["## Runs", "", "One row per run, configuration by configuration.", ""]
    for section in sections:
        if len(sections) > 1:
            lines += [f"### {_HEADINGS[section.kind]}", ""]
        lines += [*run_table(section, target_acc, out_dir), ""]
    return out_dir, "\n".join(lines).rstrip() + "\n"


def report_markdown(
    dirs: Sequence[str | Path],
    target_acc: float = 0.9,
    out: str | Path | None = None,
    tune: str | None = None,
    metric: str | None = None,
    root: str | Path | None = None,
) -> str:
    """The text :func:`build_report` writes into ``report.md``, drawing and writing nothing.

    Args:
        dirs, target_acc, out, tune, metric: As for :func:`build_report`; ``out`` is only
            where the run table's directories and the plots' names are relative to.
        root: The directories named in the text (the sources, skipped and diverged runs) are
            given relative to it; ``None``: as given.

    Returns:
        The report's markdown.

    Raises:
        ValueError: As :func:`build_report`.
    """
    return _report(
        dirs, target_acc, out, tune, metric, False, None if root is None else Path(root)
    )[1]


def build_report(
    dirs: Sequence[str | Path] | str | Path,
    target_acc: float = 0.9,
    out: str | Path | None = None,
    tune: str | None = None,
    metric: str | None = None,
) -> Path:
    """Write ``report.md`` and the plots for every usable run under ``dirs``.

    Args:
        dirs: Sweep or run directories (searched recursively).
        target_acc: Accuracy (a fraction in ``(0, 1]``) for the time-to-accuracy column.
        out: Output directory; the first of ``dirs`` when ``None``.
        tune: An override key (``optim.lr``) to tune: adds a ``Tuned`` section before the
            per-configuration tables, ``tuned.json`` and its plot
            (:mod:`experiments.report.tune`).
        metric: The final metric ``tune`` compares; ``None`` for ``eval/loss`` of
            language-model runs and ``eval/acc`` of image runs.

    Returns:
        The path of ``report.md``.

    Raises:
        ValueError: No directory given, a path is not a directory, ``target_acc``
            is out of range, no usable run was found, ``metric`` without ``tune``, or
            the runs cannot be tuned (see :func:`experiments.report.tune.tune_runs`).
    """
    if isinstance(dirs, (str, Path)):
        dirs = [dirs]
    out_dir, text = _report(dirs, target_acc, out, tune, metric, draw=True)
    report = out_dir / REPORT_FILE
    report.write_text(text)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the package docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.report",
        description="Markdown table and plots over sweep or run directories.",
    )
    parser.add_argument("dirs", nargs="+", help="sweep or run directories (searched recursively)")
    parser.add_argument("--target-acc", type=float, default=0.9, help="for time-to-accuracy")
    parser.add_argument("--out", default=None, help="output directory (default: the first dir)")
    parser.add_argument("--tune", default=None, metavar="KEY", help="tune an override key")
    parser.add_argument("--metric", default=None, help="final metric for --tune")
    args = parser.parse_args(argv)
    try:
        path = build_report(args.dirs, args.target_acc, args.out, args.tune, args.metric)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
