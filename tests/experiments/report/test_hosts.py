"""Throughput is compared only within one kind of machine: the summary's host tag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from experiments import report
from experiments.report import link_time
from experiments.report.runs import UNKNOWN_HOST, load_all
from experiments.report.tables import HOSTS_DIFFER
from experiments.train.metrics import host_tag
from tests.experiments.report.common import lm_grid, table, vision_grid

A = {"name": "node-a", "cpu": "Xeon 8480", "cores": 112, "gpu": "NVIDIA H100"}
B = {"name": "laptop", "cpu": "Apple M2", "cores": 8, "gpu": None}


def _tag(run_dir: Path, host: dict[str, Any] | None) -> None:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["host"] = host
    path.write_text(json.dumps(summary))


def _rows(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """The configuration table's rows (the first table), by configuration and optimizer."""
    first = text.split("Plots:")[0]
    return {(r["configuration"], r["optim"]): r for r in table(first)}


def test_the_trainer_tags_the_machine() -> None:
    tag = host_tag(torch.device("cpu"))
    assert set(tag) == {"name", "cpu", "cores", "gpu"}
    assert tag["name"] and tag["cpu"] and tag["cores"] >= 1 and tag["gpu"] is None
    json.dumps(tag, allow_nan=False)


def test_untagged_runs_are_one_unknown_host_and_the_report_is_unchanged(tmp_path: Path) -> None:
    lm_grid(tmp_path / "runs")
    runs, _ = load_all([tmp_path / "runs"])
    assert {r.host for r in runs} == {UNKNOWN_HOST}
    before = report.build_report([tmp_path / "runs"], out=tmp_path / "a").read_text()
    for job in range(12):  # every run on the same machine, under another host name each
        _tag(tmp_path / "runs" / str(job), {**A, "name": f"node-{job}"})
    after = report.build_report([tmp_path / "runs"], out=tmp_path / "b").read_text()
    assert HOSTS_DIFFER not in after and "hosts" not in after
    assert after.replace("/b", "/a") == before.replace("/b", "/a")


def test_lm_throughput_cells_that_would_mix_hosts_read_n_a(tmp_path: Path) -> None:
    lm_grid(tmp_path)  # jobs 0-5 allreduce, 6-11 ring; (adamw, accum_adamw) x seeds 0-2
    for job in range(12):
        _tag(tmp_path / str(job), A)
    _tag(tmp_path / "9", B)  # ring, accum_adamw, seed 0: that configuration spans two hosts
    for job in (3, 4, 5):  # allreduce, accum_adamw: all three seeds on the other host
        _tag(tmp_path / str(job), B)
    out = tmp_path / "report"
    text = report.build_report([tmp_path], out=out).read_text()
    rows = _rows(text)
    # one host, its reference on the same one: numbers
    assert rows[("allreduce", "adamw")]["tokens/s"] == "1010 ± 10"
    assert rows[("ring", "adamw")]["tokens/s vs allreduce"] == "1.20x"
    # its own seeds on two hosts: neither the mean nor the ratio
    mixed = rows[("ring", "accum_adamw")]
    assert mixed["tokens/s"] == mixed["tokens/s vs allreduce"] == HOSTS_DIFFER
    # the loss is no throughput: still there
    assert mixed["final eval/loss (nats)"].startswith("3.2")
    # its own seeds on one host (B), the reference ones too: the ratio stands
    assert rows[("allreduce", "accum_adamw")]["tokens/s vs allreduce"] == "1.00x"
    lines = [line for line in text.splitlines() if "hosts differ" in line and "|" not in line]
    assert len(lines) == 1 and "2 hosts" in lines[0] and "Apple M2, 8 cores" in lines[0]
    assert "Xeon 8480, 112 cores, NVIDIA H100" in lines[0]
    # the run table keeps each run's own throughput
    runs = table(text.split("## Runs")[1])
    assert len(runs) == 12 and {r["tokens/s"] for r in runs} >= {"1200", "1210", "1220"}


def test_a_speedup_against_an_allreduce_of_another_host_reads_n_a(tmp_path: Path) -> None:
    vision_grid(tmp_path)  # jobs 0-5 allreduce, 6-11 ring
    for job in range(6):
        _tag(tmp_path / str(job), A)
    for job in range(6, 12):  # ring on another machine; or untagged, which is another too
        _tag(tmp_path / str(job), B if job < 9 else None)
    text = report.build_report([tmp_path], out=tmp_path / "report").read_text()
    rows = _rows(text)
    assert rows[("allreduce", "sgd")]["speedup vs allreduce"] == "1.00x"
    assert rows[("allreduce", "sgd")]["samples/s"] == "1010.0 ± 10.0"
    for optim in ("sgd", "qgm_sgd"):
        ring = rows[("ring", optim)]
        assert ring["speedup vs allreduce"] == HOSTS_DIFFER
        assert ring["samples/s"] == "1510.0 ± 10.0"  # its own seeds share a host
        assert ring["final eval/acc"] != HOSTS_DIFFER
    assert "3 hosts" in text and UNKNOWN_HOST in text


def _run(path: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"topology": "local-sgd", **summary}))


def test_link_time_speedup_only_between_link_runs_of_one_host(tmp_path: Path) -> None:
    for name, step_s, host in [("allreduce-adamw", 2.0, A), ("streaming", 0.5, A),
                               ("slowmo", 0.5, B)]:  # fmt: skip
        _run(tmp_path / name / "final" / "seed0", [{"step": 32, "eval/loss": 4.0}],
             {"eval/loss": 4.0})  # fmt: skip
        _run(tmp_path / "link" / name, [{"step": 16, "perf/step_s": step_s}] * 2,
             {"host": host, "comm/bytes_per_step": 1e6})  # fmt: skip
    arms = link_time.load_arms(tmp_path)
    lines = link_time.table(arms, 4.0)
    cells = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in lines[2:5]}
    assert cells == {"allreduce-adamw": "1.00×", "slowmo": HOSTS_DIFFER, "streaming": "4.00×"}
    assert "2 hosts" in lines[-1] and HOSTS_DIFFER in lines[-1]
    # one host (or none tagged): no line under the table
    same = [a for a in arms if a.name != "slowmo"]
    assert link_time.table(same, 4.0)[-1].startswith("| streaming |")
