"""``python -m experiments.report.gap``: one arm's gap behind a baseline, paired by seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.report import gap


def _arm(root: Path, losses: dict[int, float]) -> Path:
    for seed, loss in losses.items():
        run = root / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"eval/loss": loss, "seed": seed}))
    return root


def test_the_gap_pairs_seeds_and_leaves_out_a_seed_one_arm_lacks(tmp_path: Path) -> None:
    base = _arm(tmp_path / "base", {0: 3.0, 1: 3.5, 2: 3.2})
    other = _arm(tmp_path / "other", {0: 3.1, 1: 3.8})
    out = tmp_path / "out"
    assert gap.main(["--pair", "W=8", str(base), str(other), "--out", str(out)]) == 0
    row = (out / "gap.md").read_text().splitlines()[-1]
    # the gap is over seeds 0 and 1 only: 0.1 and 0.3, mean 0.2, sd 0.141
    assert row == "| W=8 | 3.233 ± 0.252 | 3.450 ± 0.495 | 0.200 ± 0.141 | +0.100, +0.300 | 2 |"
    assert (out / "gap.png").stat().st_size > 0


def test_several_settings_keep_their_order(tmp_path: Path) -> None:
    args = []
    for label, b, o in (("W=128", 3.0, 3.05), ("W=8", 3.0, 3.4)):
        args += ["--pair", label, str(_arm(tmp_path / label / "b", {0: b})),
                 str(_arm(tmp_path / label / "o", {0: o}))]  # fmt: skip
    assert gap.main([*args, "--out", str(tmp_path / "out")]) == 0
    rows = (tmp_path / "out" / "gap.md").read_text().splitlines()[-2:]
    assert [r.split(" | ")[0] for r in rows] == ["| W=128", "| W=8"]
    assert rows[1].split(" | ")[3] == "0.400"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.mkdir(), "no run"),
        (lambda p: _arm(p, {0: 3.0}) and (p / "seed0" / "summary.json").write_text("{}"),
         "no 'eval/loss'"),
        (lambda p: _arm(p / "a", {0: 3.0}) and _arm(p / "b", {0: 3.1}), "two runs of seed 0"),
    ],
)  # fmt: skip
def test_a_bad_folder_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make, message: str
) -> None:
    bad = tmp_path / "bad"
    make(bad)
    good = _arm(tmp_path / "good", {0: 3.0})
    assert gap.main(["--pair", "x", str(good), str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "o").exists()
