"""The packed-workers bench: both arms run small, its rows, and the docs' view of its file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.bench import packed_throughput as bench
from experiments.report.check_docs import render
from experiments.report.doc_data import Source
from experiments.report.doc_views_packed import PACKED


@pytest.mark.slow  # two real launches, one under torchrun: about 18 s
def test_both_arms_run_and_are_measured(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--tasks", "digits", "--workers", "2", "--packed-only", "", "--repeats", "1"]
    args += ["--digits-steps", "4", "--digits-log-every", "2", "--out", str(out)]
    assert bench.main([*args, "--runs-dir", str(tmp_path / "runs")]) == 0
    data = json.loads(out.read_text())
    assert data["machine"]["cores"] >= 1 and data["machine"]["torch"]
    runs = {r["arm"]: r for r in data["runs"]}
    assert sorted(runs) == ["packed", "processes"]
    for arm, run in runs.items():
        assert run["task"] == "digits" and run["workers"] == 2 and run["world_size"] == 2
        assert run["samples_per_s"] > 0 and run["wall_s"] > 0
        assert run["peak_mb"] > 0 and run["anon_peak_mb"] > 0
        assert "train.py" in run["command"] and "hydra.run.dir=" in run["command"]
        assert run["engine"] == ("packed" if arm == "packed" else "distributed")
    # the packed job is one process; torchrun's is its agent and one process per worker
    assert runs["packed"]["processes"] == 1 and "engine.workers=2" in runs["packed"]["command"]
    assert runs["processes"]["processes"] >= 3 and runs["processes"]["agent_mb"] > 0
    assert "--nproc_per_node=2" in runs["processes"]["command"]
    rows = {r["arm"]: r for r in data["rows"]}
    assert rows["packed"]["ratio"] > 0 and "ratio" not in rows["processes"]
    assert out.with_suffix(".png").stat().st_size > 0


def _run(arm: str, repeat: int, sps: float, mb: float) -> dict:
    return {
        "task": "digits",
        "workers": 4,
        "arm": arm,
        "repeat": repeat,
        "samples_per_s": sps,
        "peak_mb": mb,
        "anon_peak_mb": mb / 2,
        "wall_s": 10.0,
    }


def test_ratios_pair_the_runs_measured_back_to_back() -> None:
    runs = [
        _run("packed", 0, 100.0, 1000.0),
        _run("processes", 0, 200.0, 4000.0),
        _run("packed", 1, 300.0, 1000.0),
        _run("processes", 1, 300.0, 2000.0),
        _run("packed", 2, 100.0, 1000.0),
        _run("processes", 2, 400.0, 4000.0),
    ]
    packed, processes = bench.summarize(runs)
    assert (packed["arm"], processes["arm"]) == ("packed", "processes")
    assert packed["samples_per_s"] == 100.0 and processes["samples_per_s"] == 300.0
    assert packed["ratio"] == 0.5  # median of 0.5, 1.0, 0.25: not 100 / 300
    assert packed["memory_ratio"] == 0.25 and processes["peak_mb"] == 4000.0


def test_the_runs_go_in_pairs_with_packed_alone_at_its_counts() -> None:
    args = bench.parse(["--tasks", "digits,gpt", "--workers", "4", "--packed-only", "64"])
    order = list(bench.plan(args))
    assert order[:4] == [
        ("digits", 4, "packed", 0),
        ("digits", 4, "processes", 0),
        ("digits", 4, "packed", 1),
        ("digits", 4, "processes", 1),
    ]
    assert [o for o in order if o[1] == 64] == [
        ("digits", 64, "packed", 0),
        ("digits", 64, "packed", 1),
        ("gpt", 64, "packed", 0),
        ("gpt", 64, "packed", 1),
    ]


def test_the_docs_views_render_a_bench_file(tmp_path: Path) -> None:
    runs = [_run("packed", 0, 95.0, 1200.0), _run("processes", 0, 1900.0, 4800.0)]
    for run in runs:
        run["command"] = f"{run['arm']} command"
        run["load_avg_1m"] = 0.5 if run["arm"] == "packed" else 1.25
    rows = bench.summarize(runs)
    rows.append({**rows[0], "task": "gpt", "workers": 64, "tokens_per_s": 1234.4})
    del rows[-1]["ratio"], rows[-1]["memory_ratio"]
    machine = {"cores": 2, "cpu": "a CPU", "torch": "2.0", "torch_threads": 2, "load_avg": [0.25]}
    data = {"machine": machine, "started": "t0", "finished": "t1", "runs": runs, "rows": rows}
    (tmp_path / PACKED).parent.mkdir(parents=True)
    (tmp_path / PACKED).write_text(json.dumps(data))
    lines = render("packed-bench", {}, Source(tmp_path)).splitlines()
    assert lines[0].startswith("| task | N | arm | samples/s | tokens/s | peak MB (VmHWM) |")
    assert lines[2:] == [
        "| digits | 4 | packed | 95.0 | – | 1,200 | 600 | 10.0 | 0.05x | 0.25x |",
        "| digits | 4 | processes | 1,900 | – | 4,800 | 2,400 | 10.0 | – | – |",
        "| gpt | 64 | packed | 95.0 | 1,234 | 1,200 | 600 | 10.0 | – | – |",
        "",
        "> 2 cores (a CPU), torch 2.0, 2 intra-op threads in the packed process; 1-minute load "
        "average 0.2 at the start, 0.5 to 1.2 as the runs started; t0 to t1",
    ]
    commands = render("packed-commands", {"workers": "4"}, Source(tmp_path))
    assert commands == "```\npacked command\nprocesses command\n```"
