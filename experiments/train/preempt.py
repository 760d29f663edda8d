"""Stop at an agreed step boundary on SIGTERM or the pre-emption signal, save, and leave.

SLURM announces the end of a job with a signal: ``SIGTERM`` when it is
pre-empted, requeued (``scontrol requeue``) or cancelled, then ``SIGKILL``
after ``KillWait`` seconds; and, with submitit, ``SIGUSR2`` (the
``SUBMITIT_PREEMPT_SIGNAL``) ``signal_delay_s`` seconds before the time limit.
torchrun's agent forwards a ``SIGTERM`` to its workers and kills them 30 s
later. :class:`StopRequest` turns either signal into an orderly stop:

1. The handler only records which signal came; it does no I/O and no
   collective, so it is safe wherever the main thread is interrupted.
2. Every ``checkpoint.signal_check_every`` steps the ranks agree on whether
   any of them saw a signal, with one all-reduce (MAX) of two integers. Not
   every rank sees a signal at the same moment (torchrun's agent or a user may
   signal one worker only), and the all-reduce makes them stop at the same step.
3. The trainer then saves every rank's checkpoint of that step and calls
   :meth:`StopRequest.leave`. After the pre-emption signal, rank 0 hands over to
   the handler that was installed before (submitit's, which stores its job
   pickle and runs ``scontrol requeue``, counting ``max_num_timeout``); the
   ranks wait for it, then every rank exits with the status that handler chose
   (:data:`EXIT_CODE` without one). A
   ``SIGTERM`` is left to SLURM, which requeues a pre-empted or requeued job
   itself. The exit is a :class:`SystemExit`, so neither Hydra nor submitit
   records the job as finished, and a requeued job runs again.

A signal that arrives at step ``s`` is acted on at the first multiple of
``signal_check_every`` after ``s``: at most ``signal_check_every`` steps run
after the signal, and all of them are in the checkpoint. A requeued job
recomputes nothing, as long as those steps and the save fit in the grace period
(``KillWait``, ``signal_delay_s`` or torchrun's 30 s); if they do not, the job
is killed and resumes from the checkpoint before.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

__all__ = ["StopRequest", "EXIT_CODE", "preemption_signal"]

log = logging.getLogger(__name__)

EXIT_CODE = 143
"""The exit status after a stop on a signal: 128 + SIGTERM, as if the signal had ended the process."""

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def preemption_signal() -> signal.Signals:
    """The signal submitit asks SLURM to send before the time limit: ``SIGUSR2`` by default.

    Returns:
        ``SIG`` + ``$SUBMITIT_PREEMPT_SIGNAL`` (submitit's own setting), ``SIGUSR2`` without it.

    Raises:
        ValueError: ``SUBMITIT_PREEMPT_SIGNAL`` names no signal.
    """
    name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"SUBMITIT_PREEMPT_SIGNAL names no signal ({name})") from None


class StopRequest:
    """Signal handlers that ask for a stop, and the agreement of all ranks on it.

    Args:
        every: Agree every this many steps (``checkpoint.signal_check_every``).
        enabled: Install the handlers (``checkpoint.on_signal``); when false
            :meth:`due` is never true.
        device: Where the agreement's all-reduce runs (the ranks' device).
        rank: This process's rank.
        world_size: Number of ranks; with one, the agreement reads the flags locally.

    Example::

        stop = StopRequest(10, True, device, rank=rank, world_size=world_size)
        stop.install()
        try:
            for step in range(1, total + 1):
                train_one_step()
                if stop.due(step) and stop.agreed():
                    save(step)
                    stop.leave()
        finally:
            stop.restore()
    """

    def __init__(
        self, every: int, enabled: bool, device: torch.device, *, rank: int, world_size: int
    ) -> None:
        self.every, self.enabled, self.device = every, enabled, device
        self.rank, self.world_size = rank, world_size
        self.term = signal.SIGTERM
        self.preempt = preemption_signal()
        self._seen = {self.term: 0, self.preempt: 0}
        self._previous: dict[signal.Signals, _Handler] = {}
        self.agreed_signals: list[str] = []  # the names the ranks agreed on, once they did
        self.leaving = False

    def install(self) -> None:
        """Install the handlers, remembering the ones they replace (submitit's, say).

        Handlers can only be installed from the main thread; elsewhere (a test
        thread) nothing is installed and no stop is ever due.
        """
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            self.enabled = False
            return
        for sig in self._seen:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced; safe to call twice.

        After :meth:`leave` the stop signals stay ignored (see there).
        """
        if self.leaving:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # runs between two bytecodes of the main thread: record the signal, nothing else
        self._seen[signal.Signals(signum)] = 1

    def due(self, step: int) -> bool:
        """Whether the ranks agree on a stop after ``step``: every ``every`` steps."""
        return self.enabled and step % self.every == 0

    def agreed(self) -> bool:
        """Whether any rank has seen a signal; a collective, the same answer on every rank.

        One all-reduce (MAX) of two integers, then one read of the result: the only
        host synchronisation, every ``every`` steps.
        """
        mine = [self._seen[self.term], self._seen[self.preempt]]
        if self.world_size > 1:
            flags = torch.tensor(mine, dtype=torch.int32, device=self.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            mine = [int(v) for v in flags.tolist()]
        self.agreed_signals = [
            sig.name for sig, seen in zip((self.term, self.preempt), mine) if seen
        ]
        return bool(self.agreed_signals)

    def leave(self) -> NoReturn:
        """Hand a pre-emption over to the previous handler on rank 0, then exit every rank.

        Call it on every rank once the checkpoint of the agreed step is saved.

        Raises:
            SystemExit: On every rank, with the status the previous handler exited
                with on rank 0 (submitit's local executor requeues on its own
                status), else :data:`EXIT_CODE`.
            Exception: Whatever the previous handler raised on rank 0 instead of
                requeueing (submitit's ``UncompletedJobError`` once ``max_num_timeout``
                is spent), so that submitit records the job as over.
        """
        self.leaving = True
        # a launcher that stops the other ranks once one has left (torchrun) sends them a
        # SIGTERM; ignored, it cannot end a rank before its exit status is set. Python's
        # own handlers would not do: they are reset to the default when the interpreter exits
        for sig in self._seen:
            signal.signal(sig, signal.SIG_IGN)
        error: Exception | None = None
        code: Any = EXIT_CODE
        previous = self._previous.get(self.preempt)
        if self.rank == 0 and self.preempt.name in self.agreed_signals and callable(previous):
            try:
                previous(int(self.preempt), None)
            except SystemExit as exc:  # submitit requeued the job and asks to exit
                code = exc.code
            except Exception as exc:
                error = exc
        if self.world_size > 1:
            # also keeps every rank here until rank 0 has requeued: a rank that left
            # first could make srun end the job before the requeue
            box = [code]
            dist.broadcast_object_list(box, src=0)
            code = box[0]
        if error is not None:
            raise error
        raise SystemExit(code)
