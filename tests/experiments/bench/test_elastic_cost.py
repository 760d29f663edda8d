"""The membership-cost bench's reading of its hosts' step times (the testbed run is ``make bench``'s)."""

from __future__ import annotations

import pytest

from experiments.bench import elastic_cost as ec


def _rec(arm: str, rep: int, host: int, steps: list[float]) -> dict:
    return {"arm": arm, "rep": rep, "host": host, "step_s": steps}


def test_an_arm_is_its_slowest_host_and_the_ratio_is_elastic_over_wrapper() -> None:
    records = [
        _rec("wrapper", 0, 0, [9.0, 1.0, 1.0]),  # the warm-up step is left out
        _rec("wrapper", 0, 1, [9.0, 2.0, 2.0]),
        _rec("elastic", 0, 0, [9.0, 2.0, 4.0]),  # a quorum step counts in the mean
        _rec("elastic", 0, 1, [9.0, 1.0, 1.0]),
        _rec("wrapper", 1, 0, [9.0, 1.0, 1.0]),
        _rec("elastic", 1, 0, [9.0, 1.5, 1.5]),
    ]
    out = ec.summarize(records, warmup=1)
    assert out["reps"] == [
        {"wrapper": 2.0, "elastic": 3.0, "ratio": 1.5},
        {"wrapper": 1.0, "elastic": 1.5, "ratio": 1.5},
    ]
    assert out["ratio"] == 1.5 and out["wrapper_step_s"] == 1.5 and out["elastic_step_s"] == 2.25


def test_the_model_has_about_the_asked_parameters() -> None:
    mb = sum(p.numel() for p in ec._mlp(8.0).parameters()) * 4 / 2**20
    assert mb == pytest.approx(8.0, rel=0.01)
