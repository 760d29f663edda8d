"""The gap to ``allreduce`` along training: does it close as the budget grows?

For a language-model section, :func:`gap_trend_table` gives each configuration's mean
``eval/loss`` over its seeds at 1/8, 1/4, 1/2 and all of its steps, and its gap to the
reference ``allreduce`` configurations (:func:`experiments.report.tables.reference`) at the
same steps. A run's value at a fraction is its last evaluation at or before that step, so
runs evaluated at the same steps are compared at the same tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from experiments.report.configs import Config, Section
from experiments.report.doc_data import md_table
from experiments.report.runs import Run, num
from experiments.report.tables import reference

__all__ = ["FRACTIONS", "evals", "gap_trend_table", "loss_at"]

FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 1.0)
_KEY = "eval/loss"


def evals(run: Run) -> list[tuple[int, float]]:
    """``(step, eval/loss)`` of every line of the run that logged both, in logged order."""
    return [
        (int(row["step"]), float(row[_KEY]))
        for row in run.metrics
        if num(row.get("step")) and num(row.get(_KEY))
    ]


def loss_at(run: Run, step: int) -> float | None:
    """The run's last ``eval/loss`` logged at or before ``step``, ``None`` if there is none."""
    found = [loss for s, loss in evals(run) if s <= step]
    return found[-1] if found else None


def _last_step(configs: Sequence[Config]) -> int | None:
    steps = [s for c in configs for r in c.runs for s, _ in evals(r)]
    return max(steps) if steps else None


def _mean_at(config: Config, step: int) -> float | None:
    values = [v for v in (loss_at(r, step) for r in config.runs) if v is not None]
    return statistics.fmean(values) if len(values) == len(config.runs) else None


def gap_trend_table(section: Section, fractions: Sequence[float] = FRACTIONS) -> list[str]:
    """Markdown lines: each configuration's loss and gap to allreduce at fractions of its steps.

    Args:
        section: A language-model section.
        fractions: Fractions of the last evaluated step, in (0, 1].

    Returns:
        The table's lines, or no line when the section has no ``allreduce`` reference or no
        evaluation.
    """
    last = _last_step(section.configs)
    if last is None or not any(c.is_allreduce for c in section.configs):
        return []
    steps = [max(1, round(f * last)) for f in fractions]
    labels = [f"1/{round(1 / f)}" if f < 1 else "all" for f in fractions]
    head = ["configuration", *(f"{lab} (step {s})" for lab, s in zip(labels, steps, strict=True))]
    rows = []
    for config in section.configs:
        refs = reference(section, config, network=False)
        cells = [section.label(config)]
        for step in steps:
            mine = _mean_at(config, step)
            ref_values = [v for v in (_mean_at(c, step) for c in refs) if v is not None]
            if mine is None:
                cells.append("n/a")
            elif config.is_allreduce or not ref_values:
                cells.append(f"{mine:.3f}")
            else:
                cells.append(f"{mine:.3f} ({mine - statistics.fmean(ref_values):+.3f})")
        rows.append(cells)
    return md_table(head, "l" + "r" * len(steps), rows).split("\n")
