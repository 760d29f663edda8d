"""``engine=packed``: a job's workers in one process, against the same job on real ranks.

The reference is the job itself, run by ``run(cfg)`` on real gloo processes (forked,
one per worker): the packed run must log the same losses, accuracies, consensus
distances and bytes per step, to float32 rounding. The rest: exact resume, the LM
task's token metrics, a Hydra multirun over worker counts, and one-line refusals.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from experiments.report.build import build_report
from experiments.schema import ConfigError
from experiments.train.run import run, validate
from tests.experiments.train.lm_corpus import LM_SUMMARY_KEYS, lm_overrides, write_corpus
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.launch import clean_env, compose_config

JOB = [
    "logger=none",
    "log.progress=false",
    "log.every=4",
    "log.consensus_every=4",
    "train.max_steps=14",  # 22 steps per epoch on 2 workers: lines at 4, 8, 12, 14
    "scheduler=step",
    "scheduler.step_size_epochs=0.5",
    "train.grad_clip_norm=1.0",
]


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _rank_job(rank: int, world: int, overrides: list[str], run_dir: str) -> dict[str, Any]:
    return run(compose_config(*overrides), run_dir=run_dir)


@pytest.mark.parametrize(
    "case",
    [
        ["topology=ring", "optim=adamw", "optim.lr=0.01"],
        # each worker's BatchNorm statistics in the averaged model, on its own test shard
        ["topology=ring", "topology.sync_buffer_in_global_avg=false"],
        pytest.param(["topology=allreduce"], marks=pytest.mark.slow),
    ],
    ids=["ring-adamw", "ring-own-buffers", "allreduce-sgd"],
)
def test_packed_job_logs_what_the_ranks_log(case, tmp_path, world_of_one):
    ranks_dir = tmp_path / "ranks"
    ok_values(run_distributed(_rank_job, 2, [*JOB, *case], str(ranks_dir), timeout=240))
    packed = run(compose_config(*JOB, *case, "engine=packed", "engine.workers=2"), tmp_path / "p")
    assert packed["engine"] == "packed" and packed["world_size"] == 2
    ranks, mine = _lines(ranks_dir), _lines(tmp_path / "p")
    assert [line["step"] for line in mine] == [line["step"] for line in ranks]
    compared = 0
    for a, b in zip(mine, ranks):
        for key in ("train/loss", "train/acc", "eval/acc", "eval/acc_local", "eval/loss"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=2e-5, abs=1e-6), (a["step"], key)
                compared += 1
        if "consensus/distance" in b:
            assert a["consensus/distance"] == pytest.approx(b["consensus/distance"], rel=1e-3)
        for key in ("comm/bytes_per_step", "comm/peak_bytes_per_step", "train/lr"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-12), key
        if "train/loss" in b:  # throughput of every worker, as the ranks' lines count it
            assert a["perf/samples_per_s"] > 0
    assert compared == 4 * 2 + 3  # four training lines, one evaluation
    if case[0] == "topology=ring":
        assert max(line.get("consensus/distance", 0.0) for line in mine) > 0


def test_packed_resume_is_exact(tmp_path, world_of_one):
    common = [*JOB, "topology=one-peer-exp", "optim=adamw", "outer=diloco", "outer.every=4"]
    common += [
        "engine=packed",
        "engine.workers=4",
        "checkpoint.every_steps=3",
        "train.max_steps=10",
    ]
    straight = run(compose_config(*common), tmp_path / "a")
    first = run(compose_config(*[*common, "train.max_steps=7"]), tmp_path / "b")
    assert first["train/steps"] == 7
    resumed = run(compose_config(*common), tmp_path / "b")
    assert resumed["resumed_from_step"] == 7 and resumed["train/steps"] == 10
    for key in ("eval/acc", "eval/acc_local", "eval/loss", "train/loss"):
        assert resumed[key] == straight[key], key
    from experiments.train.checkpoint import latest_checkpoint, load_shard

    a = load_shard(latest_checkpoint(tmp_path / "a" / "checkpoints"), 0)["model"]
    b = load_shard(latest_checkpoint(tmp_path / "b" / "checkpoints"), 0)["model"]
    assert a["workers"] == 4 and a["step"] == 10
    for name in a["params"]:
        assert torch.equal(a["params"][name], b["params"][name]), name
    # the outer rounds' norm is logged, as on the ranks
    assert any("outer/delta_norm" in line for line in _lines(tmp_path / "a"))


def test_packed_language_model_counts_every_workers_tokens(tmp_path, world_of_one):
    root = write_corpus(tmp_path / "corpus")
    overrides = [*lm_overrides(root), "logger=none", "log.progress=false", "train.max_steps=6"]
    packed = ["engine=packed", "engine.workers=3", "topology=ring"]
    summary = run(compose_config(*overrides, *packed), tmp_path / "r")
    assert set(summary) >= LM_SUMMARY_KEYS
    # 6 steps x 3 workers x 8 windows x 16 tokens
    assert summary["tokens"] == 6 * 3 * 8 * 16
    assert summary["eval/loss"] < 3.6 and summary["perf/tokens_per_s"] > 0


def test_packed_averaged_language_model_is_the_trained_one(tmp_path, world_of_one):
    # the GPT ties its embedding and head: the average must fill both names (identical
    # workers under allreduce, so the averaged model is each worker's own)
    root = write_corpus(tmp_path / "corpus")
    overrides = [*lm_overrides(root), "logger=none", "log.progress=false", "train.max_steps=6"]
    packed = ["engine=packed", "engine.workers=2", "topology=allreduce"]
    summary = run(compose_config(*overrides, *packed), tmp_path / "r")
    assert summary["eval/loss"] == pytest.approx(summary["eval/loss_local"], rel=1e-6)


def test_make_report_reads_packed_runs_by_their_worker_count(tmp_path, world_of_one):
    for workers in (2, 4):
        overrides = ["engine=packed", f"engine.workers={workers}", "topology=ring"]
        run(compose_config(*overrides, *JOB, "train.max_steps=3"), tmp_path / f"w{workers}")
    report = build_report(tmp_path).read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ring")]
    assert [r.split("|")[2].strip() for r in rows[:2]] == ["2", "4"]


@pytest.mark.slow  # a Hydra multirun of train.py in a subprocess
def test_packed_multirun_over_workers_and_topologies(tmp_path):
    args = ["engine=packed", "engine.workers=2,4", "topology=complete,ring"]
    args += [
        "train.max_steps=3",
        "logger=none",
        "log.progress=false",
        f"hydra.sweep.dir={tmp_path}",
    ]
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=clean_env(),
        cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/summary.json"))]
    got = sorted((s["world_size"], s["topology"]) for s in summaries)
    assert got == [(2, "complete"), (2, "ring"), (4, "complete"), (4, "ring")]
    assert all(s["engine"] == "packed" for s in summaries)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["compression=int8"], "compression.name=int8 is invalid with engine=packed"),
        (["fault_tolerance=torchft"], "fault_tolerance.name=torchft is invalid with engine=packed"),
        (["train.shard_size=2"], "train.shard_size=2 is invalid with engine=packed"),
        (["train.nan_policy=skip"], "train.nan_policy=skip is invalid with engine=packed"),
        (["train.amp=fp16"], "train.amp=fp16 is invalid with engine=packed"),
        (["network=ethernet_25g"], "network.name=ethernet_25g is invalid with engine=packed"),
        (["optim=adam", "optim.state_sync.exp_avg_sq=1"], "optim.state_sync="),
        (["outer=diloco", "outer.every=4", "outer.fragments=2"], "outer.fragments=2 is invalid"),
        (["engine.workers=0"], "engine.workers=0 is invalid"),
        (["topology=alternating-exp-ring", "topology.local_world_size=4"], "alternating-exp-ring"),
        (["rmsprop"], "builds RMSprop, which packed workers cannot step exactly"),
    ],
)
def test_what_packed_workers_cannot_do_is_refused_in_one_line(overrides, message):
    if overrides == ["rmsprop"]:  # a user's optimizer by _target_, as a config file names it
        cfg = compose_config("engine=packed", "engine.workers=4")
        with open_dict(cfg):
            cfg.optim = OmegaConf.create({"_target_": "torch.optim.RMSprop", "lr": 0.01})
    else:
        cfg = compose_config("engine=packed", "engine.workers=4", *overrides)
    with pytest.raises(ConfigError, match=message) as info:
        validate(cfg, 1)
    assert "\n" not in str(info.value)


def test_packed_needs_one_process_and_distributed_takes_the_world_size():
    with pytest.raises(ConfigError, match="launch it with python train.py"):
        validate(compose_config("engine=packed", "engine.workers=4"), 2)
    with pytest.raises(ConfigError, match="engine.workers=8 is invalid"):
        validate(compose_config("engine.workers=8"), 2)
    validate(compose_config("engine.workers=2"), 2)


def test_outer_average_puts_every_worker_on_the_mean():
    """``outer=average``: at an outer step with no local update, every worker is the mean."""
    from decent_dp.packed import PackedWorkers
    from experiments.train.outer import outer_kwargs

    cfg = compose_config("outer=average", "outer.every=3", "topology=ring")
    kwargs = outer_kwargs(cfg.outer, cfg.topology)
    assert kwargs["outer_every"] == 3
    torch.manual_seed(0)
    packed = PackedWorkers(
        torch.nn.Linear(3, 2),
        4,
        lambda pairs: torch.optim.SGD([p for p, _ in pairs], lr=0.1),
        None,
        "ring",
        outer_optim_fn=kwargs["outer_optim_fn"],
        outer_every=3,
    )
    for _ in range(2):
        packed(torch.randn(4, 5, 3)).square().sum().backward()
        packed.step()
    before = [p.detach().clone() for p in packed.params]
    assert packed.consensus_distance() > 0
    packed.step()  # step 3, no gradient: no local update, only the outer round
    for p, b in zip(packed.params, before):
        torch.testing.assert_close(p, b.mean(0, keepdim=True).expand_as(b), rtol=0, atol=1e-7)
