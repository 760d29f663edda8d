"""The pair-exchange and emulator-with-hosts views and spans: a drifted figure fails naming
page, figure and file, and the views compute from their rows."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.report.check_docs import check
from experiments.report.doc_data import Source
from experiments.report.doc_views_wire import HIER, PAIRBENCH, pair_ratio
from tests.support.doc_pages import copy_page, edit_once, edit_span

ROOT = Path(__file__).resolve().parents[3]
NET = "docs/results/network/README.md"
HIER_PAGE = "docs/results/hierarchical/README.md"


def test_a_drifted_pair_exchange_cell_names_its_file(tmp_path: Path) -> None:
    same = f"{pair_ratio('nicqueue_500mbit', 'allreduce-same')(Source(ROOT)):.2f}x"
    page = copy_page(tmp_path, NET)
    rows = [r for r in page.read_text().splitlines() if r.startswith("| the same pair every round")]
    assert len(rows) == 1 and rows[0].endswith(f"| {same} |")
    line = edit_once(page, rows[0], rows[0].removesuffix(f"| {same} |") + "| 1.07x |")
    problems = check(tmp_path, data_root=ROOT)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{NET}:{line}: '1.07x' (row 'the same pair every round'")
    assert f"{PAIRBENCH}/nicqueue_500mbit.jsonl" in problems[0]
    assert problems[0].endswith(f"gives '{same}'")


def test_bold_follows_the_data_not_its_rounding(tmp_path: Path) -> None:
    # 0.8028 is within 20% of the wire and 0.7982 is not, though both print as 0.80
    root = tmp_path
    rows = [
        {"hosts": 4, "procs_per_host": 2, "rate": "100mbit", "arm": "a", "emulated_ratio": 0.8028},
        {"hosts": 4, "procs_per_host": 2, "rate": "100mbit", "arm": "b", "emulated_ratio": 0.7982},
    ]
    (root / HIER).parent.mkdir(parents=True)
    (root / HIER).write_text(json.dumps(rows))
    page = root / "docs" / "page.md"
    marker = "<!-- data: emulator-hosts shapes=4x2 rates=100mbit arms=a,b dagger=b@100mbit -->"
    page.write_text(f"# A page\n\n{marker}\n<!-- /data -->\n")
    assert check(root, write=True) == []
    assert page.read_text().splitlines()[5:7] == [
        "| 4 x 2 | 100 Mb/s | `a` |  | **0.80** |",
        "| 4 x 2 | 100 Mb/s | `b` |  | 0.80 † |",
    ]


def test_a_drifted_count_in_the_hierarchical_prose_fails(tmp_path: Path) -> None:
    page = copy_page(tmp_path, HIER_PAGE)
    figure = "hier.emulated.10mbit.within-20"
    line, written = edit_span(page, figure, "6")
    assert written == "5"
    assert check(tmp_path, data_root=ROOT) == [
        f"{HIER_PAGE}:{line}: figure '{figure}' is '6' but {HIER} gives '5'"
    ]


def test_the_calibration_view_adds_each_profiles_ratio(tmp_path: Path) -> None:
    def point(method: str, measured: float, predicted: float, role: str) -> dict:
        error = predicted / measured - 1
        row = {"profile": "p", "n": 8, "method": method, "measured_ms": measured}
        return row | {"predicted_ms": predicted, "error": error, "role": role, "efficiency": 0.95}

    rel = "d/simulate.json"
    (tmp_path / "d").mkdir()
    points = [
        point("allreduce", 100.0, 100.0 - 1e-9, "fitted"),
        point("g", 40.0, 50.0, "predicted"),
    ]
    (tmp_path / rel).write_text(json.dumps({"calibration": points}))
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(f"# A page\n\n<!-- data: sim-calibration file={rel} -->\n<!-- /data -->\n")
    assert check(tmp_path, write=True) == []
    assert page.read_text().splitlines()[5:8] == [
        "| p | 8 | allreduce | 100.0 | 100.0 | +0.0% | fitted: efficiency 0.950 |",
        "| p | 8 | g | 40.0 | 50.0 | +25.0% | predicted |",
        f"| p | 8 | allreduce / g | 2.50x | 2.00x | {100 * (2.0 / 2.5 - 1):+.1f}% | ratio |",
    ]


def test_a_drifted_validation_cell_names_its_file(tmp_path: Path) -> None:
    rel = "docs/results/simulate/validation/balanced/validation.json"
    row = next(r for r in Source(ROOT).json(rel)["rows"] if r["n"] == 4 and r["method"] == "ring")
    page = copy_page(tmp_path, "docs/results/simulate/README.md")
    measured = f"{row['measured_s'] * 1e3:.1f}"
    text = page.read_text()
    cell = f"| {row['predicted_s'] * 1e3:.1f} | {measured} |"
    assert text.count(cell) == 1
    edit_once(page, cell, cell.replace(measured, "150.0"))
    problems = check(tmp_path, data_root=ROOT)
    assert len(problems) == 1, problems
    assert "'150.0' (row '4', column 'measured (ms)')" in problems[0]
    assert problems[0].endswith(f"but {rel} gives '{measured}'")


def test_a_drifted_sensitivity_cell_names_the_simulators_page(tmp_path: Path) -> None:
    page = copy_page(tmp_path, "docs/results/simulate/README.md")
    rows = [r for r in page.read_text().splitlines() if r.startswith("| InfiniBand 100 Gb/s |")]
    assert len(rows) == 1
    cells = rows[0].split(" | ")
    line = edit_once(page, rows[0], rows[0].replace(f" | {cells[4]} | ", " | +9.9% | "))
    problems = check(tmp_path, data_root=ROOT)
    assert problems == [
        f"docs/results/simulate/README.md:{line}: '+9.9%' (row 'InfiniBand 100 Gb/s', column "
        f"'A100 allreduce') but docs/results/simulate/paper_transformer_fig6/simulate.md gives "
        f"'{cells[4]}'"
    ]
