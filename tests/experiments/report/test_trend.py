"""The gap to allreduce at 1/8, 1/4, 1/2 and all of the steps, on written run folders."""

from __future__ import annotations

from pathlib import Path

from experiments import report
from experiments.report.trend import gap_trend_table, loss_at
from tests.experiments.report.common import write_overrides, write_summary


def _run(path: Path, topology: str, seed: int, losses: list[float], every: int = 8) -> None:
    """Eval lines at steps every, 2*every, ...; the summary names the final loss."""
    path.mkdir(parents=True)
    lines = [
        f'{{"step": {every * (k + 1)}, "tokens": {1000 * every * (k + 1)}, "eval/loss": {loss}}}'
        for k, loss in enumerate(losses)
    ]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    write_summary(path, {"topology": topology, "world_size": 4, "model": "gpt",
                         "dataset": "tokens", "optim": "adamw", "seed": seed,
                         "eval/loss": losses[-1], "eval/ppl": 1.0, "tokens": 64000})  # fmt: skip
    write_overrides(path, [f"topology={topology}", f"train.seed={seed}"])


def _section(root: Path) -> report.Section:
    runs = [report.load_run(p) for p in report.find_run_dirs([root])]
    return report.make_section("lm", [r for r in runs if r is not None])


def _rows(lines: list[str]) -> dict[str, list[str]]:
    return {
        cells[0]: cells[1:]
        for line in lines[2:]
        if (cells := [c.strip() for c in line.strip("|").split("|")])
    }


def test_the_gap_is_read_at_each_fraction_of_the_steps(tmp_path: Path) -> None:
    # 8 evaluations at steps 8..64: fractions 1/8, 1/4, 1/2, 1 are steps 8, 16, 32, 64
    ar = [6.0, 5.0, 4.6, 4.4, 4.3, 4.2, 4.1, 4.0]
    ring = [6.5, 5.4, 4.9, 4.6, 4.45, 4.3, 4.2, 4.05]
    for seed, shift in ((0, 0.0), (1, 0.02)):
        _run(tmp_path / f"ar{seed}", "allreduce", seed, [v + shift for v in ar])
        _run(tmp_path / f"ring{seed}", "ring", seed, [v + shift for v in ring])
    lines = gap_trend_table(_section(tmp_path))
    assert lines[0].split("|")[2].strip() == "1/8 (step 8)"
    assert lines[0].split("|")[5].strip() == "all (step 64)"
    rows = _rows(lines)
    assert rows["allreduce"] == ["6.010", "5.010", "4.410", "4.010"]
    # the ring's gap closes from 0.5 to 0.05 nats
    assert rows["ring"] == ["6.510 (+0.500)", "5.410 (+0.400)", "4.610 (+0.200)",
                            "4.060 (+0.050)"]  # fmt: skip


def test_a_fraction_between_evaluations_takes_the_last_one_before(tmp_path: Path) -> None:
    _run(tmp_path / "ar", "allreduce", 0, [5.0, 4.0, 3.0], every=10)  # steps 10, 20, 30
    _run(tmp_path / "ring", "ring", 0, [5.5, 4.2, 3.1], every=10)
    runs = {r.topology: r for r in _section(tmp_path).runs}
    assert loss_at(runs["ring"], 25) == 4.2 and loss_at(runs["ring"], 9) is None
    # steps 4 (before the first evaluation), 8, 15 and 30
    assert _rows(gap_trend_table(_section(tmp_path)))["ring"] == [
        "n/a",
        "n/a",
        "5.500 (+0.500)",
        "3.100 (+0.100)",
    ]


def test_no_allreduce_no_table(tmp_path: Path) -> None:
    _run(tmp_path / "ring", "ring", 0, [5.0, 4.0])
    _run(tmp_path / "complete", "complete", 0, [5.0, 3.9])
    assert gap_trend_table(_section(tmp_path)) == []


def test_the_report_shows_the_trend_under_the_language_model_table(tmp_path: Path) -> None:
    _run(tmp_path / "runs" / "ar", "allreduce", 0, [5.0, 4.0, 3.5, 3.0])
    _run(tmp_path / "runs" / "ring", "ring", 0, [5.4, 4.3, 3.7, 3.1])
    text = report.build_report([tmp_path / "runs"], out=tmp_path / "out").read_text()
    lm = text.split("## Language-model runs", 1)[1].split("## Runs", 1)[0]
    assert "Along training" in lm and "| ring | n/a | 5.400 (+0.400) | 4.300 (+0.300) |" in lm
