"""Teardown on SIGTERM and SIGINT, shared by every entry point that builds testbed hosts.

A ``kill``, a SLURM stop or Ctrl-C must not leave namespaces up, nor the hosts'
``torchrun`` launchers running (they are started with ``start_new_session=True``, so
a signal to the entry point's own process group does not reach them).
:func:`teardown_on_signals` turns the first SIGTERM or SIGINT into
:class:`Interrupted`, raised in the main thread, so that the ``finally`` blocks under
it run: :func:`.launch.launch` stops every host's process group and whatever runs in
the hosts, and the entry point removes the namespaces with :func:`.hosts.down`. A
second signal while that teardown runs is ignored, so the teardown is not cut short.

Example::

    with teardown_on_signals():
        try:
            up(spec)
            launch(spec, ["train.py"], out)
        finally:
            down(spec.prefix)
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["Interrupted", "STOP_SIGNALS", "teardown_on_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that end an entry point after its teardown."""


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; raised once, in the main thread.

    A ``KeyboardInterrupt`` so that ``except Exception`` blocks let it through to the
    ``finally`` blocks that tear down.

    Attributes:
        signum: The signal's number; an entry point exits with ``128 + signum``.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def teardown_on_signals() -> Iterator[None]:
    """Raise :class:`Interrupted` on the first SIGTERM or SIGINT inside the block.

    The handlers the block replaced are put back when it ends. Outside the main
    thread (where no handler can be set) the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            return  # the teardown of the first one is running: let it finish
        fired = True
        raise Interrupted(signum)

    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, on_signal)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
