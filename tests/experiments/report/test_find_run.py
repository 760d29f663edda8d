"""``python -m experiments.report.find_run``: finished runs by an override's value."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.report import find_run


def _run(path: Path, *overrides: str, ended: bool = True) -> Path:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if ended:
        (path / "summary.json").write_text("{}")
    return path


@pytest.mark.parametrize(
    ("written", "asked", "found"),
    [("0.002", "2e-3", True), ("0.002", "0.0020", True), ("1", "1", True), ("1", "2", False),
     ("true", "true", True), ("0.002", "0.004", False), ("ring", "ring", True),
     ("ring", "complete", False)],
)  # fmt: skip
def test_values_match_as_numbers_when_both_are_numbers(
    tmp_path: Path, written: str, asked: str, found: bool
) -> None:
    run = _run(tmp_path / "0", f"optim.lr={written}")
    assert find_run.sets(run, "optim.lr", asked) is found


def test_only_runs_that_ended_and_set_that_key(tmp_path: Path) -> None:
    _run(tmp_path / "a", "optim.lr=0.1", ended=False)  # cut short
    _run(tmp_path / "b", "outer.lr=0.1")  # another key
    _run(tmp_path / "c", "optim.lr=0.1")
    (tmp_path / "multirun.yaml").write_text("")
    assert find_run.main([str(tmp_path), "optim.lr=1e-1"]) == 0
    assert find_run.main([str(tmp_path), "optim.lr=0.3"]) == 1
    assert find_run.main([str(tmp_path / "a"), "optim.lr=0.1", "--self"]) == 1
    assert find_run.main([str(tmp_path / "c"), "optim.lr=0.1", "--self"]) == 0


def test_the_first_match_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "1", "optim.lr=0.1")
    _run(tmp_path / "lr0.1", "optim.lr=0.1")
    assert find_run.main([str(tmp_path), "optim.lr=0.1"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / '1'}\n"


def test_an_override_without_a_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        find_run.main([str(tmp_path), "0.1"])
