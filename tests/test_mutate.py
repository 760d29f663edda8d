"""``make mutate``'s driver: its module-to-tests map stays true to the tree, and its counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support import mutate

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", sorted(mutate.TESTS))
def test_every_mapped_module_and_test_file_exists(module: str) -> None:
    assert (ROOT / module).is_file(), module
    for test in mutate.TESTS[module]:
        assert (ROOT / test).is_file(), test


def test_an_unknown_module_is_refused_in_one_line() -> None:
    with pytest.raises(SystemExit, match="'decent_dp/nope.py' has no test selection; known"):
        mutate.test_command("decent_dp/nope.py")


def _row(outcome: str | None, worker: str = "normal", output: str = "", line: int = 3) -> tuple:
    item = {"mutations": [{"start_pos": [line, 0], "operator_name": "op", "occurrence": 0}]}
    result = {"worker_outcome": worker, "test_outcome": outcome, "output": output, "diff": "d"}
    return item, result


def test_summarize_counts_each_outcome_and_lists_the_survivors() -> None:
    rows = [
        _row("killed"),
        _row("killed", output="timeout"),
        _row("survived", line=9),
        _row("survived", line=2),
        _row("incompetent", worker="exception"),
        _row(None, worker="skipped"),
        ({"mutations": [{"start_pos": [1, 0], "operator_name": "op", "occurrence": 1}]}, None),
    ]
    got = mutate.summarize("decent_dp/x.py", rows)
    assert got["counts"] == {
        "killed": 1,
        "survived": 2,
        "timeout": 1,
        "incompetent": 1,
        "skipped": 1,
    }
    assert [s["line"] for s in got["survivors"]] == [2, 9]


@pytest.mark.parametrize(
    ("operator", "kept"),
    [
        ("core/ReplaceBinaryOperator_Add_Sub", True),
        ("core/ReplaceBinaryOperator_Add_LShift", False),
        ("core/ReplaceBinaryOperator_Sub_Pow", False),
        ("core/ReplaceBinaryOperator_Div_Mul", True),
        ("core/ReplaceComparisonOperator_LtE_Lt", True),
        ("core/ReplaceComparisonOperator_LtE_Gt", False),
        ("core/ReplaceComparisonOperator_Eq_NotEq", True),
        ("core/ReplaceUnaryOperator_Delete_USub", True),
        ("core/ReplaceUnaryOperator_USub_Invert", False),
        ("core/NumberReplacer", True),
        ("core/ZeroIterationForLoop", True),
    ],
)
def test_one_mutant_per_operator_site_is_kept(operator: str, kept: bool) -> None:
    # cosmic-ray's operators filter matches its patterns from the start of the name
    excluded = re.compile("|".join(mutate.EXCLUDED_OPERATORS))
    assert (excluded.match(operator) is None) == kept


def test_the_table_shows_each_summary(tmp_path: Path) -> None:
    rows = [_row("killed"), _row("survived", line=4), _row(None, worker="skipped")]
    summary = mutate.summarize("decent_dp/x.py", rows)
    summary.update(mutants=3, tests=["tests/decent_dp/test_x.py"], baseline_s=2.5)
    (tmp_path / "decent_dp.x.json").write_text(json.dumps(summary))
    lines = mutate.table(tmp_path).splitlines()
    assert lines[2] == "| `decent_dp/x.py` | 3 | 1 | 1 | 0 | 0 | 1 | `test_x.py` | 2.5 |"
