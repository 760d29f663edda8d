"""The stop on a signal, piece by piece: real signals, and real 2-rank gloo groups.

* ``SUBMITIT_PREEMPT_SIGNAL`` names a signal (as submitit writes it, with ``SIG`` or
  as a number); anything else is a one-line error before any rank starts.
* After the pre-emption signal rank 0 hands over to the handler installed before it
  (submitit's), and every rank exits with the status that handler chose.
* After :meth:`StopRequest.leave` the stop signals stay ignored, also through
  :meth:`StopRequest.restore`; without a leave, ``restore`` puts the old handlers back.
* The agreement runs in a gloo group of its own, so it completes while the default
  group still waits for a collective that a peer has not joined.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from experiments.schema import ConfigError
from experiments.train import preempt
from experiments.train.preempt import (
    EXIT_CODE,
    StopRequest,
    preemption_signal,
    unforwarded_signal,
)
from experiments.train.run import validate
from tests.support.dist_harness import ok_values, run_distributed
from tests.support.launch import compose_config

STOP = (signal.SIGTERM, signal.SIGUSR2)


@pytest.fixture(autouse=True)
def _handlers_back() -> Iterator[None]:
    """Whatever a test installs, the stop signals' handlers are the old ones after it."""
    saved = {sig: signal.getsignal(sig) for sig in STOP}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


class Previous:
    """A handler installed before the stop's, as submitit installs its own."""

    def __init__(self, outcome: BaseException | None = None) -> None:
        self.calls: list[int] = []
        self.outcome = outcome

    def __call__(self, signum: int, frame: Any) -> None:
        self.calls.append(signum)
        if self.outcome is not None:
            raise self.outcome


def _signalled(stop: StopRequest, sig: signal.Signals) -> None:
    """Send ``sig`` to this process; its handler has run when ``os.kill`` returns here."""
    os.kill(os.getpid(), sig)


def _leave(stop: StopRequest) -> BaseException:
    with pytest.raises(BaseException) as caught:
        stop.leave()
    return caught.value


# ----------------------------------------------------------------- SUBMITIT_PREEMPT_SIGNAL


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, signal.SIGUSR2),
        ("USR2", signal.SIGUSR2),
        ("USR1", signal.SIGUSR1),
        ("SIGUSR1", signal.SIGUSR1),
        (" usr1 ", signal.SIGUSR1),
        ("HUP", signal.SIGHUP),
        (str(int(signal.SIGUSR1)), signal.SIGUSR1),
        (str(int(signal.SIGUSR2)), signal.SIGUSR2),
    ],
)
def test_the_preemption_signal_is_named_or_numbered(
    value: str | None, expected: signal.Signals
) -> None:
    env = {} if value is None else {"SUBMITIT_PREEMPT_SIGNAL": value}
    assert preemption_signal(env) is expected


@pytest.mark.parametrize("value", ["BOGUS", "SIGBOGUS", "", "KILL", "STOP", "9", "999", "-12"])
def test_a_bad_preemption_signal_is_one_line_naming_it_and_the_allowed(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        preemption_signal({"SUBMITIT_PREEMPT_SIGNAL": value})
    message = str(err.value)
    assert "\n" not in message
    assert f"SUBMITIT_PREEMPT_SIGNAL={value!r}" in message
    assert f"USR2 ({int(signal.SIGUSR2)})" in message and "TERM (15)" in message
    assert "KILL (" not in message and "STOP (" not in message  # cannot be caught


def test_a_bad_preemption_signal_fails_validation_before_any_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR3")
    with pytest.raises(ConfigError, match="SUBMITIT_PREEMPT_SIGNAL='USR3'"):
        validate(compose_config(), 2)
    # with the handlers off the variable is never read
    validate(compose_config("checkpoint.on_signal=false"), 2)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TORCHELASTIC_RUN_ID": "x", "SLURM_JOB_ID": "1"}, signal.SIGUSR2),
        (
            {
                "TORCHELASTIC_RUN_ID": "x",
                "SLURM_JOB_ID": "1",
                "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
            },
            signal.SIGUSR2,
        ),
        (
            {
                "TORCHELASTIC_RUN_ID": "x",
                "SLURM_JOB_ID": "1",
                "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM, SIGUSR2",
            },
            None,
        ),
        (
            {
                "TORCHELASTIC_RUN_ID": "x",
                "SLURM_JOB_ID": "1",
                "SUBMITIT_PREEMPT_SIGNAL": "HUP",
            },
            None,  # the agent handles SIGHUP by default
        ),
        ({"TORCHELASTIC_RUN_ID": "x"}, None),  # torchrun outside SLURM: no such signal comes
        ({"SLURM_JOB_ID": "1"}, None),  # SLURM tasks without torchrun
    ],
)
def test_a_preemption_signal_that_torchruns_agent_would_not_forward(
    env: dict[str, str], expected: signal.Signals | None
) -> None:
    assert unforwarded_signal(env) is expected


def test_rank_0_warns_once_under_an_agent_that_would_not_forward_the_signal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(preempt, "_warned_unforwarded", False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("TORCHELASTIC_SIGNALS_TO_HANDLE", raising=False)
    for _ in range(2):  # two jobs of a multirun
        stop = StopRequest(1, True, rank=0, world_size=1)
        stop.install()
        stop.restore()
    warnings = [r.getMessage() for r in caplog.records if r.name == preempt.__name__]
    assert len(warnings) == 1, warnings
    assert "SIGUSR2" in warnings[0] and "PET_SIGNALS_TO_HANDLE=" in warnings[0]


# ----------------------------------------------------------------- one process


def test_rank_0_hands_the_preemption_signal_over_to_the_previous_handler() -> None:
    previous = Previous(SystemExit(42))  # as submitit's after its requeue
    signal.signal(signal.SIGUSR2, previous)
    stop = StopRequest(5, True, rank=0, world_size=1)
    stop.install()
    _signalled(stop, signal.SIGUSR2)
    assert previous.calls == []  # the signal itself only asks for a stop
    assert not stop.due(4) and stop.due(5)
    assert stop.agreed() and stop.agreed_signals == ["SIGUSR2"]
    assert stop.group is None  # one rank agrees with itself
    exc = _leave(stop)
    assert isinstance(exc, SystemExit) and exc.code == 42
    assert previous.calls == [signal.SIGUSR2]
    for sig in STOP:  # a second signal cannot end the process before its exit
        assert signal.getsignal(sig) is signal.SIG_IGN
    stop.restore()  # the trainer's finally, after the leave: changes nothing
    for sig in STOP:
        assert signal.getsignal(sig) is signal.SIG_IGN


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [(None, EXIT_CODE), (RuntimeError("no requeue left"), RuntimeError)],
)
def test_what_the_previous_handler_does_decides_how_rank_0_leaves(
    outcome: BaseException | None, expected: Any
) -> None:
    previous = Previous(outcome)
    signal.signal(signal.SIGUSR2, previous)
    stop = StopRequest(1, True, rank=0, world_size=1)
    stop.install()
    _signalled(stop, signal.SIGUSR2)
    assert stop.agreed()
    exc = _leave(stop)
    if expected is RuntimeError:  # submitit's UncompletedJobError, say: the job is over
        assert exc is outcome
    else:
        assert isinstance(exc, SystemExit) and exc.code == expected
    assert previous.calls == [signal.SIGUSR2]


def test_sigterm_is_left_to_slurm_and_no_handler_is_called() -> None:
    previous = Previous(SystemExit(42))
    signal.signal(signal.SIGUSR2, previous)
    signal.signal(signal.SIGTERM, previous)
    stop = StopRequest(1, True, rank=0, world_size=1)
    stop.install()
    _signalled(stop, signal.SIGTERM)
    assert stop.agreed() and stop.agreed_signals == ["SIGTERM"]
    exc = _leave(stop)
    assert isinstance(exc, SystemExit) and exc.code == EXIT_CODE
    assert previous.calls == []


def test_restore_puts_the_previous_handlers_back_and_is_safe_twice() -> None:
    previous = Previous()
    signal.signal(signal.SIGUSR2, previous)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stop = StopRequest(1, True, rank=0, world_size=1)
    stop.install()
    assert signal.getsignal(signal.SIGUSR2) == stop._on_signal
    assert not stop.agreed() and stop.agreed_signals == []
    stop.restore()
    stop.restore()
    assert signal.getsignal(signal.SIGUSR2) is previous
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_off_installs_nothing_and_never_stops() -> None:
    before = {sig: signal.getsignal(sig) for sig in STOP}
    stop = StopRequest(1, False, rank=0, world_size=2)  # no group either: none is needed
    stop.install()
    assert {sig: signal.getsignal(sig) for sig in STOP} == before
    assert stop.group is None and not stop.due(1)
    stop.restore()


# ----------------------------------------------------------------- two ranks


def _hand_over(rank: int, world_size: int, outcome: str) -> dict[str, Any]:
    # rank 0's previous handler stands for submitit's; rank 1's must never be called
    previous = Previous(SystemExit(42) if outcome == "requeued" else RuntimeError("over"))
    signal.signal(signal.SIGUSR2, previous)
    stop = StopRequest(2, True, rank=rank, world_size=world_size, timeout_s=60)
    stop.install()
    try:
        group = stop.group
        if rank == 1:  # only rank 1 sees the signal, as when SLURM's reaches it first
            _signalled(stop, signal.SIGUSR2)
        agreed = stop.agreed()
        with pytest.raises(BaseException) as caught:
            stop.leave()
        return {
            "agreed": agreed,
            "signals": stop.agreed_signals,
            "own_group": group is not None and group is not dist.group.WORLD,
            "released": stop.group is None,
            "exit": type(caught.value).__name__,
            "code": getattr(caught.value, "code", None),
            "calls": previous.calls,
        }
    finally:
        stop.restore()


@pytest.mark.parametrize("outcome", ["requeued", "over"])
def test_every_rank_exits_with_the_status_rank_0s_previous_handler_chose(outcome: str) -> None:
    r0, r1 = ok_values(run_distributed(_hand_over, 2, outcome, timeout=120))
    for result in (r0, r1):
        assert result["agreed"] and result["signals"] == ["SIGUSR2"]
        assert result["own_group"] and result["released"]
    assert r0["calls"] == [signal.SIGUSR2] and r1["calls"] == []
    if outcome == "requeued":
        assert (r0["exit"], r0["code"]) == ("SystemExit", 42)
        assert (r1["exit"], r1["code"]) == ("SystemExit", 42)
    else:  # rank 0 reports the handler's error; the others leave with the signal's status
        assert r0["exit"] == "RuntimeError"
        assert (r1["exit"], r1["code"]) == ("SystemExit", EXIT_CODE)


def _agree_while_the_default_group_waits(rank: int, world_size: int) -> dict[str, Any]:
    stop = StopRequest(1, True, rank=rank, world_size=world_size, timeout_s=30)
    stop.install()
    try:
        gossip = torch.full((1000,), float(rank + 1))
        if rank == 0:
            # as the step's gossip, launched and not yet joined by rank 1
            pending = dist.all_reduce(gossip, async_op=True)
        else:
            _signalled(stop, signal.SIGTERM)
        agreed = stop.agreed()
        if rank == 0:
            pending.wait()
        else:  # rank 1 joins the gossip only once the agreement is done
            dist.all_reduce(gossip)
        return {
            "agreed": agreed,
            "signals": stop.agreed_signals,
            "own_group": stop.group is not None and stop.group is not dist.group.WORLD,
            "gossip": gossip[:3],
        }
    finally:
        stop.restore()


def test_the_agreement_completes_while_the_default_group_waits_for_a_peer() -> None:
    results = ok_values(run_distributed(_agree_while_the_default_group_waits, 2, timeout=90))
    for result in results:
        assert result["own_group"]
        assert result["agreed"] and result["signals"] == ["SIGTERM"]
        torch.testing.assert_close(result["gossip"], torch.full((3,), 3.0), rtol=0, atol=0)
