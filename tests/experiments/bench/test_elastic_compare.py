"""The fault comparison's harness: its measures on lines the test writes, and the torchft clients.

The quick tests feed :func:`experiments.bench.elastic_faults.measure`,
:func:`experiments.bench.elastic_compare.measure_restart` and
:class:`experiments.bench.elastic_faults.Tail` metrics lines written here, with
known pauses, resumes and heals. The slow ones run the two torchft clients
(``DDP`` and ``DiLoCo``) as two processes each on a lighthouse in a process of
its own, so that torchft stays out of pytest's process (tests/support/elastic_cases.py).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.bench import elastic_compare as ec
from experiments.bench import elastic_faults as ef

ROOT = Path(__file__).resolve().parents[3]


def _timed(step: int, t: float, loss: float = 1.0) -> dict:
    return {"step": step, "time": t, "train/loss": loss}


def test_tail_keeps_lines_a_resume_drops_and_waits_for_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = ef.Tail(path, stamp=True)
    assert tail.poll() == []  # no file yet
    lines = [{"step": s, "train/loss": 0.5} for s in range(1, 6)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 6, "tr')
    seen = tail.poll()
    assert [x["step"] for x in seen] == [1, 2, 3, 4, 5]  # the half-written line waits
    assert all("time" in x for x in seen)  # stamped with the time they were read
    # the resume rewrites the file without steps 4, 5 (after the checkpoint of step 3)
    kept = lines[:3] + [{"step": 4, "train/loss": 0.25}]
    path.write_text("".join(json.dumps(x) + "\n" for x in kept))
    seen = tail.poll()
    assert [x["step"] for x in seen] == [1, 2, 3, 4, 5, 4]
    assert seen[-1]["train/loss"] == 0.25 and ef.last_step(seen) == 5


def test_measure_reads_the_survivors_pause_steps_and_the_joiners_heal() -> None:
    t_kill, t_restart = 100.0, 105.0
    steps = 20
    survivor = [_timed(s, 90.0 + s) for s in range(1, 11)]  # step 10 at 100 s
    # a pause of 7 s, then every step to the end
    survivor += [_timed(s, 107.0 + (s - 11)) for s in range(11, steps + 1)]
    gappy = survivor[:-3] + survivor[-2:]  # a survivor that skipped step 18
    victim = [_timed(s, 90.0 + s) for s in range(1, 10)]
    # restarted: a step of its own (before healing), the heal to step 15, then on
    victim += [_timed(1, 109.0), {"step": 15, "elastic/change": {"healed": True, "step": 15}}]
    victim += [_timed(s, 111.5 + (s - 16)) for s in range(16, steps + 1)]
    summaries = {
        "h0": {"steps": steps, "eval/acc_local": 0.9},
        "h1": {"steps": steps - 1, "eval/acc_local": 0.8},
        "h2": {"steps": steps, "eval/acc_local": 0.9},
    }
    r = ef.measure(
        {"h0": survivor, "h1": gappy, "h2": victim}, summaries, "h2", t_kill, t_restart, steps
    )
    assert r["hosts"]["h0"]["gap_s"] == pytest.approx(7.0)
    assert r["hosts"]["h0"]["steps_lost"] == 0 and r["hosts"]["h1"]["steps_lost"] == 1
    assert r["survivor_steps_lost"] == 1 and r["survivor_gap_s"] == pytest.approx(7.0)
    # its first step from the healed state on, not the step it took alone at 109 s
    assert r["rejoin_s"] == pytest.approx(6.5)
    assert r["hosts"]["h2"]["healed_to_step"] == 15
    assert r["hosts"]["h1"]["eval/acc_local"] == 0.8 and r["hosts"]["h1"]["steps"] == steps - 1
    clean = ef.measure({"h0": survivor}, {"h0": summaries["h0"]}, None, None, None, steps)
    assert "survivor_gap_s" not in clean and clean["hosts"]["h0"]["final_loss"] == 1.0


def test_measure_restart_counts_the_steps_done_again_after_the_resume() -> None:
    # rank 0's lines as they came: steps 1..57 every 0.1 s, the kill at 57, a resume
    # from the checkpoint of step 40 at 20 s, then steps 41..80
    lines = [_timed(s, s * 0.1) for s in range(1, 58)]
    lines += [{"step": 40, "time": 19.0, "eval/acc": 0.5}]  # not a step line
    lines += [_timed(s, 20.0 + (s - 41) * 0.1, loss=0.1) for s in range(41, 81)]
    summary = {"train/steps": 80, "eval/acc": 0.97, "eval/loss": 0.1, "restarts": 1}
    r = ec.measure_restart(lines, summary, t_kill=5.7, t_restart=10.7, steps=80)
    assert r["resumed_from_step"] == 40 and r["step_at_failure"] == 57
    assert r["survivor_steps_lost"] == 17
    assert r["survivor_gap_s"] == pytest.approx(20.0 - 5.7)
    assert r["rejoin_s"] == pytest.approx(20.0 - 10.7)
    job = r["hosts"]["job"]
    assert job["eval/acc"] == 0.97 and job["steps"] == 80 and job["final_loss"] == 0.1
    # never resumed (the job died): every step after the last one is lost
    dead = ec.measure_restart(lines[:57], {}, t_kill=5.7, t_restart=10.7, steps=80)
    assert dead["survivor_steps_lost"] == 80 - 57 and dead["rejoin_s"] is None


def test_run_names_and_bad_methods() -> None:
    assert ec.run_name("digits", "restart", 2, True) == "digits-restart-s2-fault"
    with pytest.raises(SystemExit):
        ec.main(["--methods", "gossip-ring,carrier-pigeon"])


# ------------------------------------------------------------------ the torchft clients


def _serve(urls, stop) -> None:  # in a spawned process: torchft stays out of pytest's
    from tests.support.elastic_cases import lighthouse, loopback_address

    server = lighthouse(min_replicas=2, join_timeout_ms=5000)
    urls.put(loopback_address(server))
    stop.wait()
    server.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize(
    "client, extra",
    [
        ("ddp_train", "--grad-sync=ddp"),
        ("ddp_train", "--grad-sync=allreduce"),
        ("diloco_train", ""),
    ],
)
def test_a_torchft_client_trains_two_hosts_that_end_on_one_model(
    tmp_path: Path, client: str, extra: str
) -> None:
    pytest.importorskip("torchft")
    ctx = multiprocessing.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(urls, stop), daemon=True)
    server.start()
    steps = 20
    try:
        url = urls.get(timeout=60)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    f"experiments.bench.torchft_clients.{client}",
                    f"--lighthouse={url}",
                    f"--replica-id=h{i}",
                    f"--run-dir={tmp_path}",
                    "--min-replicas=2",
                    "--timeout-s=20",
                    "--sync-every=5",
                    f"train.max_steps={steps}",
                    *([extra] if extra else []),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for i in range(2)
        ]
        errs = [p.communicate(timeout=240)[1].decode(errors="replace") for p in procs]
    finally:
        stop.set()
        server.join(timeout=10)
        if server.is_alive():
            server.kill()
    assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    summaries = [json.loads((tmp_path / f"h{i}" / "summary.json").read_text()) for i in (0, 1)]
    assert [s["steps"] for s in summaries] == [steps, steps]
    for i in (0, 1):
        lines = [
            json.loads(x) for x in (tmp_path / f"h{i}" / "metrics.jsonl").read_text().splitlines()
        ]
        timed = [x["step"] for x in lines if "time" in x and "train/loss" in x]
        assert timed == list(range(1, steps + 1)), timed
    # all-reduce every step, or an outer step at the last one (20 = 4 x 5): one model
    assert summaries[0]["eval/acc_local"] == summaries[1]["eval/acc_local"]
    # the two hosts read different batches (the orders differ): the losses do
    loss = [
        [json.loads(x).get("train/loss") for x in (tmp_path / f"h{i}" / "metrics.jsonl").open()]
        for i in (0, 1)
    ]
    assert loss[0] != loss[1]
