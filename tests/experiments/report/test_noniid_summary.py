"""The non-IID sweep's summary, written from run folders as noniid.sh keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.report.noniid_summary import cells, main, markdown
from tests.experiments.report.common import write_summary


def _run(runs: Path, sweep: str, topology: str, optim: str, alpha: str, seed: int, acc: float):
    folder = runs / sweep / f"{topology}_{optim}_alpha{alpha}_seed{seed}"
    folder.mkdir(parents=True)
    write_summary(folder, {"topology": topology, "eval/acc": acc, "seed": seed})


def _sweep(runs: Path) -> None:
    for seed, acc in enumerate((0.98, 0.99)):
        _run(runs, "allreduce", "allreduce", "sgd", "0.1", seed, acc)
        _run(runs, "gossip", "ring", "qgm_sgd", "0.1", seed, acc - 0.05)
    _run(runs, "gossip", "local-sgd", "sgd", "0.1", 0, 0.7)
    _run(runs, "allreduce", "allreduce", "sgd", "1.0", 0, 0.97)
    _run(runs, "gossip", "ring", "sgd", "1.0", 0, 0.975)


def test_rows_per_alpha_allreduce_first_with_the_gap_in_points(tmp_path: Path) -> None:
    _sweep(tmp_path)
    assert cells(tmp_path)[("0.1", "ring", "qgm_sgd")] == pytest.approx([0.93, 0.94])
    assert markdown(tmp_path).split("\n") == [
        "| alpha | topology | optim | seeds | eval/acc (mean ± std) | gap to allreduce (pts) |",
        "|---:|---|---|---:|---:|---:|",
        "| 0.1 | allreduce | sgd | 2 | 98.50 ± 0.71 | +0.00 |",
        "| 0.1 | local-sgd | sgd | 1 | 70.00 ± 0.00 | -28.50 |",
        "| 0.1 | ring | qgm_sgd | 2 | 93.50 ± 0.71 | -5.00 |",
        "| 1.0 | allreduce | sgd | 1 | 97.00 ± 0.00 | +0.00 |",
        "| 1.0 | ring | sgd | 1 | 97.50 ± 0.00 | +0.50 |",
        "",
    ]


def test_a_folder_not_named_as_the_sweep_names_runs_is_refused(tmp_path: Path) -> None:
    _sweep(tmp_path)
    (tmp_path / "gossip" / "ring_sgd_seed0").mkdir()
    write_summary(tmp_path / "gossip" / "ring_sgd_seed0", {"eval/acc": 0.9})
    with pytest.raises(ValueError, match="ring_sgd_seed0: not <topology>_<optim>_alpha"):
        markdown(tmp_path)


def test_an_alpha_without_its_allreduce_baseline_fails(tmp_path: Path) -> None:
    _run(tmp_path, "gossip", "ring", "sgd", "0.1", 0, 0.9)
    with pytest.raises(KeyError):
        markdown(tmp_path)


def test_main_writes_the_summary_and_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs, out = tmp_path / "runs", tmp_path / "docs" / "summary.md"
    _sweep(runs)
    assert main([str(runs), "--out", str(out)]) == 0
    assert out.read_text() == markdown(runs) == capsys.readouterr().out
