"""End-to-end tests of train.py and experiments/train/run.py on CPU (gloo).

Its pieces without a training run (``validate``, ``config_hash``, SLURM's variables,
the metrics sinks) are tested in ``test_run_pieces.py``.

In-process runs use world size 1 (``run(cfg)`` sets up a one-process group);
the multi-rank paths run ``torchrun --standalone`` subprocesses, as a user would.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.train.run import (
    run,
)
from tests.support.launch import compose_config, launch, torchrun
from tests.support.train_jobs import train_job

QUICK = ["logger=none", "log.progress=false", "log.every=4", "log.consensus_every=4"]
TRAIN_KEYS = {
    "step",
    "epoch",
    "time_s",
    "train/loss",
    "train/acc",
    "train/lr",
    "perf/samples_per_s",
    "perf/step_s",
    "consensus/distance_sketch",
}
SUMMARY_KEYS = {
    "topology",
    "world_size",
    "train/steps",
    "eval/acc",
    "eval/acc_local",
    "perf/samples_per_s",
    "consensus/distance",
    "wall_time_s",
    "dataset",
    "model",
    "optim",
    "network",
    "emulated",
    "synthetic",
    "restarts",
    "resumed_from_step",
    "seed",
}


def _cfg(*overrides: str):
    return compose_config(*QUICK, *overrides)


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-4000:]


# ---------------------------------------------------------------- in-process, world size 1


@pytest.mark.parametrize("topology", ["one-peer-exp", "allreduce"])
def test_run_in_process(topology, tmp_path, world_of_one):
    cfg = _cfg(f"topology={topology}", "train.max_steps=12")
    summary = run(cfg, run_dir=tmp_path)
    assert set(summary) >= SUMMARY_KEYS
    assert summary["topology"] == topology and summary["world_size"] == 1
    assert summary["train/steps"] == 12 and summary["resumed_from_step"] is None
    assert 0.0 <= summary["eval/acc"] <= 1.0 and summary["eval/acc"] == summary["eval/acc_local"]
    assert (
        summary["network"] == "none"
        and summary["emulated"] is False
        and summary["synthetic"] is False
    )
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    lines = _lines(tmp_path)
    train = [line for line in lines if "train/loss" in line]
    assert [line["step"] for line in train] == [4, 8, 12]
    assert all(set(line) >= TRAIN_KEYS for line in train)
    evals = [line for line in lines if "eval/acc" in line]
    assert evals[-1]["step"] == 12 and evals[-1]["eval/acc"] == summary["eval/acc"]
    # exact at every consensus_every step, and on the evaluation line (step 12) instead of the
    # train line; one worker is always in consensus, and allreduce logs 0.0 by construction
    exact = [
        (line["step"], line["consensus/distance"]) for line in lines if "consensus/distance" in line
    ]
    assert exact == [(4, 0.0), (8, 0.0), (12, 0.0)]
    assert "consensus/distance" in evals[-1] and "consensus/distance" not in train[-1]
    assert [line["consensus/distance_sketch"] for line in train] == [0.0, 0.0, 0.0]
    assert summary["consensus/distance"] == 0.0
    if topology == "allreduce":
        assert not any("comm/wait_s" in line for line in lines)
    else:
        assert all("comm/wait_s" in line for line in train)


def test_nan_policy_error_names_step_and_rank(tmp_path, world_of_one):
    cfg = _cfg("scheduler=constant", "optim.lr=1e12", "optim.momentum=0", "train.max_steps=40")
    with pytest.raises(FloatingPointError) as info:
        run(cfg, run_dir=tmp_path)
    assert "at step" in str(info.value) and "on rank 0" in str(info.value)


def _loss_scaling_on_cpu(monkeypatch, overflow_step: int | None) -> None:
    """fp16-style loss scaling on the CPU: a GradScaler("cpu") without autocast.

    With ``overflow_step``, the gradient of the first parameter becomes inf/NaN at that
    step (1-based), as an fp16 overflow would make it.
    """
    from experiments.train import step as step_module

    monkeypatch.setattr(
        step_module,
        "amp_setup",
        lambda amp, device: (None, torch.amp.GradScaler("cpu", init_scale=2.0**10)),
    )
    if overflow_step is None:
        return
    init = step_module.TrainStep.__init__

    def init_and_overflow(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        backwards = [0]  # a fresh run: the n-th backward is step n

        def overflow(grad: torch.Tensor) -> torch.Tensor:
            backwards[0] += 1
            return grad * math.inf if backwards[0] == overflow_step else grad

        self.params[0].register_hook(overflow)

    monkeypatch.setattr(step_module.TrainStep, "__init__", init_and_overflow)


def test_fp16_overflow_holds_the_schedule_back_in_wrapper_and_allreduce(
    tmp_path, world_of_one, monkeypatch
):
    # cosine warm-up: the LR changes at every step, so a held-back schedule shows
    common = ["train.max_steps=6", "log.every=1", "log.consensus_every=0"]
    lrs, losses = {}, {}
    for name, topology in (("allreduce", "allreduce"), ("wrapper", "one-peer-exp")):
        _loss_scaling_on_cpu(monkeypatch, overflow_step=3)
        summary = run(_cfg(f"topology={topology}", *common), run_dir=tmp_path / name)
        assert summary["train/steps"] == 6
        train = [line for line in _lines(tmp_path / name) if "train/lr" in line]
        assert [line["step"] for line in train] == [1, 2, 3, 4, 5, 6]
        lrs[name] = [line["train/lr"] for line in train]
        losses[name] = [line["train/loss"] for line in train]
    # the LR logged after a step is the one the next step uses: it rises at every step of
    # the warm-up except step 3, which skipped its scheduler step
    rises = [b > a for a, b in zip(lrs["allreduce"], lrs["allreduce"][1:])]
    assert rises == [True, False, True, True, True]
    assert lrs["wrapper"] == pytest.approx(lrs["allreduce"], rel=1e-12)
    # both skipped the optimizer step too (an inf gradient applied would end in NaN losses)
    assert losses["wrapper"] == pytest.approx(losses["allreduce"], rel=1e-4)


@pytest.mark.parametrize("topology", ["one-peer-exp", "allreduce"])
def test_resume_in_process_matches_straight_run(topology, tmp_path, world_of_one):
    # 11 steps per epoch: the interrupted run stops mid-epoch 0, the resumed one crosses epoch 1
    common = [
        f"topology={topology}",
        "train.batch_size=128",
        "scheduler=step",
        "scheduler.step_size_epochs=0.5",
        "checkpoint.every_steps=3",
    ]
    straight = run(_cfg(*common, "train.max_steps=16"), run_dir=tmp_path / "a")
    first = run(_cfg(*common, "train.max_steps=7"), run_dir=tmp_path / "b")
    assert first["train/steps"] == 7
    resumed = run(_cfg(*common, "train.max_steps=16"), run_dir=tmp_path / "b")
    assert resumed["resumed_from_step"] == 7 and resumed["train/steps"] == 16
    for key in ("eval/acc", "eval/acc_local", "eval/loss", "train/loss"):
        assert resumed[key] == straight[key], key
    _assert_same_final_params(tmp_path / "a", tmp_path / "b", world_size=1)
    # the resumed run's metrics continue the interrupted file (the stop at 7 added a line)
    steps = [line["step"] for line in _lines(tmp_path / "b") if "train/loss" in line]
    assert steps == [4, 7, 8, 12, 16]


def test_resume_with_another_topology_needs_allow_reshard(tmp_path, world_of_one):
    common = ["train.batch_size=128", "checkpoint.every_steps=4", "train.max_steps=4"]
    run(_cfg("topology=ring", *common), run_dir=tmp_path)
    with pytest.raises(ValueError, match="allow_reshard"):
        run(_cfg("topology=complete", *common), run_dir=tmp_path)
    summary = run(
        _cfg("topology=complete", *common, "checkpoint.allow_reshard=true"), run_dir=tmp_path
    )
    # restarted from the average of the ring checkpoint, with a fresh schedule
    assert summary["resumed_from_step"] == 4 and summary["train/steps"] == 4
    assert summary["topology"] == "complete"


def _assert_same_final_params(a: Path, b: Path, world_size: int) -> None:
    from experiments.train.checkpoint import latest_checkpoint, load_shard

    info_a, info_b = latest_checkpoint(a / "checkpoints"), latest_checkpoint(b / "checkpoints")
    assert info_a is not None and info_b is not None and info_a.step == info_b.step
    for rank in range(world_size):
        sa, sb = load_shard(info_a, rank)["model"], load_shard(info_b, rank)["model"]
        assert sa.keys() == sb.keys()
        for key in sa:
            assert torch.equal(sa[key], sb[key]), f"rank {rank} {key}"


# ---------------------------------------------------------------- subprocesses


@pytest.mark.slow
def test_bad_batch_size_exits_with_one_line(tmp_path):
    args = ["train.batch_size=0", "logger=none", f"hydra.run.dir={tmp_path}"]
    proc = launch([sys.executable, "train.py", *args], timeout=120)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error")]
    assert errors == [
        "train.py: error on rank 0: ConfigError: train.batch_size=0 is invalid; it must be an integer > 0"
    ]
    # stopped by the config check, before any data, model or metrics file
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()


# the default log.consensus_every (50): a 30-step run must log consensus distances anyway
RING = [
    "log.progress=false",
    "log.every=4",
    "topology=ring",
    "scheduler=step",
    "scheduler.step_size_epochs=0.5",
    "checkpoint.every_steps=8",
]
RESUME_COMMON = [*RING, "logger=none"]


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory) -> Path:
    """A straight 30-step ring run on 2 ranks (22 steps per epoch), checkpointing every 8.

    wandb runs offline into the run directory.
    """
    run_dir = tmp_path_factory.mktemp("ring") / "a"
    args = [*RING, "logger=wandb", "train.max_steps=30", f"hydra.run.dir={run_dir}"]
    _check_ok(torchrun(2, *args, timeout=240))  # wandb's service adds to the start-up
    return run_dir


def _wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of the offline wandb run in ``run_dir``, read from its ``.wandb`` file.

    The file is a LevelDB-style log (a 7-byte header, then records of checksum, length and
    type in 32 KiB blocks) of ``wandb_internal_pb2.Record`` messages.
    """
    import struct

    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    payloads, pos, block, partial = [], 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the rest of a block is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:  # full
            payloads.append(chunk)
        elif kind == 2:  # first
            partial = chunk
        elif kind == 3:  # middle
            partial += chunk
        elif kind == 4:  # last
            payloads.append(partial + chunk)
    rows = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


@pytest.mark.slow
def test_torchrun_two_ranks_writes_metrics_and_summary(ring_run):
    summary = json.loads((ring_run / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert summary["world_size"] == 2 and summary["topology"] == "ring"
    assert summary["train/steps"] == 30 and summary["restarts"] == 0
    assert summary["resumed_from_step"] is None and 0.5 < summary["eval/acc"] <= 1.0
    lines = _lines(ring_run)
    assert all({"step", "epoch", "time_s"} <= set(line) for line in lines)
    train = [line for line in lines if "train/loss" in line]
    assert [line["step"] for line in train] == [4, 8, 12, 16, 20, 24, 28, 30]
    assert all(set(line) >= TRAIN_KEYS | {"comm/wait_s"} for line in train)
    assert math.isclose(train[-1]["epoch"], 30 / 22)
    # consensus_every=50 never fires: the exact value comes with each evaluation
    exact = {
        line["step"]: line["consensus/distance"] for line in lines if "consensus/distance" in line
    }
    assert list(exact) == [22, 30] and all(v > 0 for v in exact.values())
    sketch = {line["step"]: line["consensus/distance_sketch"] for line in train}
    assert all(v > 0 for v in sketch.values())
    # unbiased, with a relative standard error of at most sqrt(2/1024) = 4.4%
    assert abs(sketch[30] - exact[30]) <= 0.3 * exact[30]
    assert math.isclose(summary["consensus/distance"], _mean(lines, "consensus/distance"))
    # evaluated at the end of epoch 1 (step 22) and at the end
    assert [line["step"] for line in lines if "eval/acc" in line] == [22, 30]
    assert summary["eval/acc"] == [line for line in lines if "eval/acc" in line][-1]["eval/acc"]


@pytest.mark.slow
def test_torchrun_two_ranks_resume_matches_straight_run(ring_run, tmp_path):
    straight = json.loads((ring_run / "summary.json").read_text())
    _check_ok(torchrun(2, *RESUME_COMMON, "train.max_steps=16", f"hydra.run.dir={tmp_path}"))
    _check_ok(torchrun(2, *RESUME_COMMON, "train.max_steps=30", f"hydra.run.dir={tmp_path}"))
    resumed = json.loads((tmp_path / "summary.json").read_text())
    assert resumed["resumed_from_step"] == 16 and resumed["train/steps"] == 30
    for key in ("eval/acc", "eval/acc_local", "eval/loss", "train/loss"):
        assert resumed[key] == straight[key], key
    _assert_same_final_params(ring_run, tmp_path, world_size=2)


@pytest.mark.slow
def test_torchrun_short_run_logs_consensus_to_wandb_too(ring_run):
    rows = _wandb_history(ring_run)
    exact = {r["_step"]: r["consensus/distance"] for r in rows if "consensus/distance" in r}
    sketch = {
        r["_step"]: r["consensus/distance_sketch"] for r in rows if "consensus/distance_sketch" in r
    }
    lines = _lines(ring_run)
    assert exact == {
        line["step"]: line["consensus/distance"] for line in lines if "consensus/distance" in line
    }
    assert sketch == {
        line["step"]: line["consensus/distance_sketch"]
        for line in lines
        if "consensus/distance_sketch" in line
    }
    assert sorted(exact) == [22, 30] and sorted(sketch) == [4, 8, 12, 16, 20, 24, 28, 30]


def _mean(lines: list[dict], key: str) -> float:
    values = [line[key] for line in lines if key in line]
    return sum(values) / len(values)


@pytest.mark.slow
def test_torchrun_multirun_skips_a_bad_job_and_runs_the_others(tmp_path):
    sweep = tmp_path / "sweep"
    # alternating-exp-ring needs two nodes: every rank rejects it before communicating,
    # prints nothing but rank 0's one line, and the sweep goes on; the exit status says it failed
    proc = train_job(
        2,
        sweep,
        "topology=ring,alternating-exp-ring,allreduce",
        "train.max_steps=12",
        "log.progress=false",
        "log.every=4",
        "logger=wandb",
        "dataset.partition=dirichlet",
        sweep=True,
        status=1,
        timeout=180,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error")]
    assert len(errors) == 1
    assert "ConfigError: topology=alternating-exp-ring with world size 2" in errors[0]
    assert not (sweep / "1" / "summary.json").exists()
    for job, topology in ((0, "ring"), (2, "allreduce")):
        job_dir = sweep / str(job)
        summary = json.loads((job_dir / "summary.json").read_text())
        assert summary["topology"] == topology and summary["world_size"] == 2
        assert summary["train/steps"] == 12
        assert (job_dir / ".hydra" / "config.yaml").is_file()
        assert any((job_dir / "wandb").glob("offline-run-*"))
        assert [line["step"] for line in _lines(job_dir) if "train/loss" in line] == [4, 8, 12]
    # a non-IID split logs every worker's class counts once, before training
    hists = [line for line in _lines(sweep / "0") if "data/class_histogram" in line]
    assert len(hists) == 1 and hists[0]["step"] == 0
    counts = hists[0]["data/class_histogram"]
    assert len(counts) == 2 and all(len(c) == 10 for c in counts)
    assert sum(map(sum, counts)) == 1437  # every digits training image is on some worker
    # the report reads this real sweep
    from experiments.report import build_report

    report = build_report([sweep], target_acc=0.5, out=tmp_path / "report")
    text = report.read_text()
    assert "| ring |" in text and "| allreduce |" in text
    for png in ("consensus_vs_step.png", "loss_vs_time.png", "acc_vs_epoch.png", "throughput.png"):
        assert (tmp_path / "report" / png).stat().st_size > 1000


def test_a_diverged_run_leaves_its_summary_and_tuning_ranks_it_worst(tmp_path, world_of_one):
    from experiments.report import build_report, tune
    from experiments.report.runs import load_all
    from experiments.train.metrics import host_tag

    common = ["scheduler=constant", "optim.momentum=0", "train.max_steps=12"]
    for lr in ("0.05", "1e12"):  # a rate that trains and one that diverges at once
        overrides = [f"optim.lr={lr}", *common]
        run_dir = tmp_path / "sweep" / lr
        (run_dir / ".hydra").mkdir(parents=True)  # what Hydra writes for the job
        (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        if lr == "0.05":
            assert run(_cfg(*overrides), run_dir=run_dir)["diverged"] is False
            continue
        with pytest.raises(FloatingPointError) as info:
            run(_cfg(*overrides), run_dir=run_dir)
    # the error is the one it always was, and the summary says where the run stopped
    message = str(info.value)
    assert type(info.value) is FloatingPointError and "\n" not in message
    assert message.startswith("non-finite loss at step ") and "on rank 0" in message
    text = (tmp_path / "sweep" / "1e12" / "summary.json").read_text()
    summary = json.loads(text)  # strict JSON: a non-finite value is null
    assert "NaN" not in text and "Infinity" not in text
    step = int(message.split()[4])
    assert summary["diverged"] is True and summary["diverged_step"] == step
    assert summary["train/steps"] >= step and summary["topology"] == "one-peer-exp"
    assert summary["eval/acc"] is None and summary["world_size"] == 1
    assert summary["host"] == host_tag(torch.device("cpu"))  # the machine it ran on
    # the value stays in the grid, as the worst: the best is the rate that trained
    runs, skipped = load_all([tmp_path / "sweep"])
    assert not skipped and len(runs) == 2
    (group,) = tune.tune_runs(runs, "optim.lr")
    assert [v.text for v in group.grid] == ["0.05", "1e12"]
    assert group.best.text == "0.05" and group.grid[1].diverged == 1
    assert group.grid[1].mean == float("-inf") and group.side == "low"
    record = tune.tuned_json([group])
    json.dumps(record, allow_nan=False)
    assert record["groups"][0]["grid"][1]["diverged"] == 1
    # the report lists the diverged run instead of averaging an old evaluation into a table
    report = build_report([tmp_path / "sweep"], out=tmp_path / "report", tune="optim.lr")
    text = report.read_text()
    assert "1 run(s) in 1 configuration(s)" in text and "0 skipped, 1 diverged" in text
    assert f"/1e12`: at step {step}" in text


@pytest.mark.slow  # make test's 5-minute budget
def test_update_norm_is_the_step_of_the_logged_line(tmp_path):
    """Plain SGD under exact averaging of equal models: the step is lr times the gradient."""
    train_job(
        2,
        tmp_path,
        *QUICK,
        "topology=complete",
        "optim=sgd",
        "optim.lr=0.05",
        "optim.momentum=0",
        "optim.weight_decay=0",
        "scheduler=constant",
        "train.max_steps=4",
        "log.every=2",
        "log.update_norm=true",
    )
    norms = [ln["train/update_norm"] for ln in _lines(tmp_path) if "train/update_norm" in ln]
    assert len(norms) == 2 and all(0 < v < 10 for v in norms), norms
