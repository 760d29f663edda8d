"""The decent-dp paper's experiment scripts' uses of the wrapper, and a script in their style.

The scripts read ``model._optims`` and ``model._lr_schedulers`` (per-bucket
lists, empty before the first backward) to log the learning rate and to save
checkpoints. ``legacy_paper_script.py`` does what they do and is launched here
by two real ``torchrun`` agents, two "nodes" of two processes each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import torch

from decent_dp import DecentralizedDataParallel
from tests.support.ddp_cases import flat, make_model, train_steps, train_worker, wrap
from tests.support.dist_harness import free_port, ok_values, run_distributed
from tests.support.launch import ROOT, clean_env

SCRIPT = ROOT / "tests" / "decent_dp" / "legacy_paper_script.py"

# what the script must have checked on its way, named as it names them
REQUIRED_CHECKS = [
    "lists empty before backward",
    "one optimizer and one scheduler per bucket after a backward",
    "the scheduler's last LR is the optimizer's",
    "every bucket is on the same step of the schedule",
    "identical models after global_avg()",
    "the lists survive global_avg()",
    "a fresh wrapper's lists are empty until its first backward",
    "the resumed run repeats the uninterrupted one bit for bit",
    "the resumed run logs the same LRs and losses",
    "the resumed scaler has the same scale",
    "the training loss decreases",
    "the evaluation loss decreases",
]


def _two_nodes(port: int, timeout: float) -> list[subprocess.CompletedProcess]:
    """Two torchrun agents on this machine, node ranks 0 and 1, 2 processes each."""
    env = clean_env(PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=2",
                f"--node_rank={node}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                str(SCRIPT),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return done


@pytest.mark.slow  # a whole run on 2 nodes; the fast suite runs the 0.2.x script under torchrun (test_compat)
def test_paper_style_script_under_torchrun_two_nodes_of_two() -> None:
    node0, node1 = _two_nodes(free_port(), timeout=240)
    for proc in (node0, node1):
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in node0.stdout.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line[len("RESULT ") :])
    assert r["world_size"] == 4
    # (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, node) of every rank: local ranks differ from ranks
    assert r["where"] == [[0, 0, 2, 0], [1, 1, 2, 0], [2, 0, 2, 1], [3, 1, 2, 1]]
    missing = [c for c in REQUIRED_CHECKS if c not in r["checks"]]
    assert not missing, missing
    # the LR of each of the 16 steps of both runs was checked against its schedule's formula
    for style in ("gpt2", "transformer"):
        lr_checks = [c for c in r["checks"] if c.startswith("LR after step ") and style in c]
        assert len(lr_checks) == 16, lr_checks
    ring, complete = r["runs"]
    assert (ring["topology"], ring["style"], ring["amp"]) == ("alternating-exp-ring", "gpt2", False)
    assert (complete["topology"], complete["style"], complete["amp"]) == (
        "complete",
        "transformer",
        True,
    )
    assert ring["buckets"] == 1 and complete["buckets"] > 1
    for run in (ring, complete):
        assert run["last_loss"] < run["first_loss"] - 0.2
        assert run["last_eval"] < run["first_eval"]
        assert len(run["lrs"]) == 16 and max(run["lrs"]) == pytest.approx(1e-2)
    # cosine down to eta_min; inverse square root after 3 warm-up steps
    assert ring["lrs"][-1] == pytest.approx(1e-4)
    assert complete["lrs"][-1] == pytest.approx(1e-2 * (3 / 17) ** 0.5)
    assert ring["scale"] is None and complete["scale"] > 0


# ------------------------------------------------------- the lists in-process
def lists_worker(rank: int, world: int, sched: bool) -> dict[str, Any]:
    cfg = {"topology": "ring", "sched": sched, "bucket_mb": 0}
    ddp = wrap(make_model("mlp", seed=rank), cfg)
    out: dict[str, Any] = {"before": (list(ddp._optims), list(ddp._lr_schedulers))}
    lrs = []
    for t in range(1, 4):
        train_steps(ddp, rank, cfg, t, t)
        scheds = ddp._lr_schedulers
        assert len(ddp._optims) == len(ddp.buckets_info) == len(scheds)
        assert all(o is b.optimizer for o, b in zip(ddp._optims, ddp._buckets))
        lrs.append(
            (
                scheds[0].get_last_lr()[0] if scheds[0] is not None else None,
                ddp._optims[0].param_groups[0]["lr"],
                ddp.current_lr(),
            )
        )
    kept = list(ddp._optims)
    ddp.global_avg()
    out["kept"] = all(a is b for a, b in zip(kept, ddp._optims)) and len(kept) == len(ddp._optims)
    out["n"] = len(kept)
    out["nones"] = sum(s is None for s in ddp._lr_schedulers)
    out["lrs"] = lrs
    ddp.close()
    return out


@pytest.mark.parametrize("sched", [True, False])
def test_lists_empty_before_backward_then_one_per_bucket(sched: bool) -> None:
    for v in ok_values(run_distributed(lists_worker, 2, sched)):
        assert v["before"] == ([], [])
        assert v["n"] > 1 and v["kept"]
        assert v["nones"] == (0 if sched else v["n"])
        for t, (from_sched, from_optim, current) in enumerate(v["lrs"], start=1):
            expected = 0.05 * 0.9**t if sched else 0.05  # make_sched: LambdaLR(0.9**step)
            assert from_optim == pytest.approx(expected, rel=1e-12) and current == from_optim
            assert from_sched == (from_optim if sched else None)


def list_resume_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Save through the lists after step k; load into a wrapper that has buckets already."""
    first = wrap(make_model("mlp", seed=rank), cfg)
    train_steps(first, rank, cfg, 1, cfg["resume_at"])
    saved = {
        "model": first.state_dict(),
        "optimizers": [o.state_dict() for o in first._optims],
        "lr_schedulers": [s.state_dict() for s in first._lr_schedulers if s is not None],
        "step": first.step_count,
    }
    first.close()
    second = wrap(make_model("mlp", seed=rank + 10), cfg)
    train_steps(second, rank, cfg, 7, 7)  # some other step: the buckets exist, the state differs
    second.load_state_dict(saved["model"])
    second.load_bucket_states(saved["optimizers"], saved["lr_schedulers"], saved["step"])
    train_steps(second, rank, cfg, cfg["resume_at"] + 1, cfg["steps"])
    return {"params": flat(second.module), "step": second.step_count}


def test_states_saved_through_the_lists_resume_exactly() -> None:
    cfg = {"topology": "one-peer-exp", "steps": 6, "resume_at": 3, "optim": "adam", "sched": True}
    straight = ok_values(run_distributed(train_worker, 4, cfg))
    resumed = ok_values(run_distributed(list_resume_worker, 4, cfg))
    for a, b in zip(straight, resumed):
        assert b["step"] == 6
        assert torch.equal(a["params"], b["params"])


def bad_load_worker(rank: int, world: int) -> list[str]:
    ddp = DecentralizedDataParallel(
        make_model("mlp", 0), lambda pairs: torch.optim.SGD([p for p, _ in pairs], lr=0.1)
    )
    msgs = []
    for args in (([], [], -1), ([], [], 0)):
        if args[2] == 0:
            train_steps(ddp, rank, {"topology": "complete"}, 1, 1)
        try:
            ddp.load_bucket_states(*args)
        except ValueError as exc:
            msgs.append(str(exc))
    ddp.close()
    return msgs


def test_bucket_states_that_do_not_fit_are_rejected() -> None:
    (msgs,) = ok_values(run_distributed(bad_load_worker, 1))
    assert len(msgs) == 2
    assert "step=-1" in msgs[0]
    assert "0 saved optimizer states for 1 buckets" in msgs[1] and "bucket_size_in_mb" in msgs[1]
    assert not any("\n" in m for m in msgs)
