"""How a wrapper ends: its phase thread joined, its process groups let go of, and a process
that exits after ``destroy_process_group()`` without aborting.

A gloo group still referenced when the interpreter finalizes is freed then, and its worker
threads, dropping their last work, need the GIL: the process aborts with ``terminate called
without an active exception`` (seen in 11 of 15 torchrun runs of ``exit_script.py diloco``
before the wrapper let go of the default group). The phase thread of hierarchical gossip
left inside a collective at exit aborts the same way.
"""

from __future__ import annotations

import gc
import subprocess
import threading
import weakref
from functools import partial

import pytest
import torch
import torch.distributed as dist

from decent_dp import DecentralizedDataParallel
from tests.support.ddp_cases import make_model, make_optim, train_steps
from tests.support.dist_harness import free_port, ok_values, run_distributed
from tests.support.hier_cases import hosts_of_two
from tests.support.launch import ROOT, TORCHRUN, clean_env

__all__: list[str] = []

SCRIPT = ROOT / "tests" / "decent_dp" / "exit_script.py"


def _phase_threads() -> int:
    return sum(t.name == "decent-dp-phases" and t.is_alive() for t in threading.enumerate())


def _driver_worker(rank: int, world: int) -> dict[str, tuple[int, int]]:
    out = {}
    for how in ("close", "drop"):
        ddp = hosts_of_two(rank, world)
        train_steps(ddp, rank, {}, 1, 3)  # the last step's exchanges are still in flight
        before = _phase_threads()
        if how == "close":
            ddp.close()
        else:
            del ddp
            gc.collect()
        out[how] = (before, _phase_threads())
    return out


def test_closing_or_dropping_a_wrapper_joins_its_phase_thread() -> None:
    values = ok_values(run_distributed(_driver_worker, 4, local_world_size=2, timeout=90))
    for rank, got in enumerate(values):
        assert got == {"close": (1, 0), "drop": (1, 0)}, rank


def _groups_worker(rank: int, world: int, kind: str) -> list[bool]:
    """After close() and destroy_process_group(), is any group this wrapper used still alive?"""
    if kind == "diloco":
        ddp = DecentralizedDataParallel(
            make_model("mlp", seed=rank),
            make_optim({}),
            topology="one-peer-exp",
            bucket_size_in_mb=0,
            outer_optim_fn=partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True),
            outer_every=4,
            outer_fragments=2,
            compression="int8",  # two-phase exchanges: groups of their second phases too
        )
    else:
        ddp = hosts_of_two(rank, world, compression="int8")
    train_steps(ddp, rank, {}, 1, 6)
    groups = [  # the default group, and those this rank is a member of (not the -100 marks)
        weakref.ref(g)
        for g in [dist.group.WORLD, *ddp._engine._res.groups]
        if isinstance(g, dist.ProcessGroup)
    ]
    ddp.close()  # the wrapper itself stays referenced, as in a script
    dist.destroy_process_group()
    gc.collect()
    return [g() is not None for g in groups]


@pytest.mark.parametrize("kind", ["diloco", "hierarchical"])
def test_a_closed_wrapper_lets_go_of_every_group(kind: str) -> None:
    for rank, alive in enumerate(ok_values(run_distributed(_groups_worker, 4, kind, timeout=90))):
        assert len(alive) > 1 and not any(alive), (rank, alive)


def _exits(args: list[str], runs: int) -> list[tuple[int, str]]:
    """``runs`` torchrun launches of exit_script.py on 4 ranks: (exit code, stderr) of each."""
    out = []
    for _ in range(runs):
        cmd = [
            *TORCHRUN[:-1],
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            "--nproc_per_node=4",
            str(SCRIPT),
            *args,
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=240, env=clean_env(), cwd=ROOT
        )
        out.append((proc.returncode, proc.stdout + proc.stderr))
    return out


def _assert_clean(results: list[tuple[int, str]]) -> None:
    for code, output in results:
        assert code == 0 and "terminate called" not in output, output[-3000:]
        assert sorted(ln for ln in output.splitlines() if ln.startswith("done ")) == [
            f"done {r}" for r in range(4)
        ]


@pytest.mark.slow  # a torchrun of 4 ranks; the thread and group checks above stay fast
def test_a_run_ending_with_destroy_process_group_exits_cleanly() -> None:
    # the wrapper is never closed: it is released at interpreter exit, before finalization
    _assert_clean(_exits(["diloco"], runs=1))


@pytest.mark.slow
@pytest.mark.parametrize("args", [["diloco"], ["diloco", "close"], ["hierarchical"]], ids=" ".join)
def test_many_runs_ending_with_destroy_process_group_exit_cleanly(args: list[str]) -> None:
    _assert_clean(_exits(args, runs=6))
