"""A compressed exchange between its launch and its step: its buffers, its work handle, its sum.

How ``bf16`` and ``int8`` payloads travel depends on the group size ``k``:

* a pair all-gathers its two payloads, decoded and summed in rank order:
  one payload sent per member, the least possible;
* a larger group exchanges in two phases, so that what each member sends
  does not grow with ``k``. The bucket is cut into ``k`` chunks; member
  ``c`` receives every member's compressed chunk ``c`` (an all-to-all),
  sums the decoded chunks in member order (``S_c``, exact), and sends
  ``C(S_c)`` to all (an all-gather). ``S`` is then the concatenation of the
  decoded ``C(S_c)``, the same on every member, and member ``c`` adds
  ``k p (S_c - dec(C(S_c)))`` to its correction on chunk ``c``: the
  corrections still add up to zero, so the average of the models stays
  exact, and the rounding of the sum stays in member ``c``'s model, where
  the next exchange sends it. On NCCL the second phase is queued on the side
  stream right behind the first, at the launch; on other backends it starts
  when the result is first waited for (a host-side wait in the launch would
  block the backward pass). Either way every rank issues them at the same
  point, so each group sees its collectives in one order. Where buckets of
  one step can take different kinds of rounds on one group (fragments of the
  outer optimizer, whose buckets' schedules are shifted), that wait could
  fall before another bucket's launch on the group on one rank and after it
  on another: there the second phases run on a group of their own, in the
  order of their first phases (:func:`decent_dp._comm.compressed.start_exchange`,
  :func:`decent_dp._comm.groups.make_second_groups`).

The collectives themselves are issued by :mod:`decent_dp._comm.compressed`; this
module holds what they leave behind (:class:`InFlight`), the handle that
chains the two phases (:class:`Chained`) and the decoding of the group's sum
(:func:`decoded_sum`).
"""

from __future__ import annotations

import queue as _queue
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ..compression.codecs import ENCODERS

__all__ = ["Chained", "InFlight", "PhaseDriver", "decoded_sum"]


class Chained:
    """The work handle of a two-phase exchange: the second collective starts after the first.

    ``then`` runs (and starts the second collective) on the bucket's stream,
    at :meth:`start_second`: at the launch on NCCL, where waiting only orders
    streams; on other backends when the result is first waited for, since a
    host-side wait in the launch would block the backward pass. Either way at
    the same point on every rank, so each group sees its collectives in one order.

    Where the second phases run on a group of their own (``queue`` given, see
    :func:`decent_dp._comm.compressed.start_exchange`), they start in the order
    their first phases did: starting one starts every earlier one of the
    queue first. With a ``driver`` instead (:class:`PhaseDriver`, off NCCL),
    the driver's thread starts them, in launch order, as soon as each first
    phase completes, so the second phase overlaps the computation too; a wait
    then waits for the driver to have started it.
    """

    def __init__(
        self,
        first: Any,
        then: Callable[[], Any],
        stream: Any,
        queue: list[Chained] | None = None,
        driver: PhaseDriver | None = None,
    ) -> None:
        self.first, self.then, self.stream = first, then, stream
        self.second: Any = None
        self.queue = queue
        self.error: BaseException | None = None
        self.started: threading.Event | None = None
        if queue is not None:
            queue.append(self)
        if driver is not None:
            self.started = threading.Event()
            driver.submit(self)

    def start_second(self) -> None:
        if self.started is not None:  # the driver's thread starts it
            self.started.wait()
            if self.error is not None:
                raise self.error
            return
        if self.second is not None:
            return
        queue = self.queue
        if queue is not None:
            while queue and queue[0] is not self:
                queue[0].start_second()  # removes itself from the queue
            if queue and queue[0] is self:
                queue.pop(0)
        self._run_second()

    def _run_second(self) -> None:
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()
        with ctx:
            self.first.wait()
            self.second = self.then()

    def drive(self) -> None:
        """Start the second phase here (the driver's thread); a failure goes to the waiter."""
        try:
            self._run_second()
        except BaseException as exc:  # noqa: BLE001 - re-raised where the result is waited for
            self.error = exc
        finally:
            assert self.started is not None
            self.started.set()

    def wait(self) -> bool:
        self.start_second()
        self.second.wait()
        return True

    def is_completed(self) -> bool:
        if self.started is not None and not self.started.is_set():
            return False
        if self.error is not None:
            return True  # the wait raises it
        return self.second is not None and bool(self.second.is_completed())


class PhaseDriver:
    """A host thread that starts the later phases of chained exchanges, in launch order.

    Off NCCL a collective starts only when issued from the host, and issuing
    the second phase from the thread that runs the backward pass would wait
    for the first. The driver issues it from a thread of its own as soon as
    the first phase completes, taking the exchanges one at a time in the
    order they were launched, which is the same on every rank: each group
    that only the driver issues on sees its collectives in one order. The
    thread holds the queue alone (never the wrapper); it is started at the
    first exchange and joined at :meth:`close`.

    Every exit joins it: the wrapper's release calls :meth:`close` on
    ``close()``, when the wrapper is dropped, and at interpreter exit for a
    wrapper never closed. A daemon thread left inside a collective's wait
    when the interpreter finalizes is killed when it takes the GIL back, from
    a C++ frame that may not unwind: the process aborts with ``terminate
    called without an active exception``.
    """

    def __init__(self) -> None:
        self._queue: _queue.SimpleQueue[Chained | None] = _queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, work: Chained) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_drive, args=(self._queue,), name="decent-dp-phases", daemon=True
                )
                self._thread.start()
        self._queue.put(work)

    def close(self) -> None:
        """End the thread once the exchanges already submitted have run, and join it; idempotent.

        The exchanges' collectives carry their groups' timeouts, so the join
        ends even where a peer is lost. Called on the driver's own thread (a
        release run by the garbage collector there), it only asks it to end.
        """
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(None)
        if thread is not threading.current_thread():
            thread.join()


def _drive(works: _queue.SimpleQueue[Chained | None]) -> None:
    while True:
        work = works.get()
        if work is None:
            return
        work.drive()


@dataclass
class InFlight:
    """One bucket's exchange between its launch and its step."""

    round_index: int
    k: int
    own: torch.Tensor  # the own payload(s) (gather, split) or the own selected values (randk)
    recv: torch.Tensor  # the gathered payloads, the received chunks, or the all-reduced values
    idx: torch.Tensor | None = None  # randk's coordinates
    chunk: int = 0  # split exchange: elements per chunk (0: one phase)
    member: int = 0  # split exchange: this rank's position in the group, the chunk it sums
    sums: torch.Tensor | None = None  # split exchange: the exact sum of the own chunk
    mine: torch.Tensor | None = None  # split exchange: that sum's payload
    gathered: torch.Tensor | None = None  # split exchange: every chunk's sum, k payloads


def decoded_sum(name: str, fl: InFlight, out: torch.Tensor) -> None:
    """``out :=`` the group's sum of the compressed values, the same on every member.

    Summed in member order (a pair), or the concatenation of the decoded chunk
    sums (two phases).
    """
    _, decode = ENCODERS[name]
    n, dtype, k = out.numel(), out.dtype, fl.k
    if fl.chunk:
        assert fl.gathered is not None
        m, sums = fl.chunk, fl.gathered.view(k, -1)
        for c in range(k):
            a, b = min(n, c * m), min(n, (c + 1) * m)
            out[a:b].copy_(decode(sums[c], m, dtype)[: b - a])
        return
    rows = fl.recv.view(k, -1)
    out.copy_(decode(rows[0], n, dtype))
    for j in range(1, k):  # a fixed order: every member sums the same way
        out.add_(decode(rows[j], n, dtype))
