"""make check-docs: the docs' figures against their committed data, and that drift fails it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.report.check_docs import check, main
from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views import UPSTREAM_RUN, profile_ms
from experiments.report.figures import FIGURES, TABLES
from experiments.report.figures.sources import Figure
from tests.support.doc_pages import copy_page, edit_once, edit_span

ROOT = Path(__file__).resolve().parents[3]
WIRE = "docs/results/network/table.json"


def test_the_repository_matches_its_data() -> None:
    assert check(ROOT) == []


def test_a_drifted_cell_of_a_generated_table_names_page_figure_and_file(tmp_path: Path) -> None:
    page = copy_page(tmp_path, "README.md")
    line = edit_once(page, "`ring` 349 samples/s", "`ring` 394 samples/s")
    problems = check(tmp_path, data_root=ROOT)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"README.md:{line}: '4 hosts x 1, 5 Mb/s, digits: `ring` 394")
    assert "column 'measured'" in problems[0]
    assert f"but {WIRE}" in problems[0]
    assert problems[0].endswith("`ring` 349 samples/s, `allreduce` 220: **1.59x**'")


def test_a_drifted_figure_in_prose_names_page_figure_and_file(tmp_path: Path) -> None:
    page = copy_page(tmp_path, "docs/results/README.md")
    line = edit_once(page, "-->3.576<!-- /v --> over 3 seeds", "-->3.567<!-- /v --> over 3 seeds")
    problems = check(tmp_path, data_root=ROOT)
    assert problems == [
        f"docs/results/README.md:{line}: figure 'gap.complete-v16.mean' is '3.567' but "
        "docs/results/lm_gap/runs/complete-v/final gives '3.576'"
    ]


def test_a_figure_on_the_wrong_side_of_its_rounding_fails(tmp_path: Path) -> None:
    # 0.9880 written as 0.9881: one digit off in the fourth place is still a different figure
    page = copy_page(tmp_path, "docs/results/README.md")
    edit_once(page, "-->0.9880<!-- /v --> against", "-->0.9881<!-- /v --> against")
    problems = check(tmp_path, data_root=ROOT)
    assert len(problems) == 1 and "'0.9881'" in problems[0] and "gives '0.9880'" in problems[0]
    assert "docs/results/compression/runs/one-peer-exp_int8_seed*" in problems[0]


def test_write_fills_every_span_and_the_check_then_passes(tmp_path: Path) -> None:
    page = copy_page(tmp_path, "docs/results/lm_gap/README.md")
    edit_span(page, "gap.delayed.gap.sd", "")
    edit_span(page, "gap.delayed.seed0", "?")
    assert len(check(tmp_path, data_root=ROOT)) == 2
    assert check(tmp_path, data_root=ROOT, write=True) == []
    assert page.read_text() == (ROOT / "docs/results/lm_gap/README.md").read_text()


DELAYED = "docs/results/lm_gap/runs/allreduce-delayed/final"


def test_an_unknown_span_and_a_span_without_data_fail_in_one_line(tmp_path: Path) -> None:
    _page(tmp_path, "A <!-- v:no.such-figure -->1.0<!-- /v --> and <!-- v:gap.delayed.gap.mean -->")
    assert check(tmp_path) == [
        "docs/page.md:3: figure 'no.such-figure': -: unknown figure 'no.such-figure' "
        "(declare it in experiments/report/figures/)",
        "docs/page.md:3: a span without its closing '<!-- /v -->'",
    ]
    _page(tmp_path, "It ends at <!-- v:gap.delayed.seed0 -->4.319<!-- /v -->.")
    assert check(tmp_path) == [
        f"docs/page.md:3: figure 'gap.delayed.seed0': {DELAYED}: no run (summary.json) there"
    ]


def _seeds(tmp_path: Path) -> Path:
    """A page of one span over a copy of its runs, seed 1's ``summary.json`` to edit."""
    _page(tmp_path, "Seed 1 ends at <!-- v:gap.delayed.seed1 -->4.363<!-- /v -->.")
    shutil.copytree(ROOT / DELAYED, tmp_path / DELAYED)
    assert check(tmp_path) == []
    return tmp_path / DELAYED / "seed1" / "summary.json"


def test_a_changed_data_file_under_a_span_fails_the_check(tmp_path: Path) -> None:
    summary = _seeds(tmp_path)
    data = json.loads(summary.read_text())
    data["eval/loss"] += 0.1
    summary.write_text(json.dumps(data))
    assert check(tmp_path) == [
        f"docs/page.md:3: figure 'gap.delayed.seed1' is '4.363' but {DELAYED} gives '4.463'"
    ]


def test_a_data_file_that_does_not_parse_fails_in_one_line(tmp_path: Path) -> None:
    _seeds(tmp_path).write_text("{ not json")
    (problem,) = check(tmp_path)
    assert problem.startswith(
        f"docs/page.md:3: figure 'gap.delayed.seed1': {DELAYED}/seed1/summary.json: not JSON"
    )


def test_a_changed_data_file_under_a_generated_table_fails_the_check(tmp_path: Path) -> None:
    page = "docs/results/streaming/README.md"
    lines = (ROOT / page).read_text().split("\n")
    first = lines.index("<!-- data: figures id=stream.link -->")
    _page(tmp_path, "\n".join(lines[first : first + 9]))
    link = tmp_path / "docs/results/streaming/link/link_time.json"
    link.parent.mkdir(parents=True)
    data = json.loads((ROOT / "docs/results/streaming/link/link_time.json").read_text())
    data["arms"][0]["step_s"] += 1.0
    link.write_text(json.dumps(data))
    assert check(tmp_path) == [
        "docs/page.md:6: figure 'stream.link.allreduce-adamw.step-s' is '1.394' (row "
        "'`allreduce`', column 's/step on the link') but "
        "docs/results/streaming/link/link_time.json gives '2.394'"
    ]


def test_every_figure_and_table_is_on_a_page() -> None:
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
    assert [
        f for f in FIGURES if f"<!-- v:{f} -->" not in text and "{{" + f + "}}" not in str(TABLES)
    ] == []
    assert [t for t in TABLES if f"<!-- data: figures id={t} -->" not in text] == []


def _page(tmp_path: Path, body: str) -> Path:
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"# A page\n\n{body}\n")
    return page


def test_a_marker_naming_a_missing_file_fails(tmp_path: Path) -> None:
    _page(tmp_path, "<!-- data: wire-rates file=docs/results/nope/table.json -->\n<!-- /data -->")
    problems = check(tmp_path, data_root=ROOT)
    assert problems == [
        "docs/page.md:3: data block 'wire-rates': docs/results/nope/table.json: no such file"
    ]


@pytest.mark.parametrize(
    ("marker", "why"),
    [
        (f"wire-rates file={WIRE} rates=2mbit", f"{WIRE}: no row model=digits"),
        (f"wire-rates file={WIRE} arms=allreduce,ring-int4", f"{WIRE}: no arm 'ring-int4'"),
        (
            "lm-tuned runs=docs/results/lm/nope",
            "docs/results/lm/nope/allreduce-adamw/final: no run",
        ),
        (
            "no-such-view",
            "unknown view 'no-such-view' (known: bench, by-topology, choose, elastic",
        ),
        (
            "glance colour=red",
            "view 'glance': glance() got an unexpected keyword argument 'colour'",
        ),
    ],
)
def test_a_marker_naming_a_missing_key_fails(tmp_path: Path, marker: str, why: str) -> None:
    _page(tmp_path, f"<!-- data: {marker} -->\n<!-- /data -->")
    problems = check(tmp_path, data_root=ROOT)
    assert len(problems) == 1 and problems[0].startswith("docs/page.md:3: data block '")
    assert why in problems[0]


def test_an_unclosed_block_fails(tmp_path: Path) -> None:
    _page(tmp_path, "<!-- data: glance -->\n| a |")
    assert check(tmp_path, data_root=ROOT) == [
        "docs/page.md:3: data block without its closing '<!-- /data -->'"
    ]


def test_write_regenerates_a_block_from_its_data(tmp_path: Path) -> None:
    marker = f"<!-- data: wire-rates file={WIRE} shape=4x1 rates=5mbit,10mbit emulated=no -->"
    page = _page(tmp_path, f"{marker}\n| stale |\n<!-- /data -->\n\nAfter.")
    assert "the block has 1 lines where" in check(tmp_path, data_root=ROOT)[0]
    assert check(tmp_path, data_root=ROOT, write=True) == []
    text = page.read_text()
    src = Source(ROOT)
    ring, allreduce = (src.wire(WIRE, "4x1", "10mbit", a) for a in ("ring", "allreduce"))
    row = f"| 10 Mb/s | {allreduce:,.0f} | {ring:,.0f} | **{ring / allreduce:.2f}x** |"
    assert row in text.splitlines()
    assert text.endswith("<!-- /data -->\n\nAfter.\n")
    assert check(tmp_path, data_root=ROOT) == []


def test_a_figure_writes_its_minus_sign_as_the_page_does() -> None:
    assert (
        Figure(lambda s: -0.0481, "{:+.3f}", minus=True).write(Source(ROOT)) == "\u2212" + "0.048"
    )
    assert Figure(lambda s: 0.0481, "{:+.3f}", minus=True).write(Source(ROOT)) == "+0.048"


def test_json_keys_are_read_by_path_and_a_missing_one_is_named() -> None:
    src = Source(ROOT)
    assert src.key("docs/results/bench-upstream/gpt.json", "configs.0.model") == "mlp"
    with pytest.raises(DataError, match=r"gpt.json: no key 'configs.0.nope' \(stops at 'nope'\)"):
        src.key("docs/results/bench-upstream/gpt.json", "configs.0.nope")


def test_the_command_exits_1_with_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = copy_page(tmp_path, "README.md")
    edit_once(page, "`ring` 349 samples/s", "`ring` 394 samples/s")
    assert main(["--root", str(tmp_path), "--data-root", str(ROOT)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("README.md:") and err[-1].startswith("check-docs: 1 figure(s)")
    assert main(["--data-root", str(ROOT), "--root", str(ROOT)]) == 0


def test_the_issues_drifted_wire_row_is_caught(tmp_path: Path) -> None:
    # the README's 4 x 1 table before this check: 10 Mb/s typed as 390, 726 and 1.86x
    marker = f"<!-- data: wire-rates file={WIRE} shape=4x1 rates=10mbit emulated=no -->"
    old = "| 10 Mb/s | 390 | 726 | **1.86x** |"
    header = "| link | `allreduce` | `ring` | `ring` / `allreduce` |\n|---|---:|---:|---:|"
    _page(tmp_path, f"{marker}\n{header}\n{old}\n<!-- /data -->")
    problems = check(tmp_path, data_root=ROOT)
    assert problems == [
        f"docs/page.md:6: '390' (row '10 Mb/s', column '`allreduce`') but {WIRE} gives '432'",
        f"docs/page.md:6: '726' (row '10 Mb/s', column '`ring`') but {WIRE} gives '687'",
        f"docs/page.md:6: '**1.86x**' (row '10 Mb/s', column '`ring` / `allreduce`') "
        f"but {WIRE} gives '**1.59x**'",
    ]


def test_a_drifted_profile_cell_names_the_profiled_run(tmp_path: Path) -> None:
    mix = f"{profile_ms(Source(ROOT), UPSTREAM_RUN, 4, 'before', 'mix'):.1f}"
    page = copy_page(tmp_path, "docs/performance.md")
    line = edit_once(
        page,
        f"| mix (mixing passes, launch copy) | {mix} |",
        "| mix (mixing passes, launch copy) | 4.2 |",
    )
    problems = check(tmp_path, data_root=ROOT)
    assert problems == [
        f"docs/performance.md:{line}: '4.2' (row 'mix (mixing passes, launch copy)', "
        f"column 'before') but {UPSTREAM_RUN} gives '{mix}'"
    ]


def test_a_drifted_bytes_cell_of_lm_gap_names_its_run(tmp_path: Path) -> None:
    run = "docs/results/lm_gap/runs/complete-lagged-m1/stage1/lr2e-3"
    mb = f"{Source(ROOT).run(run, 'comm/bytes_per_step') / 1e6:.3g}"
    page = copy_page(tmp_path, "docs/results/lm_gap/README.md")
    old = f"`m` shared | 2e-3 | {Source(ROOT).run(run):.3f} | {mb} MB |"
    edit_once(page, old, old.replace(f"{mb} MB", "1.68 MB"))
    problems = check(tmp_path, data_root=ROOT)
    assert len(problems) == 1, problems
    assert "column '`comm/bytes_per_step`'" in problems[0]
    assert problems[0].endswith(f"but {run}/summary.json gives '{mb}'")


def test_a_span_shown_as_code_is_not_a_figure(tmp_path: Path) -> None:
    _page(tmp_path, "Write a figure as `<!-- v:ID --><!-- /v -->`, then run `--write`.")
    assert check(tmp_path) == []
