"""make check-docs on the pages a command writes whole: regenerated from their data and diffed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.network import wire_table
from experiments.report.check_docs import check, main
from experiments.report.doc_data import DataError, Source, md_table
from experiments.report.doc_views_wire import OWN_LINK, own_link
from experiments.report.whole_pages import AWAITING, PAGES, diff
from tests.experiments.report.common import write_lm_run, write_summary
from tests.support.doc_pages import copy_page, edit_once

ROOT = Path(__file__).resolve().parents[3]
REPORT = "docs/results/outer/lm/report.md"  # make report over docs/results/outer/runs/lm
RUNS = "docs/results/outer/runs/lm"
RERUN = "docs/results/lm_gap/rerun"


def _runs(root: Path) -> Path:
    """Two arms of two seeds each, where the registered report page expects its runs."""
    for topology, loss in (("allreduce", 3.0), ("ring", 3.2)):
        for seed in (0, 1):
            write_lm_run(root / RUNS / f"{topology}/seed{seed}", topology, "adamw", seed,
                         final_loss=loss + 0.01 * seed, tokens_per_s=1000.0,
                         overrides=[f"topology={topology}", f"train.seed={seed}"])  # fmt: skip
    return root / RUNS / "ring/seed1/summary.json"


def _written(root: Path, page: str) -> Path:
    """``page`` under ``root``, written from its data by ``--write``."""
    path = root / page
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    assert check(root, write=True) == []
    return path


def test_every_registered_page_is_committed() -> None:
    assert [p for p in PAGES if not (ROOT / p).is_file()] == []


def test_a_report_whose_data_changes_fails_and_write_restores_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = _runs(tmp_path)
    page = _written(tmp_path, REPORT)
    before = page.read_text()
    assert "| ring | 4 | gpt | tokens | 2 | 3.2050 ± 0.0071 | +0.2000 |" in before
    data = json.loads(summary.read_text())
    data["eval/loss"] = 3.31  # seed 1 of ring ends worse than it did
    summary.write_text(json.dumps(data))
    problems = check(tmp_path)
    line = before.split("\n").index(next(x for x in before.split("\n") if x.startswith("| ring")))
    assert problems[:2] == [
        f"{REPORT}:{line + 1}: '3.2050 ± 0.0071' (row 'ring', column 'final eval/loss (nats)') "
        f"but {RUNS} gives '3.2550 ± 0.0778'",
        f"{REPORT}:{line + 1}: '+0.2000' (row 'ring', column 'gap to allreduce (nats)') "
        f"but {RUNS} gives '+0.2500'",
    ]
    assert main(["--root", str(tmp_path), "--write"]) == 0
    assert "| ring | 4 | gpt | tokens | 2 | 3.2550 ± 0.0778 | +0.2500 |" in page.read_text()
    assert check(tmp_path) == []
    assert capsys.readouterr().out.startswith("check-docs: 1 pages")


def test_a_run_that_does_not_parse_fails_in_one_line(tmp_path: Path) -> None:
    summary = _runs(tmp_path)
    page = _written(tmp_path, REPORT)
    summary.write_text('{"topology": "ring",')
    assert check(tmp_path) == [
        f"{REPORT}: written whole by `python -m experiments.report {RUNS} --out "
        f"docs/results/outer/lm`: {RUNS}/ring/seed1/summary.json: does not parse (Expecting "
        "property name enclosed in double quotes: line 1 column 21 (char 20))"
    ]
    text = page.read_text()
    assert check(tmp_path, write=True) != [] and page.read_text() == text  # refused: kept


def test_a_data_file_that_does_not_parse_or_is_missing_fails_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / RERUN / "rerun.json"
    data.parent.mkdir(parents=True)
    data.write_text(json.dumps([{"run": "a/seed0", "committed": 3.25, "rerun": 3.25}]))
    page = _written(tmp_path, f"{RERUN}/rerun.md")
    assert "| a/seed0 | 3.250000 | 3.250000 | 0 | yes |" in page.read_text()
    data.write_text("[{")
    (problem,) = check(tmp_path)
    assert problem.startswith(
        f"{RERUN}/rerun.md: written whole by `python -m experiments.report.rerun`: "
        f"{RERUN}/rerun.json: does not parse ("
    )
    data.unlink()
    assert check(tmp_path) == [
        f"{RERUN}/rerun.md: written whole by `python -m experiments.report.rerun`: "
        f"{RERUN}/rerun.json: no such file or folder"
    ]


_GAP_RUNS = (
    "docs/results/lm_gap/runs/allreduce-w8/final, "
    "docs/results/lm_gap/runs/complete-w8/final, docs/results/lm_gap/runs/allreduce-adamw/"
    "final, docs/results/lm_gap/runs/complete-adamw-lr0.004/final, "
    "docs/results/lm_gap/runs/allreduce-w128/final, docs/results/lm_gap/runs/complete-w128/"
    "final, docs/results/lm_gap/runs/allreduce-sgd/final, "
    "docs/results/lm_gap/runs/complete-sgd/final, docs/results/lm_gap/runs/allreduce-delayed/"
    "final"
)


@pytest.mark.parametrize(
    ("page", "old", "new", "problem"),
    [
        (
            "docs/results/lm_gap/gap/gap.md", "0.194 ± 0.033", "0.149 ± 0.033",
            f"(row 'AdamW, W=32', column 'gap') but {_GAP_RUNS} gives",
        ),
        (
            "docs/results/outer/summary.md", "98.70 ± 0.16", "98.77 ± 0.16",
            "(row 'allreduce', column 'final eval/acc (mean ± std)') but "
            "docs/results/outer/runs gives",
        ),
        (
            "docs/results/compile-overlap.md", "0.91", "0.19",
            "(row 'compile-whole', column 'first bucket steps at (fraction of backward)') but "
            "docs/results/compile-overlap.json gives",
        ),
        (
            OWN_LINK, "0.227 (1.50 **miss**)", "0.227 (1.05)",
            "(row '10mbit', column 'emulated s (ratio)') but docs/results/hierarchical/runs, "
            "docs/results/hierarchical/own-link/digits gives",
        ),
    ],
)  # fmt: skip
def test_a_drifted_cell_of_a_committed_page_names_page_cell_and_data(
    tmp_path: Path, page: str, old: str, new: str, problem: str
) -> None:
    line = edit_once(copy_page(tmp_path, page), f"| {old} |", f"| {new} |")
    assert check(tmp_path, data_root=ROOT) == [f"{page}:{line}: '{new}' {problem} '{old}'"]


def test_lines_added_or_dropped_are_named_and_many_are_counted() -> None:
    assert diff("p.md", "a\nb\nc", "a\nc\nd", "data.json") == [
        "p.md:2: 'b' but data.json gives no such line",
        "p.md:4: data.json gives 'd' here, which the page lacks",
    ]
    problems = diff("p.md", "x", "\n".join(str(i) for i in range(20)), "data.json")
    assert len(problems) == 13 and problems[-1].startswith("p.md: 9 more difference(s)")


def test_md_table_takes_letters_and_writes_a_padded_separator_on_request() -> None:
    rows = [["a", "1"]]
    assert md_table(["k", "v"], ["---", "---:"], rows) == "| k | v |\n|---|---:|\n| a | 1 |"
    assert md_table(["k", "v"], "lr", rows) == "| k | v |\n|---|---:|\n| a | 1 |"
    assert md_table(["k", "v"], "lc", rows, padded=True).split("\n")[1] == "| --- | :---: |"


def test_the_pages_awaiting_a_rerun_name_it_and_have_no_data_committed_yet() -> None:
    assert AWAITING == {
        "docs/results/noniid/alpha0.1/report.md": "experiments/sweeps/noniid.sh",
        "docs/results/noniid/alpha1.0/report.md": "experiments/sweeps/noniid.sh",
        "docs/results/noniid/summary.md": "experiments/sweeps/noniid.sh",
        "docs/results/digits/report.md": "experiments/sweeps/cpu_small.sh",
        "docs/results/synthetic/report.md": "experiments/sweeps/cpu_small.sh",
    }
    # once a rerun commits a page's runs, the page is checked: its mark goes with that commit
    committed = [p for p in AWAITING if any(next(ROOT.glob(d), None) for d in PAGES[p].data)]
    assert committed == []


NONIID = "docs/results/noniid"


def test_a_page_awaiting_its_runs_is_passed_over_then_checked_once_they_are_there(
    tmp_path: Path,
) -> None:
    page = tmp_path / NONIID / "summary.md"
    page.parent.mkdir(parents=True)
    page.write_text("| alpha | a table from runs that are not committed |\n")
    assert check(tmp_path) == []
    runs = tmp_path / NONIID / "runs"
    for sweep, topology, acc in (("allreduce", "allreduce", 0.98), ("gossip", "ring", 0.93)):
        (runs / sweep / f"{topology}_sgd_alpha0.1_seed0").mkdir(parents=True)
        write_summary(runs / sweep / f"{topology}_sgd_alpha0.1_seed0", {"eval/acc": acc})
    problems = check(tmp_path)
    assert problems[0] == (
        f"{NONIID}/summary.md:1: '| alpha | a table from runs that are not committed |' but "
        f"{NONIID}/runs gives no such line"
    )
    assert all(p.startswith(f"{NONIID}/summary.md:1: {NONIID}/runs gives '|") for p in problems[1:])
    assert check(tmp_path, write=True) == []
    assert page.read_text().split("\n")[3] == "| 0.1 | ring | sgd | 1 | 93.00 ± 0.00 | -5.00 |"
    write_summary(runs / "gossip/ring_sgd_alpha0.1_seed0", {"eval/acc": 0.94})
    assert check(tmp_path) == [
        f"{NONIID}/summary.md:4: '93.00 ± 0.00' (row '0.1', column 'eval/acc (mean ± std)') "
        f"but {NONIID}/runs gives '94.00 ± 0.00'",
        f"{NONIID}/summary.md:4: '-5.00' (row '0.1', column 'gap to allreduce (pts)') "
        f"but {NONIID}/runs gives '-4.00'",
    ]


def test_the_own_link_reader_takes_the_emulated_column_by_its_heading(tmp_path: Path) -> None:
    (tmp_path / OWN_LINK).parent.mkdir(parents=True)
    head = "## digits, 4 hosts x 2 processes\n\n| rate | arm | step s | {} |\n|---|---|---:|---:|\n"
    rows = "| 10mbit | ring | 0.2 | 0.1 (0.50 **miss**) |\n| 10mbit | tree | 0.2 | – (–) |\n"
    (tmp_path / OWN_LINK).write_text(head.format("emulated s (ratio)") + rows)
    assert own_link(Source(tmp_path), 4, 2, "10mbit", "ring") == (0.1, 0.5)
    assert own_link(Source(tmp_path), 4, 2, "10mbit", "tree") is None
    with pytest.raises(DataError, match="no row 2x4 10mbit ring"):
        own_link(Source(tmp_path), 2, 4, "10mbit", "ring")
    (tmp_path / OWN_LINK).write_text(head.format("simulated s (ratio)") + rows)
    with pytest.raises(DataError, match="no column 'emulated s \\(ratio\\)' above row"):
        own_link(Source(tmp_path), 4, 2, "10mbit", "ring")


def test_a_wire_table_links_the_calibration_only_where_its_runs_were_calibrated() -> None:
    row = {"model": "digits", "hosts": 4, "procs_per_host": 1, "rate": "10mbit",
           "rate_bps": 10**7, "arm": "ring", "step_s": 0.2, "samples_per_s": 640.0,
           "wire_bytes_per_step": 1e5, "lib_bytes_per_step": 9e4, "drops": 0,
           "target_loss": None, "emulated_step_s": 0.1, "emulated_ratio": 0.5}  # fmt: skip
    assert "(none for these runs)." in wire_table.markdown([row])
    assert "](calibration.md)" not in wire_table.markdown([row])
    calibrated = {**row, "calibrated_step_s": 0.19, "calibrated_ratio": 0.95}
    assert "([calibration.md](calibration.md))." in wire_table.markdown([calibrated])
