"""The outer optimizer sweep's summary, written from run folders as outer.sh keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.report.outer_summary import NOTE, main, markdown, parameters, per_step
from tests.experiments.report.common import write_summary


def _run(runs: Path, task: str, name: str, seed: int, **metrics: float) -> None:
    folder = runs / task / name / f"seed{seed}"
    folder.mkdir(parents=True)
    write_summary(folder, {"topology": name, "world_size": 4, "seed": seed, **metrics})


def test_a_rank_sends_what_its_schedule_averages_to() -> None:
    assert per_step("allreduce", 4) == 1.5  # 2(k-1)/k of the model, every step
    assert per_step("one-peer-exp", 4) == 1.0  # pairs every round
    assert per_step("local-sgd-H8", 4) == per_step("diloco-H8", 4) == 1.5 / 8
    assert per_step("slowmo-one-peer-exp-H8", 4) == pytest.approx(7 / 8 + 1.5 / 8)
    assert per_step("allreduce", 1) == 0.0


def test_digits_rows_give_the_mean_std_gap_and_bytes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed, acc in enumerate((0.98, 0.99)):
        _run(runs, "digits", "allreduce", seed, **{"eval/acc": acc})
    for seed, acc in enumerate((0.95, 0.96, 0.97)):
        _run(runs, "digits", "local-sgd-H8", seed, **{"eval/acc": acc})
    _run(runs, "digits", "one-peer-exp", 0, **{"eval/acc": 0.99})
    (runs / "digits" / "empty").mkdir()  # a configuration without runs: no row
    size = parameters("digits")
    assert markdown(runs).split("\n") == [
        f"### digits, IID: {size:,} parameters (float32), 4 workers",
        "",
        "| configuration | seeds | final eval/acc (mean ± std) | vs allreduce | bytes/step/rank |",
        "|---|---:|---:|---:|---:|",
        f"| allreduce | 2 | 98.50 ± 0.71 | +0.00 pts | {1.5 * 4 * size / 1e3:,.1f} kB |",
        f"| one-peer-exp | 1 | 99.00 ± 0.00 | +0.50 pts | {4 * size / 1e3:,.1f} kB |",
        f"| local-sgd-H8 | 3 | 96.00 ± 1.00 | -2.50 pts | {1.5 / 8 * 4 * size / 1e3:,.1f} kB |",
        "",
        *NOTE.split("\n"),
        "",
    ]


def test_the_lm_is_in_nats_and_a_task_without_allreduce_has_no_gap(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed, loss in enumerate((4.5, 4.7)):
        _run(runs, "lm", "one-peer-exp", seed, **{"eval/loss": loss})
    size = parameters("lm", vocab_size=64)
    assert size < parameters("lm")  # the embedding shrinks with the vocabulary
    lines = markdown(runs, vocab_size=64).split("\n")
    assert lines[0] == f"### tiny GPT (lm_quick): {size:,} parameters (float32), 4 workers"
    assert lines[2] == (
        "| configuration | seeds | final eval/loss (mean ± std) | vs allreduce | bytes/step/rank |"
    )
    assert lines[4] == f"| one-peer-exp | 2 | 4.600 ± 0.141 |  | {4 * size / 1e3:,.1f} kB |"
    _run(runs, "lm", "allreduce", 0, **{"eval/loss": 4.4})
    assert "| one-peer-exp | 2 | 4.600 ± 0.141 | +0.200 nats |" in markdown(runs, vocab_size=64)


def test_main_writes_the_summary_and_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs, out = tmp_path / "runs", tmp_path / "docs" / "summary.md"
    _run(runs, "noniid", "allreduce", 0, **{"eval/acc": 0.9})
    assert main([str(runs), "--out", str(out)]) == 0
    assert out.read_text() == markdown(runs) == capsys.readouterr().out
    assert out.read_text().startswith("### digits, Dirichlet alpha=0.1: ")
