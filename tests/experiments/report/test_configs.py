"""Runs grouped into configurations over seeds, the factors found, and the seed bands."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from experiments import report
from experiments.report import Factor
from tests.experiments.report.common import (
    GRID,
    vision_grid,
    write_overrides,
    write_summary,
    write_vision_run,
)


def _section(*dirs: Path) -> report.Section:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = [r for r in map(report.load_run, report.find_run_dirs(dirs)) if r]
    return report.make_section("vision", runs)


@pytest.mark.parametrize("hydra", [True, False], ids=["overrides", "summary-fields"])
def test_seeds_form_one_configuration_and_factors_come_in_order(
    tmp_path: Path, hydra: bool
) -> None:
    section = _section(vision_grid(tmp_path, hydra=hydra))
    # the overrides name optim before topology: the topology is still the first factor
    assert section.factors == [Factor(("topology",)), Factor(("optim",))]
    assert [(c.topology, c.fields["optim"]) for c in section.configs] == [
        ("allreduce", "qgm_sgd"), ("allreduce", "sgd"),
        ("ring", "qgm_sgd"), ("ring", "sgd")]  # fmt: skip
    for config in section.configs:
        assert [r.seed for r in config.runs] == [0, 1, 2]
        jobs = {int(r.path.name) for r in config.runs}
        assert jobs == {
            j
            for j, (t, o, _) in enumerate(GRID)
            if (t, o) == (config.topology, config.fields["optim"])
        }
    assert [section.label(c) for c in section.configs] == [
        "allreduce, qgm_sgd", "allreduce, sgd", "ring, qgm_sgd", "ring, sgd"]  # fmt: skip


def test_without_hydra_summary_fields_that_vary_make_configurations(tmp_path: Path) -> None:
    for seed in (0, 1):
        for batch in (32, 64):
            # config_hash, wall time and results differ with the seed: they are not the config
            run = tmp_path / f"b{batch}s{seed}"
            write_vision_run(run, "ring", [100.0 + seed], [0.5 + seed / 10], seed=seed,
                             batch_size=batch)  # fmt: skip
    section = _section(tmp_path)
    assert section.factors == [Factor(("batch_size",))]
    assert [(c.fields["batch_size"], len(c.runs)) for c in section.configs] == [
        ("32", 2),
        ("64", 2),
    ]
    assert [section.label(c) for c in section.configs] == ["batch_size=32", "batch_size=64"]


def test_sub_key_overrides_join_their_group_and_lock_step_fields_share_a_factor(
    tmp_path: Path,
) -> None:
    for i, (alpha, lr, batch) in enumerate([(0.1, 0.1, 32), (1.0, 0.2, 64)]):
        for seed in (0, 1):
            run = tmp_path / f"{i}{seed}"
            write_vision_run(run, "local-sgd", [100.0], [0.5], seed=seed, overrides=[
                "dataset.partition=dirichlet", f"dataset.alpha={alpha}", "topology.period=8",
                f"optim.lr={lr}", f"train.batch_size={batch}", f"train.seed={seed}",
                "hydra.job.chdir=false"])  # fmt: skip
    section = _section(tmp_path)
    assert len(section.configs) == 2 and all(len(c.runs) == 2 for c in section.configs)
    assert section.configs[0].fields == {
        "topology": "local-sgd (period=8)", "dataset": "digits (partition=dirichlet, alpha=0.1)",
        "optim": "sgd (lr=0.1)", "train.batch_size": "32", "model": "small_cnn",
        "network": "none", "world_size": "4"}  # fmt: skip
    # alpha, lr and batch size change together: one factor, named once
    assert section.factors == [Factor(("dataset", "optim", "train.batch_size"))]
    assert section.label(section.configs[1]) == (
        "digits (partition=dirichlet, alpha=1.0), sgd (lr=0.2), train.batch_size=64"
    )
    assert section.constant("topology") == "local-sgd (period=8)"


def test_an_unreadable_overrides_file_falls_back_to_the_summary(tmp_path: Path) -> None:
    write_vision_run(tmp_path / "a", "ring", [1.0], [0.5], overrides=["topology=ring"])
    (tmp_path / "a" / ".hydra" / "overrides.yaml").write_text("- [unclosed\n")
    write_vision_run(tmp_path / "b", "ring", [1.0], [0.5], seed=1, overrides=[])
    with pytest.warns(UserWarning, match="overrides.yaml: ignored"):
        runs = [report.load_run(tmp_path / "a"), report.load_run(tmp_path / "b")]
    assert runs[0] is not None and runs[0].overrides is None
    assert runs[1] is not None and runs[1].overrides == []
    section = report.make_section("vision", [r for r in runs if r])
    assert len(section.configs) == 1 and section.factors == [Factor(("topology",))]


def test_a_summary_without_topology_is_skipped(tmp_path: Path) -> None:
    write_vision_run(tmp_path / "ok", "ring", [1.0], [0.5])
    write_vision_run(tmp_path / "bad", "ring", [1.0], [0.5])
    summary = json.loads((tmp_path / "bad" / "summary.json").read_text())
    write_summary(tmp_path / "bad", {k: v for k, v in summary.items() if k != "topology"})
    write_overrides(tmp_path / "bad", ["topology=ring"])
    with pytest.warns(UserWarning, match="summary.json has no topology"):
        assert report.load_run(tmp_path / "bad") is None
    assert report.load_run(tmp_path / "ok") is not None


def test_band_of_seeds_on_the_same_steps() -> None:
    seeds = [[(1, 0.6 + s / 100), (2, 0.7 + s / 100), (3, 0.8 + s / 100)] for s in range(3)]
    band = report.band(seeds)
    assert band is not None and band.seeds == 3 and not band.interpolated
    np.testing.assert_allclose(band.x, [1, 2, 3])
    np.testing.assert_allclose(band.mean, [0.61, 0.71, 0.81])
    np.testing.assert_allclose(band.lo, [0.60, 0.70, 0.80])
    np.testing.assert_allclose(band.hi, [0.62, 0.72, 0.82])


def test_band_interpolates_where_the_seeds_overlap() -> None:
    # seed b's x values lie between seed a's; repeated x (a resumed run) keeps the last value
    a = [(0, 0.0), (2, 2.0), (2, 2.0), (4, 4.0)]
    b = [(1, 1.0), (3, 5.0), (5, 5.0), (3, 5.0)]
    band = report.band([a, b, []])
    assert band is not None and band.seeds == 2 and band.interpolated
    np.testing.assert_allclose(band.x, [1, 2, 3, 4])  # no extrapolation past 4 or before 1
    np.testing.assert_allclose(band.mean, [1.0, 2.5, 4.0, 4.5])
    np.testing.assert_allclose(band.lo, [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(band.hi, [1.0, 3.0, 5.0, 5.0])
    # seeds that never overlap: each point is its one seed's value
    apart = report.band([[(0, 1.0), (1, 2.0)], [(2, 3.0), (3, 4.0)]])
    assert apart is not None and apart.seeds == 1
    np.testing.assert_allclose(apart.mean, [1.0, 2.0, 3.0, 4.0])
    assert report.band([[], []]) is None


def test_band_thins_long_series() -> None:
    long = [[(float(i), float(i + s)) for i in range(2000)] for s in range(2)]
    band = report.band(long, max_points=100)
    assert band is not None and len(band.x) == 100 and band.x[0] == 0 and band.x[-1] == 1999
    np.testing.assert_allclose(band.mean, band.x + 0.5)


def test_a_field_others_set_is_read_from_the_summary_of_a_run_that_did_not(
    tmp_path: Path,
) -> None:
    # one run sets outer=diloco, one outer=none, one leaves outer out (its summary says none)
    for name, overrides, outer in (
        ("a", ["topology=ring", "outer=diloco"], "diloco"),
        ("b", ["topology=ring", "outer=none"], "none"),
        ("c", ["topology=ring"], "none"),
    ):
        write_vision_run(tmp_path / name, "ring", [100.0], [0.9], overrides=overrides)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        write_summary(tmp_path / name, {**summary, "outer": outer})
    section = _section(tmp_path)
    labels = sorted(section.label(c) for c in section.configs)
    assert labels == ["outer=diloco", "outer=none"]
    none = next(c for c in section.configs if c.fields["outer"] == "none")
    assert len(none.runs) == 2  # b and c are one configuration
    # a summary without the field leaves it missing, read as the default
    write_vision_run(tmp_path / "d", "ring", [100.0], [0.9], overrides=["topology=ring"])
    assert "outer=default" in [_section(tmp_path).label(c) for c in _section(tmp_path).configs]
