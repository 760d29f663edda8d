"""Span timers that never make the host wait: wall clock on CPU, CUDA events on GPUs."""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["SpanTimers"]

# fold finished CUDA spans into the sums once this many are outstanding, so that a run
# that never reads its timers keeps a bounded list
_MAX_PENDING = 4096


class SpanTimers:
    """Sums of named spans.

    On CPU a mark is ``time.perf_counter()``. On CUDA a mark is an event
    recorded on the current stream, so a span measures the device's time on
    that stream (e.g. how long it waited for a collective), and reading the
    sums is the only place that synchronizes.
    """

    def __init__(self, keys: tuple[str, ...], device: torch.device):
        self.keys = keys
        self.cuda = device.type == "cuda"
        self.device = device
        self._sums = dict.fromkeys(keys, 0.0)
        self._pending: list[tuple[str, Any, Any]] = []

    def mark(self) -> Any:
        """A point in time on the current stream."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            # on the current stream of this device, not of the thread's current device
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def add(self, key: str, start: Any, end: Any) -> None:
        """Add the span from ``start`` to ``end`` (two marks) to ``key``."""
        if not self.cuda:
            self._sums[key] += end - start
            return
        self._pending.append((key, start, end))
        if len(self._pending) > _MAX_PENDING:
            self._fold(block=False)

    def _fold(self, block: bool) -> None:
        keep = []
        for key, start, end in self._pending:
            if block:
                end.synchronize()
            elif not end.query():
                keep.append((key, start, end))
                continue
            self._sums[key] += start.elapsed_time(end) / 1000.0
        self._pending = keep

    def pop(self) -> dict[str, float]:
        """The sums in seconds since the last call; resets them."""
        if self._pending:
            self._fold(block=True)
        out, self._sums = self._sums, dict.fromkeys(self.keys, 0.0)
        return out
