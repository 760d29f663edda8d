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
   It runs on the host, in a gloo group of its own that :meth:`StopRequest.install`
   creates: on the default group (NCCL on GPUs) it would queue behind the
   gossip the step has just launched, and wait for it.
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

torchrun's agent forwards only the signals it handles: ``SIGTERM``, ``SIGINT``,
``SIGHUP`` and ``SIGQUIT`` unless ``--signals-to-handle`` (``PET_SIGNALS_TO_HANDLE``;
``TORCHELASTIC_SIGNALS_TO_HANDLE`` on a torch without that option) names more.
Any other signal, ``SIGUSR2`` included, ends the agent and leaves its workers
running without it. :meth:`StopRequest.install` warns once when a SLURM job's rank runs under an
agent that would not forward the pre-emption signal.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from experiments.schema import ConfigError

__all__ = [
    "StopRequest",
    "EXIT_CODE",
    "preemption_signal",
    "stop_signals",
    "unforwarded_signal",
]

log = logging.getLogger(__name__)

EXIT_CODE = 143
"""The exit status after a stop on a signal: 128 + SIGTERM, as if the signal had ended the process."""

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


# the signals a process can catch, the ones SLURM's --signal and submitit can name
_CATCHABLE = [sig for sig in signal.Signals if sig not in (signal.SIGKILL, signal.SIGSTOP)]
# what torchrun's agent handles (and forwards to its workers) unless told otherwise
_AGENT_DEFAULT = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
_warned_unforwarded = False


def preemption_signal(environ: Mapping[str, str] | None = None) -> signal.Signals:
    """The signal submitit asks SLURM to send before the time limit: ``SIGUSR2`` by default.

    Args:
        environ: The environment to read; ``os.environ`` by default.

    Returns:
        The signal ``$SUBMITIT_PREEMPT_SIGNAL`` (submitit's own setting) names, as
        submitit writes it (``USR2``), with ``SIG`` or as a number (``12``);
        ``SIGUSR2`` without it.

    Raises:
        ConfigError: ``SUBMITIT_PREEMPT_SIGNAL`` names no signal that a process can catch.
    """
    env = os.environ if environ is None else environ
    raw = env.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    value = raw.strip().upper()
    found: signal.Signals | None = None
    if value.isdigit():
        found = next((sig for sig in _CATCHABLE if sig.value == int(value)), None)
    else:
        name = value if value.startswith("SIG") else "SIG" + value
        found = next((sig for sig in _CATCHABLE if sig.name == name), None)
    if found is None:
        allowed = ", ".join(f"{sig.name[3:]} ({sig.value})" for sig in _CATCHABLE)
        raise ConfigError(
            f"SUBMITIT_PREEMPT_SIGNAL={raw!r} names no signal a process can catch; "
            f"it must be one of these names or numbers: {allowed}"
        )
    return found


def stop_signals(environ: Mapping[str, str] | None = None) -> tuple[signal.Signals, ...]:
    """The signals that stop a run: ``SIGTERM``, then the pre-emption signal if it differs.

    The one list that :class:`StopRequest` handles and that the data loaders' worker
    processes ignore (``experiments.data.loaders.worker_init``).

    Args:
        environ: The environment to read; ``os.environ`` by default.

    Returns:
        ``(SIGTERM, preemption_signal(environ))``, without a repeat.

    Raises:
        ConfigError: ``SUBMITIT_PREEMPT_SIGNAL`` names no signal that a process can catch.
    """
    return tuple(dict.fromkeys((signal.SIGTERM, preemption_signal(environ))))


def unforwarded_signal(environ: Mapping[str, str] | None = None) -> signal.Signals | None:
    """The pre-emption signal, when a torchrun agent in a SLURM job would not forward it.

    The agent sets ``TORCHELASTIC_SIGNALS_TO_HANDLE`` in its workers' environment to
    the signals it handles (a torch without ``--signals-to-handle`` passes on the
    user's, if any).

    Args:
        environ: The environment to read; ``os.environ`` by default.

    Returns:
        The signal, or ``None`` outside torchrun, outside SLURM or when the agent handles it.
    """
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" not in env or "SLURM_JOB_ID" not in env:
        return None
    preempt = preemption_signal(env)
    handled = env.get("TORCHELASTIC_SIGNALS_TO_HANDLE", _AGENT_DEFAULT)
    names = {name.strip().upper() for name in handled.split(",")}
    return None if preempt.name in names else preempt


class StopRequest:
    """Signal handlers that ask for a stop, and the agreement of all ranks on it.

    Args:
        every: Agree every this many steps (``checkpoint.signal_check_every``).
        enabled: Install the handlers (``checkpoint.on_signal``); when false
            :meth:`due` is never true.
        rank: This process's rank.
        world_size: Number of ranks; with one, the agreement reads the flags locally.
        timeout_s: How long the agreement and the exit may wait for a peer
            (``dist.timeout_s``).

    Example::

        stop = StopRequest(10, True, rank=rank, world_size=world_size)
        stop.install()  # on every rank: creates the agreement's group
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
        self,
        every: int,
        enabled: bool,
        *,
        rank: int,
        world_size: int,
        timeout_s: float = 1800.0,
    ) -> None:
        self.every, self.enabled = every, enabled
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.term = signal.SIGTERM
        self.preempt = preemption_signal()
        # one flag per signal, in this order (one, if the pre-emption signal is SIGTERM)
        self._seen = dict.fromkeys(stop_signals(), 0)
        self._previous: dict[signal.Signals, _Handler] = {}
        self.group: Any = None  # the agreement's gloo group, from install() to the end
        self.agreed_signals: list[str] = []  # the names the ranks agreed on, once they did
        self.leaving = False

    def install(self) -> None:
        """Create the agreement's group, then install the handlers, remembering the ones
        they replace (submitit's, say).

        With more than one rank this is a collective (``new_group``): call it on every
        rank at the same point. Handlers can only be installed from the main thread;
        elsewhere (a test thread) nothing is installed and no stop is ever due.
        """
        global _warned_unforwarded
        if not self.enabled:
            return
        if self.world_size > 1 and self.group is None:
            # on the host and apart from the training's collectives, which it must not
            # wait behind; made before the thread check so that every rank makes it
            self.group = dist.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=self.timeout_s)
            )
        if threading.current_thread() is not threading.main_thread():
            self.enabled = False
            return
        unforwarded = unforwarded_signal()
        if unforwarded is not None and self.rank == 0 and not _warned_unforwarded:
            _warned_unforwarded = True
            log.warning(
                "torchrun's agent does not forward %s (it handles %s) and dies of it, leaving "
                "the ranks to be killed unsaved; launch torchrun with "
                "PET_SIGNALS_TO_HANDLE=%s,%s (docs/recovery.md)",
                unforwarded.name,
                os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", _AGENT_DEFAULT),
                _AGENT_DEFAULT,
                unforwarded.name,
            )
        for sig in self._seen:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced and release the agreement's
        group; safe to call twice.

        After :meth:`leave` the stop signals stay ignored (see there).
        """
        self._release()
        if self.leaving:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _release(self) -> None:
        if self.group is not None:
            group, self.group = self.group, None
            if dist.is_initialized():  # the default group's end takes every group with it
                dist.destroy_process_group(group)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # runs between two bytecodes of the main thread: record the signal, nothing else
        self._seen[signal.Signals(signum)] = 1

    def due(self, step: int) -> bool:
        """Whether the ranks agree on a stop after ``step``: every ``every`` steps."""
        return self.enabled and step % self.every == 0

    def agreed(self) -> bool:
        """Whether any rank has seen a signal; a collective, the same answer on every rank.

        One all-reduce (MAX) of two integers on the host, in the agreement's own gloo
        group: it neither waits for the device nor queues behind the step's gossip.
        """
        mine = list(self._seen.values())
        if self.world_size > 1:
            flags = torch.tensor(mine, dtype=torch.int32)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            mine = [int(v) for v in flags.tolist()]
        self.agreed_signals = [sig.name for sig, seen in zip(self._seen, mine) if seen]
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
            dist.broadcast_object_list(box, src=0, group=self.group)
            code = box[0]
        self._release()
        if error is not None:
            raise error
        raise SystemExit(code)
