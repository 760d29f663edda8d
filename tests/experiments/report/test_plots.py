"""Plots: a mean line and a min-max band per configuration, one legend entry per factor value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments import report
from experiments.report import plots
from tests.experiments.report.common import vision_grid


@pytest.fixture
def section(tmp_path: Path) -> report.Section:
    runs = [report.load_run(p) for p in report.find_run_dirs([vision_grid(tmp_path)])]
    return report.make_section("vision", [r for r in runs if r is not None])


def _legends(figure: Any) -> dict[str, list[str]]:
    """Every legend block of the figure's axes: title -> entries, read from the objects."""
    from matplotlib.legend import Legend

    (ax,) = figure.axes
    found = [a for a in ax.get_children() if isinstance(a, Legend)]
    return {leg.get_title().get_text(): [t.get_text() for t in leg.get_texts()] for leg in found}


def test_legend_names_each_factor_value_once(section: report.Section, tmp_path: Path) -> None:
    figures = plots.vision_figures(section)
    try:
        legends = _legends(figures["acc"].figure)
        assert legends == {
            "topology": ["allreduce", "ring"],
            "optim": ["qgm_sgd", "sgd"],
            "": ["mean over seeds", "min–max over seeds"],
        }
        # consensus: allreduce logged none, so it is not in the legend; the sketch is named
        legends = _legends(figures["consensus"].figure)
        assert legends["topology"] == ["ring"] and legends["optim"] == ["qgm_sgd", "sgd"]
        assert legends[""] == ["exact (mean over seeds)", "min–max over seeds",
                               "count-sketch estimate (mean over seeds)"]  # fmt: skip
        # the legends sit right of the axes, one below the other
        (ax,) = figures["acc"].figure.axes
        boxes = [
            leg.get_window_extent()
            for leg in ax.get_children()
            if leg.__class__.__name__ == "Legend"
        ]
        assert all(b.x0 > ax.get_window_extent().x1 for b in boxes)
        assert all(a.y0 >= b.y1 for a, b in zip(boxes, boxes[1:]))
    finally:
        plots.save(figures, {k: tmp_path / f"{k}.png" for k in figures})
    assert all((tmp_path / f"{k}.png").read_bytes()[:4] == b"\x89PNG" for k in figures)


def test_colour_is_the_first_factor_and_line_style_the_second(section: report.Section) -> None:
    styles = plots.Styles(section)
    by_label = {section.label(c): (styles.colour(c), styles.line(c)) for c in section.configs}
    assert by_label["allreduce, sgd"][0] == by_label["allreduce, qgm_sgd"][0] == "black"
    assert by_label["ring, sgd"][0] == by_label["ring, qgm_sgd"][0] != "black"
    assert by_label["ring, sgd"][1] == by_label["allreduce, sgd"][1] == "--"
    assert by_label["ring, qgm_sgd"][1] == by_label["allreduce, qgm_sgd"][1] == "-"


def test_lines_are_the_seed_mean_and_bands_their_min_max(section: report.Section) -> None:
    figures = plots.vision_figures(section)
    try:
        (ax,) = figures["acc"].figure.axes
        # ring + sgd: final accuracy 0.90 + 0.01 seed, so epochs 1..3 read 70/80/90 % + seed
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 3]
        assert len(lines) == 4
        means = {tuple(np.round(ln.get_ydata(), 6)) for ln in lines}
        assert (71.0, 81.0, 91.0) in means  # the mean of seeds 0, 1, 2
        (band,) = [
            c for c in ax.collections
            if np.allclose(sorted(set(np.round(c.get_paths()[0].vertices[:, 1], 6))),
                           [70, 72, 80, 82, 90, 92])
        ]  # fmt: skip
        assert band.get_alpha() == plots.BAND_ALPHA
        assert {d.seeds for d in figures["acc"].drawn} == {3}
        # time: the seeds take 10, 11 and 12 s per epoch and log training at mid-epoch, so
        # the loss is interpolated onto their common time range: from the slowest seed's
        # first line (6 s) to the fastest seed's last (25 s)
        (ax,) = figures["loss"].figure.axes
        xs = [ln.get_xdata() for ln in ax.get_lines() if len(ln.get_xdata())]
        assert len(xs) == 4 and all(x.min() == 6.0 and x.max() == 25.0 for x in xs)
    finally:
        import matplotlib.pyplot as plt

        for plot in figures.values():
            plt.close(plot.figure)
