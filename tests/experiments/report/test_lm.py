"""Language-model runs: loss gap to allreduce in nats, tokens/s, loss plots; mixed sweeps."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from experiments import report
from experiments.report import plots
from tests.experiments.report.common import (
    LM_PLOTS,
    VISION_PLOTS,
    lm_grid,
    section,
    table,
    vision_grid,
)


def test_lm_table_gives_the_loss_gap_and_the_tokens_per_second(tmp_path: Path) -> None:
    out = tmp_path / "report"
    text = report.build_report([lm_grid(tmp_path / "sweep")], out=out).read_text()
    assert "## Vision runs" not in text
    rows = {
        (r["configuration"], r["optim"]): r for r in table(section(text, "Language-model runs"))
    }
    assert list(rows) == [("allreduce", "accum_adamw"), ("allreduce", "adamw"),
                          ("ring", "accum_adamw"), ("ring", "adamw")]  # fmt: skip
    # losses 3.00 / 3.05 / 3.10 / 3.20 plus 0.01 per seed: means 3.01, 3.06, 3.11, 3.21;
    # each configuration is compared with the allreduce run of its own optimizer
    expected = {("allreduce", "accum_adamw"): ("3.0600 ± 0.0100", "+0.0000", "1.00x"),
                ("allreduce", "adamw"): ("3.0100 ± 0.0100", "+0.0000", "1.00x"),
                ("ring", "accum_adamw"): ("3.2100 ± 0.0100", "+0.1500", "1.20x"),
                ("ring", "adamw"): ("3.1100 ± 0.0100", "+0.1000", "1.20x")}  # fmt: skip
    for key, (loss, gap, ratio) in expected.items():
        row = rows[key]
        assert (row["final eval/loss (nats)"], row["gap to allreduce (nats)"]) == (loss, gap)
        assert row["tokens/s vs allreduce"] == ratio  # 1210 / 1010 = 1.198 for the ring
        assert row["seeds"] == "3" and row["tokens"] == "262k"  # 4 x 65536
    assert rows[("ring", "adamw")]["tokens/s"] == "1210 ± 10"
    ppl = [math.exp(3.10 + 0.01 * s) for s in range(3)]
    assert rows[("ring", "adamw")]["eval/ppl"] == (
        f"{statistics.fmean(ppl):.2f} ± {statistics.stdev(ppl):.2f}"
    )
    assert rows[("ring", "adamw")]["eval/loss_local"] == "3.1300 ± 0.0100"
    assert "Unigram entropy of the `tokens` training tokens: 7.2500 nats" in text
    runs = table(section(text, "Runs"))
    assert len(runs) == 12 and [r["seed"] for r in runs[:3]] == ["0", "1", "2"]
    assert runs[0]["final eval/loss"] == "3.0500" and runs[0]["tokens/s"] == "1000"
    for name in LM_PLOTS:
        assert (out / name).read_bytes()[:4] == b"\x89PNG" and f"]({name})" in text
    assert not (out / "acc_vs_epoch.png").exists() and not (out / "throughput.png").exists()


def test_lm_loss_against_tokens_draws_eval_bands_and_train_thin(tmp_path: Path) -> None:
    runs = [report.load_run(p) for p in report.find_run_dirs([lm_grid(tmp_path)])]
    sec = report.make_section("lm", [r for r in runs if r is not None])
    assert all(r.is_lm for r in sec.runs)
    figures = plots.lm_figures(sec)
    try:
        (ax,) = figures["tokens"].figure.axes
        assert ax.get_yscale() == "log" and "tokens" in ax.get_xlabel()
        # ring + adamw: eval losses 6.11, 5.11, 4.11, 3.11 (means over seeds) at 64k steps
        evals = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 4]
        (ring,) = [ln for ln in evals if np.allclose(ln.get_ydata(), [6.11, 5.11, 4.11, 3.11])]
        np.testing.assert_allclose(ring.get_xdata(), [65536 * k for k in (1, 2, 3, 4)])
        # train/loss: thin lines of the same colour and style, 8 points each
        thin = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 8]
        assert len(evals) == len(thin) == 4
        assert {(ln.get_color(), ln.get_linestyle()) for ln in thin} == {
            (ln.get_color(), ln.get_linestyle()) for ln in evals
        }
        assert all(ln.get_linewidth() < ring.get_linewidth() for ln in thin)
        keys = {(d.key, d.seeds) for d in figures["time"].drawn}
        assert keys == {("eval/loss", 3), ("train/loss", 3)}
    finally:
        import matplotlib.pyplot as plt

        for plot in figures.values():
            plt.close(plot.figure)


def test_a_mixed_sweep_reports_each_kind_in_its_own_section(tmp_path: Path) -> None:
    vision_grid(tmp_path / "sweep" / "vision")
    lm_grid(tmp_path / "sweep" / "lm")
    text = report.build_report([tmp_path / "sweep"]).read_text()
    assert "24 run(s) in 8 configuration(s)" in text
    vision = table(section(text, "Vision runs"))
    lm = table(section(text, "Language-model runs"))
    assert len(vision) == len(lm) == 4
    assert "final eval/acc" in vision[0] and "final eval/loss (nats)" in lm[0]
    assert [r["speedup vs allreduce"] for r in vision] == ["1.00x", "1.00x", "1.50x", "1.50x"]
    assert "### Vision runs" in text and "### Language-model runs" in text
    names = [*VISION_PLOTS, *(f"lm_{n}" for n in LM_PLOTS)]
    for name in names:
        assert (tmp_path / "sweep" / name).read_bytes()[:4] == b"\x89PNG"
        assert f"]({name})" in text
