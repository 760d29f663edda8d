"""The sharded-replica and elastic-host views and spans: computed from their rows, and a
drifted figure on their pages fails naming page, figure and file."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from experiments.report.check_docs import check
from experiments.report.doc_data import Source
from experiments.report.doc_views_hosts import MEMORY, STUDY, peak_mb
from tests.support.doc_pages import copy_page, edit_once, edit_span

ROOT = Path(__file__).resolve().parents[3]
SHARDED = "docs/results/sharded/README.md"
ELASTIC = "docs/results/elastic/README.md"
COMPARE_PAGE = "docs/results/elastic/compare/README.md"


def test_a_drifted_memory_cell_names_page_figure_and_file(tmp_path: Path) -> None:
    src = Source(ROOT)
    cell = f"{peak_mb('gossip', 2)(src):.1f} ({peak_mb('gossip', 2, pick=max)(src):.1f})"
    drifted = f"{peak_mb('gossip', 2)(src) + 10:.1f} ({peak_mb('gossip', 2, pick=max)(src):.1f})"
    line = edit_once(copy_page(tmp_path, SHARDED), f"| 2 x 2 | {cell} |", f"| 2 x 2 | {drifted} |")
    assert check(tmp_path, data_root=ROOT) == [
        f"{SHARDED}:{line}: '{drifted}' (row 'gossip between replicas', column "
        f"'peak MB per rank, mean (max)') but {MEMORY} gives '{cell}'"
    ]


def test_a_drifted_ratio_in_the_sharded_prose_names_the_study(tmp_path: Path) -> None:
    page = copy_page(tmp_path, SHARDED)
    figure = "sharded.2x2.ring-vs-hsdp.tokens-s"
    line, written = edit_span(page, figure, "9.9")
    assert check(tmp_path, data_root=ROOT) == [
        f"{SHARDED}:{line}: figure '{figure}' is '9.9' but {STUDY} gives '{written}'"
    ]


def test_the_recovery_pages_rejoin_time_is_tied_to_the_elastic_runs(tmp_path: Path) -> None:
    # the page once said 28 s where the slowest rejoin was 27.49 s; now its runs are the testbed's
    page = copy_page(tmp_path, "docs/recovery.md")
    line, written = edit_span(page, "recovery.testbed.rejoin-s.max", "16")
    problems = check(tmp_path, data_root=ROOT)
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        f"docs/recovery.md:{line}: figure 'recovery.testbed.rejoin-s.max'"
    )
    assert "docs/results/elastic/testbed-ring-kill-at-quorum.json" in problems[0]
    assert problems[0].endswith(f"gives '{written}'") and written == "15"


def test_a_drifted_elastic_cell_names_its_run(tmp_path: Path) -> None:
    page = copy_page(tmp_path, ELASTIC)
    line = edit_once(page, "| `h3` / 830 |", "| `h3` / 800 |")
    problems = check(tmp_path, data_root=ROOT)
    assert problems == [
        f"{ELASTIC}:{line}: '`h3` / 800' (row 'it healed from (its neighbour) / at step', "
        "column '`ring`') but docs/results/elastic/loopback-ring.json, "
        "docs/results/elastic/loopback-one-peer-exp.json gives '`h3` / 830'"
    ]


def _page(root: Path, body: str) -> Path:
    page = root / "docs" / "page.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"# A page\n\n{body}\n<!-- /data -->\n")
    return page


def _write(root: Path, rel: str, data: object) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(json.dumps(data))


def _rank(arm: str | None, shards: int, peak: float, step: float) -> dict:
    row = {"shards": shards, "replicas": 4 // shards, "peak_mb": peak, "step_s": step}
    row |= {"param_bytes": 2**20 * 4 // shards, "optim_bytes": 2**21 * 4 // shards}
    row |= {"comm_bytes": 0 if arm == "hsdp" else 2**20 * 4 // shards}
    return row if arm is None else {**row, "arm": arm}


def test_the_memory_view_takes_mean_max_and_median_over_the_ranks(tmp_path: Path) -> None:
    peaks, steps = [100.0, 130.0, 110.0, 120.0], [1.0, 4.0, 2.0, 3.0]
    rows = [_rank("gossip", 2, p, s) for p, s in zip(peaks, steps, strict=True)]
    rows += [_rank("hsdp", 2, p - 50, s) for p, s in zip(peaks, steps, strict=True)]
    rows += [_rank(None, 1, 200.0, 1.5)] * 4  # a file from before the arms: the wrapper's
    _write(tmp_path, "d/bench.json", {"rows": rows})
    page = _page(tmp_path, "<!-- data: sharded-memory file=d/bench.json -->")
    assert check(tmp_path, write=True) == []
    lines = page.read_text().splitlines()
    mean, top, median = statistics.mean(peaks), max(peaks), statistics.median(steps)
    state = (1 + 2 + 1) * 4 / 2  # MiB: params, AdamW's two states, the gossip buffer, halved
    assert lines[5:8] == [
        "| unsharded wrapper | 1 x 4 | 200.0 (200.0) | 16.0 | 1.50 |",
        f"| gossip between replicas | 2 x 2 | {mean:.1f} ({top:.1f}) | {state:.1f} | {median:.2f} |",
        f"| HSDP | 2 x 2 | {mean - 50:.1f} ({top - 50:.1f}) | {state - 2:.1f} | {median:.2f} |",
    ]


def test_the_testbed_view_bands_the_seeds_and_divides_by_hsdp(tmp_path: Path) -> None:
    def run(arm: str, tps: float, loss: float, comm: float | None) -> dict:
        return {
            "shape": "2x2",
            "arm": arm,
            "tokens": 1000,
            "tokens_per_s": tps,
            "eval_loss": loss,
            "tx_bytes_per_host_per_step": 3e6,
            "comm_bytes_per_step_per_rank": comm,
        }

    rows = [run("allreduce", 500.0, 4.0, None), run("allreduce", 700.0, 4.2, None)]
    rows += [run("ring", 1200.0, 5.0, 1.5e6), run("one-peer-exp", 900.0, 5.5, 1.5e6)]
    _write(tmp_path, "d/study.json", rows)
    page = _page(tmp_path, "<!-- data: sharded-testbed file=d/study.json -->")
    assert check(tmp_path, write=True) == []
    lines = page.read_text().splitlines()
    sd = statistics.stdev([500.0, 700.0])
    assert lines[5:8] == [
        "| 2x2 | gossip, `ring` | 1 | 1,000 | 1,200 | 2.00x | 3.00 | 1.50 | 5.000 |",
        "| 2x2 | gossip, `one-peer-exp` | 1 | 1,000 | 900 | 1.50x | 3.00 | 1.50 | 5.500 |",
        f"| 2x2 | HSDP (`allreduce`) | 2 | 1,000 | 600 ± {sd:,.0f} | 1.00x | 3.00 | - | "
        f"4.100 ± {statistics.stdev([4.0, 4.2]):.3f} |",
    ]
    # a study without its HSDP arm cannot give the ratio: one line, naming the file
    _write(tmp_path, "d/study.json", rows[2:])
    problems = check(tmp_path)
    assert problems == [
        "docs/page.md:3: data block 'sharded-testbed': d/study.json: no run shape=2x2 arm=allreduce"
    ]


def test_the_elastic_view_reads_the_restarted_host_and_refuses_two(tmp_path: Path) -> None:
    host = {"eval/acc_local": 0.5, "steps": 10}
    joiner = {**host, "rejoin_s": 3.25, "healed_from": "h0", "healed_to_step": 7}
    fault = {"hosts": {"h0": host, "h1": joiner}, "survivor_gap_s": 1.04}
    fault |= {"survivor_steps_lost": 2, "rejoin_s": 3.25}
    data = {"args": {"topology": "ring", "kill_step": "4"}, "fault": fault}
    _write(tmp_path, "docs/results/elastic/x.json", data)
    page = _page(tmp_path, "<!-- data: elastic runs=x -->")
    assert check(tmp_path, write=True) == []
    assert page.read_text().splitlines()[4:10] == [
        "|---|---:|",
        "| longest wait between two steps of a survivor | 1.0 s |",
        "| steps a survivor lost | 2 |",
        "| seconds from the restart to the restarted host's first step | 3.2 s |",
        "| it healed from (its neighbour) / at step | `h0` / 7 |",
        "| `eval/acc_local` at the end, every host (with the fault) | 0.5000 |",
    ]
    fault["hosts"]["h0"] = joiner
    _write(tmp_path, "docs/results/elastic/x.json", data)
    assert check(tmp_path) == [
        "docs/page.md:3: data block 'elastic': docs/results/elastic/x.json: "
        "not exactly one restarted host"
    ]


def test_a_drifted_figure_in_the_elastic_prose_names_its_runs(tmp_path: Path) -> None:
    page = copy_page(tmp_path, ELASTIC)
    line, written = edit_span(page, "elastic.loopback.rejoin-s.max", "28")
    assert check(tmp_path, data_root=ROOT) == [
        f"{ELASTIC}:{line}: figure 'elastic.loopback.rejoin-s.max' is '28' but "
        "docs/results/elastic/loopback-ring.json, docs/results/elastic/loopback-one-peer-exp.json "
        f"gives '{written}'"
    ]


def test_a_drifted_figure_in_the_compare_prose_names_its_runs(tmp_path: Path) -> None:
    page = copy_page(tmp_path, COMPARE_PAGE)
    figure = "elastic.compare.digits.gossip.between-quorums"
    line, written = edit_span(page, figure, "5")
    (problem,) = check(tmp_path, data_root=ROOT)
    assert problem.startswith(f"{COMPARE_PAGE}:{line}: figure '{figure}' is '5' but ")
    assert "docs/results/elastic/compare/digits-gossip-ring-s0-fault.json" in problem
    assert problem.endswith(f"gives '{written}'")


def test_a_drifted_glance_row_names_the_elastic_runs(tmp_path: Path) -> None:
    page = copy_page(tmp_path, "README.md")
    line = edit_once(page, "the survivors lost **0** steps", "the survivors lost **1** steps")
    problems = check(tmp_path, data_root=ROOT)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"README.md:{line}: '") and "column 'measured'" in problems[0]
    assert "docs/results/elastic/testbed-ring-kill-mid-interval.json" in problems[0]
    assert "docs/results/sharded/study.json" in problems[0]


def _compare_run(root: Path, method: str, seed: int, fault: bool, **fields) -> None:
    kind = "fault" if fault else "clean"
    path = root / "docs/results/elastic/compare" / f"digits-{method}-s{seed}-{kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"method": method, "steps": 100, **fields}))


def test_the_compare_view_bands_seeds_and_says_where_the_survivors_crashed(tmp_path: Path):
    from experiments.report.doc_views_hosts import elastic_compare

    def hosts(acc: float, steps: int = 100, lost: bool = False) -> dict:
        survivor = {"steps": steps, "eval/acc_local": acc, "gap_s": 2.0, "step_at_kill": 30}
        return {"h0": survivor, "h2": {"steps": 100, "eval/acc_local": acc, "rejoin_s": 9.0}}

    for seed, (acc, gap) in enumerate([(0.90, 2.0), (0.96, 4.0)]):
        _compare_run(
            tmp_path, "gossip-ring", seed, True, hosts=hosts(acc), survivor_gap_s=gap,
            survivor_steps_lost=0, rejoin_s=10.0 + seed, wall_s=50.0,
        )  # fmt: skip
        _compare_run(tmp_path, "gossip-ring", seed, False, hosts=hosts(acc - 0.1), wall_s=40.0)
    _compare_run(tmp_path, "torchft-ddp", 0, True, hosts=hosts(0.5, steps=None), wall_s=9.0)
    _compare_run(tmp_path, "torchft-ddp", 0, False, hosts=hosts(0.97), wall_s=30.0)
    table = elastic_compare(
        Source(tmp_path), "digits", "gossip-ring,torchft-ddp", "0,1,2", "eval/acc_local"
    )
    ring, ddp = table.splitlines()[2:4]
    cells = [c.strip() for c in ring.strip("|").split("|")]
    assert cells[1:] == [
        "2 / 2",
        "3.0 (2.0 to 4.0)",
        "0",
        "10.5 (10.0 to 11.0)",
        f"{statistics.mean([0.90, 0.96]):.4f} (0.9000 to 0.9600)",
        f"{statistics.mean([0.80, 0.86]):.4f} (0.8000 to 0.8600)",
        "50 / 40",
        "–",  # runs from before their throughput was kept
    ]
    cells = [c.strip() for c in ddp.strip("|").split("|")]
    assert cells[1:] == [
        "1 / 1", "crashed", "all after step 30", "–", "–", "0.9700", "– / 30", "–"
    ]  # fmt: skip


def test_the_cost_view_is_the_slowest_hosts_mean_and_the_median_ratio(tmp_path: Path) -> None:
    from experiments.bench.elastic_cost import summarize
    from experiments.report.doc_views_hosts import cost_steps, elastic_cost

    records = [
        {"arm": arm, "rep": rep, "host": h, "step_s": [9.0, base * (1 + h), base * (1 + h)]}
        for rep, (w, e) in enumerate([(1.0, 1.5), (1.0, 1.2), (2.0, 2.2)])
        for arm, base in (("wrapper", w), ("elastic", e))
        for h in (0, 1)
    ]
    args = {"hosts": "2", "mb": "8.0", "quorum_every": "20", "warmup": "1"}
    run = {"args": args, "load_avg_1m": 1.0, **summarize(records, 1), "records": records}
    _write(tmp_path, "docs/results/elastic/cost-1gbit.json", run)
    row = elastic_cost(Source(tmp_path), "1gbit").splitlines()[2]
    assert row == (
        "| 1gbit | 2 hosts, 8 MiB, quorum every 20 | 2000.0 | 3000.0 | **1.20x** (1.10 to 1.50) | 3 |"
    )
    assert cost_steps("1gbit", "elastic", max)(Source(tmp_path)) == 3.0  # 3.0, 2.4, 4.4
