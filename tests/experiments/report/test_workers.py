"""The workers study: its plan of runs, its reading of them, and the page's views.

The plan is checked on run folders this test writes (a ``summary.json`` each), the reading on
a ``runs.json`` whose losses are a known function of the learning rate, beta1 and seed, so
that the tuned points, the paired gaps and the fit are known beforehand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.report.doc_data import Source
from experiments.report.doc_views_workers import (
    glance_row,
    workers_closing,
    workers_findings,
    workers_fit,
    workers_gap,
    workers_status,
    workers_tuned,
)
from experiments.report.workers import Study, collect, fit
from experiments.sweeps import workers as sweep

SMALL = sweep.BUDGETS["small"]
LARGE = sweep.BUDGETS["large"]


def _arm(name: str) -> sweep.Arm:
    return next(a for a in sweep.ARMS if a.name == name)


def _finish(
    out: Path,
    arm: sweep.Arm,
    lr: float,
    beta1: float,
    seed: int,
    loss: float,
    budget: sweep.Budget = SMALL,
) -> None:
    folder = sweep.Run(budget, arm, lr, beta1, seed).folder(out)
    folder.mkdir(parents=True)
    diverged = not math.isfinite(loss)
    summary = {"eval/loss": None if diverged else loss, "diverged": diverged}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 103, "eval/loss": loss}) + "\n")


def _grid(out: Path, arm: sweep.Arm, loss: Any) -> None:
    for lr in sweep.LRS:
        for b1 in sweep.BETA1S:
            _finish(out, arm, lr, b1, 0, loss(lr, b1))


def test_the_plan_runs_the_grid_then_past_an_edge_then_the_seeds(tmp_path):
    arm = _arm("one-peer-exp-4")
    state = sweep.arm_state(tmp_path, SMALL, arm)
    assert sorted(state.todo) == sorted((lr, b1, 0) for lr in sweep.LRS for b1 in sweep.BETA1S)
    # best at the largest lr and the largest beta1: one value past each edge
    _grid(tmp_path, arm, lambda lr, b1: 5 - lr - b1)
    assert sweep.arm_state(tmp_path, SMALL, arm).todo == [(0.032, 0.974, 0), (0.016, 0.987, 0)]
    _finish(tmp_path, arm, 0.032, 0.974, 0, 9.0)  # worse: the lr edge is settled
    _finish(tmp_path, arm, 0.016, 0.987, 0, 1.0)  # better: its lr is bracketed, beta1 goes on
    assert sweep.arm_state(tmp_path, SMALL, arm).todo == [
        (0.008, 0.987, 0),
        (0.032, 0.987, 0),
        (0.016, 0.994, 0),
    ]
    for lr, b1 in ((0.008, 0.987), (0.032, 0.987), (0.016, 0.994)):
        _finish(tmp_path, arm, lr, b1, 0, 2.0)
    state = sweep.arm_state(tmp_path, SMALL, arm)
    assert state.best == (0.016, 0.987) and state.todo == [(0.016, 0.987, 1), (0.016, 0.987, 2)]
    for seed in (1, 2):
        _finish(tmp_path, arm, 0.016, 0.987, seed, 1.0)
    assert sweep.arm_state(tmp_path, SMALL, arm).done


def test_the_plan_adds_beta1_09_seeds_at_32_workers_and_no_edge_past_a_divergence(tmp_path):
    arm = _arm("one-peer-exp-32")
    # the largest lr diverges at beta1 = 0.9; the best overall is inside the grid
    loss = {0.004: 3.0, 0.008: 2.0, 0.016: 2.5}
    _grid(tmp_path, arm, lambda lr, b1: math.inf if (lr, b1) == (0.016, 0.9) else loss[lr] - b1)
    state = sweep.arm_state(tmp_path, SMALL, arm)
    # beta1 = 0.974 is the best's edge: 0.987 first; beta1 = 0.9's best lr is inside
    assert state.todo == [(0.008, 0.987, 0)]
    _finish(tmp_path, arm, 0.008, 0.987, 0, 5.0)
    state = sweep.arm_state(tmp_path, SMALL, arm)
    assert state.todo == [(0.008, 0.974, s) for s in (1, 2)] + [(0.008, 0.9, s) for s in (1, 2)]


def _runs_json(losses: dict[str, Any]) -> dict[str, Any]:
    """Seed 0's grid and seeds 0-2 at the best of every arm, loss = f(arm, lr, beta1) + seed."""
    arms = [{"name": "allreduce", "topology": "allreduce", "workers": 4, "extra": []}]
    for name in losses:
        if name != "allreduce":
            topology, n = name.rsplit("-", 1)
            arms.append({"name": name, "topology": topology, "workers": int(n), "extra": []})
    runs = []
    for budget in ("small", "large"):
        for arm in arms:
            f = losses[arm["name"]]
            points = [(lr, b1) for lr in sweep.LRS for b1 in sweep.BETA1S]
            best = min(points, key=lambda p: f(budget, *p))
            for lr, b1 in points:
                seeds = (0, 1, 2) if (lr, b1) == best else (0,)
                for seed in seeds:
                    runs.append(
                        {
                            "budget": budget,
                            "arm": arm["name"],
                            "lr": lr,
                            "beta1": b1,
                            "seed": seed,
                            "eval_loss": f(budget, lr, b1) + 0.01 * seed,
                            "diverged": False,
                            "curve": [[103, f(budget, lr, b1)]],
                        }
                    )
    study = {
        "params": 168256,
        "tokens_per_step": 8192,
        "budgets": {"small": {"steps": 103, "warmup": 10}, "large": {"steps": 411, "warmup": 41}},
        "lrs": list(sweep.LRS),
        "beta1s": list(sweep.BETA1S),
        "arms": arms,
    }
    return {"study": study, "runs": runs}


def _loss(gap_at_4: float, lr_best: float, b1_best: float) -> Any:
    def f(budget: str, lr: float, b1: float) -> float:
        scale = 0.5 if budget == "large" else 1.0
        return 4 + scale * gap_at_4 + abs(math.log2(lr / lr_best)) * 0.1 + abs(b1 - b1_best)

    return f


def _study() -> dict[str, Any]:
    return _runs_json(
        {
            "allreduce": _loss(0.0, 0.008, 0.9),
            "one-peer-exp-4": _loss(0.02, 0.008, 0.95),
            "one-peer-exp-8": _loss(0.05, 0.016, 0.95),
            "one-peer-exp-16": _loss(0.08, 0.016, 0.95),
        }
    )


def test_the_reading_tunes_each_arm_and_pairs_the_gap_by_seed():
    study = Study(_study())
    assert study.tuned("small", "allreduce") == (0.008, 0.9)
    assert study.tuned("small", "one-peer-exp-8") == (0.016, 0.95)
    assert study.tuned("small", "one-peer-exp-8", beta1=0.9) == (0.016, 0.9)
    assert study.on_edge("small", "allreduce") == ["beta1"]
    assert study.on_edge("small", "one-peer-exp-8") == ["lr"]
    gaps = study.gaps("small", "one-peer-exp-8")
    assert gaps == pytest.approx({0: 0.05, 1: 0.05, 2: 0.05})
    assert study.gaps("large", "one-peer-exp-16") == pytest.approx({0: 0.04, 1: 0.04, 2: 0.04})
    assert study.done("small", "one-peer-exp-4") and study.tokens_per_param("large") == (
        pytest.approx(411 * 8192 / 168256)
    )


def test_the_fit_is_least_squares_in_log2_of_the_workers():
    rng = np.random.default_rng(0)
    ns = [4, 4, 8, 8, 16, 16, 64]
    gaps = [0.01 + 0.02 * math.log2(n) + float(rng.normal(0, 0.003)) for n in ns]
    got = fit(list(zip(ns, gaps)))
    slope, intercept = np.polyfit(np.log2(ns), gaps, 1)
    residuals = np.asarray(gaps) - (intercept + slope * np.log2(ns))
    assert (got.a, got.b) == pytest.approx((intercept, slope))
    assert got.sd == pytest.approx(float(np.std(residuals, ddof=2)))
    assert got.at(32) == pytest.approx(intercept + 5 * slope)
    with pytest.raises(ValueError, match="two worker counts"):
        fit([(4, 0.1), (4, 0.2)])


def test_the_views_read_the_committed_file(tmp_path):
    rel = "docs/results/workers/runs.json"
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(json.dumps(_study()))
    src = Source(tmp_path)
    assert "4 of 4 arms" in workers_status(src, rel)
    gap = workers_gap(src, rel, "small")
    assert "| `one-peer-exp-8` | 8 | 0.016 | 0.95 | lr | 4.060 ± 0.010 | +0.050 ± 0.000 |" in gap
    fitted = workers_fit(src, rel)
    # gaps 0.02, 0.05, 0.08 at 4, 8, 16: +0.03 per doubling, on the line exactly
    assert "| small | 5.0 | `one-peer-exp` | +0.0300 | 0.0000 | +0.020 | +0.140 | 9 |" in fitted
    assert "| large | 20.0 | `complete` | – |" in fitted
    assert "| small | `one-peer-exp-8` | 0.95 | 0.016 | 2.00x |" in workers_tuned(src, rel)
    assert "| small | 32 | one-peer-exp, β1 tuned | – | – |" in workers_closing(src, rel)
    findings = workers_findings(src, rel)
    assert "At 4 workers the gap of `one-peer-exp` shrinks with the budget: +0.020" in findings
    assert "3 want a larger β1 and 2 a larger lr" in findings
    # no 64 workers in this study: the glance row says what is there
    assert glance_row(src, rel)[1].startswith("running: 88 runs; arms tuned with 3 seeds")
    assert src.read == [rel]


def test_collect_gathers_the_finished_runs(tmp_path):
    arm = _arm("complete-8")
    _finish(tmp_path, arm, 0.004, 0.95, 0, 4.5)
    (sweep.Run(SMALL, arm, 0.008, 0.95, 0).folder(tmp_path)).mkdir(parents=True)  # running
    data = collect(tmp_path)
    assert [(r["arm"], r["lr"], r["beta1"], r["seed"]) for r in data["runs"]] == [
        ("complete-8", 0.004, 0.95, 0)
    ]
    assert data["runs"][0]["curve"] == [[103, 4.5]]
    assert data["study"]["params"] == sweep.PARAMS


def test_a_committed_runs_json_counts_as_run_and_is_kept(tmp_path):
    arm = _arm("complete-8")
    _grid(tmp_path / "elsewhere", arm, lambda lr, b1: 5 - b1 + abs(lr - 0.008))
    first = collect(tmp_path / "elsewhere")
    # on another machine: no run folder, but the committed file holds the grid
    committed_file = tmp_path / "runs.json"
    committed_file.write_text(json.dumps(first))
    known = sweep.committed(committed_file)
    state = sweep.arm_state(tmp_path / "here", SMALL, arm, known)
    assert state.todo == [(0.008, 0.987, 0)]  # past beta1's edge, not the grid again
    _finish(tmp_path / "here", arm, 0.008, 0.987, 0, 9.0)
    merged = collect(tmp_path / "here", first)
    assert len(merged["runs"]) == 10 and any(r["beta1"] == 0.987 for r in merged["runs"])
    _finish(tmp_path / "here", arm, 0.004, 0.9, 0, 1.0)  # a folder replaces its entry
    again = collect(tmp_path / "here", merged)
    assert len(again["runs"]) == 10
    assert [r["eval_loss"] for r in again["runs"] if (r["lr"], r["beta1"]) == (0.004, 0.9)] == [1.0]
    other = dict(first, study=dict(first["study"], tokens_per_step=8192))
    with pytest.raises(ValueError, match="ran another setting"):
        collect(tmp_path / "here", other)
    committed_file.write_text(json.dumps(other))
    assert sweep.committed(committed_file) == {}


def test_beta1_goes_down_to_zero_and_the_search_ends(tmp_path):
    arm = _arm("one-peer-exp-8")

    def loss(lr: float, b1: float) -> float:  # the smaller beta1 the better, lr 0.008 best
        return b1 + abs(math.log2(lr / 0.008))

    for _ in range(40):
        state = sweep.arm_state(tmp_path, SMALL, arm)
        if state.best is not None:
            break
        for lr, b1, seed in state.todo:
            _finish(tmp_path, arm, lr, b1, seed, loss(lr, b1))
    assert state.best == (0.008, 0.0)
    tried = {float(f.name.split("_")[1][1:]) for f in (tmp_path / "small" / arm.name).iterdir()}
    assert sorted(tried) == [0.0, 0.2, 0.6, 0.8, 0.9, 0.95, 0.974]


def test_the_large_budget_starts_at_the_cross_through_the_small_budgets_best(tmp_path):
    arm = _arm("complete-8")
    assert sweep.arm_state(tmp_path, LARGE, arm).todo == []  # the small budget goes first
    _grid(tmp_path, arm, lambda lr, b1: 5 - lr - b1 / 10)  # best: (0.016, 0.974), an edge each
    for lr, b1, seed in sweep.arm_state(tmp_path, SMALL, arm).todo:
        _finish(tmp_path, arm, lr, b1, seed, 9.0)  # the points past the edges are worse
    for lr, b1, seed in sweep.arm_state(tmp_path, SMALL, arm).todo:
        _finish(tmp_path, arm, lr, b1, seed, 4.0)
    assert sweep.arm_state(tmp_path, SMALL, arm).best == (0.016, 0.974)
    # lr halved and doubled, beta1 one rung down (the grid's 0.95) and up (past it, 0.987)
    cross = [(0.008, 0.974), (0.016, 0.974), (0.032, 0.974), (0.016, 0.95), (0.016, 0.987)]
    assert sweep.arm_state(tmp_path, LARGE, arm).todo == [(lr, b1, 0) for lr, b1 in cross]

    def large(lr: float, b1: float) -> float:  # the large budget's best is one lr further out
        return 3 + abs(math.log2(lr / 0.064)) / 10 + abs(b1 - 0.974)

    for lr, b1 in cross:
        _finish(tmp_path, arm, lr, b1, 0, large(lr, b1), LARGE)
    # the best, (0.032, 0.974), is on the lr edge, and alone on its beta1 axis: both sides
    assert sweep.arm_state(tmp_path, LARGE, arm).todo == [
        (0.064, 0.974, 0),
        (0.032, 0.95, 0),
        (0.032, 0.987, 0),
    ]
    for _ in range(10):
        state = sweep.arm_state(tmp_path, LARGE, arm)
        if state.best is not None:
            break
        for lr, b1, seed in state.todo:
            _finish(tmp_path, arm, lr, b1, seed, large(lr, b1) + seed / 100, LARGE)
    assert state.best == (0.064, 0.974) and state.todo == [(0.064, 0.974, 1), (0.064, 0.974, 2)]
    for seed in (1, 2):
        _finish(tmp_path, arm, 0.064, 0.974, seed, 3.0, LARGE)
    assert sweep.arm_state(tmp_path, LARGE, arm).done
    # the reading tunes the same point: the cross is its start, the walk's runs count
    from experiments.report import workers as report

    data = collect(tmp_path)
    assert data["study"]["start_from"] == {"large": "small"}
    study = Study(data)
    assert study.tuned("small", arm.name) == (0.016, 0.974)
    assert study.tuned("large", arm.name) == (0.064, 0.974)
    # the cross is the start: without one of its points the arm is not tuned yet
    study.runs = [
        r for r in study.runs if (r["budget"], r["lr"], r["beta1"]) != ("large", 0.008, 0.974)
    ]
    assert study.tuned("large", arm.name) is None
    assert report.start_points(sweep.LRS, sweep.BETA1S, (0.004, 0.0))[3:] == [(0.004, 0.2)]


def test_the_findings_say_where_complete_is_below_one_peer_exp():
    from experiments.report.doc_views_workers import _complete_against_ope

    study = Study(
        _runs_json(
            {
                "allreduce": _loss(0.0, 0.008, 0.9),
                "one-peer-exp-4": _loss(0.2, 0.008, 0.9),
                "complete-4": _loss(0.1, 0.008, 0.9),
                "one-peer-exp-8": _loss(0.3, 0.008, 0.9),
                "complete-8": _loss(0.4, 0.008, 0.9),
            }
        )
    )
    assert _complete_against_ope(study, "small") == [
        "- small: `complete`'s gap against `one-peer-exp`'s, at N workers: below at 4 (+0.100 "
        "against +0.200); not below at 8 (+0.400 against +0.300)."
    ]
