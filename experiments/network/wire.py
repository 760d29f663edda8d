"""The bytes a host's network interface carried, read from the kernel's counters.

On the testbed (:mod:`experiments.network.testbed`) every host's launcher sets
``DECENT_DP_WIRE_IFNAME`` to its link. The trainer then adds
``wire/tx_bytes_per_step`` and ``wire/rx_bytes_per_step`` to its metrics lines:
what the host's link carried per training step of the window, averaged over
hosts, beside the library's own accounting ``comm/bytes_per_step``. Elsewhere
the counter reads nothing and adds nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["IFNAME_ENV", "WireCounter"]

IFNAME_ENV = "DECENT_DP_WIRE_IFNAME"


class WireCounter:
    """This host's interface counters since the last :meth:`pop`, as metrics-line timers.

    One process per host reads (local rank 0) and reports its host's bytes times
    the processes per host, so that the metrics line's mean over ranks is the
    mean over hosts.

    Args:
        ifname: The interface (default: ``$DECENT_DP_WIRE_IFNAME``; ``None`` or
            empty turns the counter off).
        local_rank: This process's rank on its host.
        local_world_size: Processes on this host.
    """

    def __init__(
        self, ifname: str | None = None, local_rank: int = 0, local_world_size: int = 1
    ) -> None:
        name = ifname if ifname is not None else os.environ.get(IFNAME_ENV, "")
        self.dir = Path("/sys/class/net") / name / "statistics" if name else None
        if self.dir is not None and not self.dir.is_dir():
            raise ValueError(f"{IFNAME_ENV}={name!r} is not a network interface of this host")
        self.reads = local_rank == 0
        self.scale = float(local_world_size)
        self.last = self._read()

    @classmethod
    def from_env(cls) -> WireCounter:
        """The counter torchrun's ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` describe."""
        return cls(
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )

    @property
    def active(self) -> bool:
        """Whether an interface is being counted."""
        return self.dir is not None

    def _read(self) -> tuple[int, int]:
        if self.dir is None or not self.reads:
            return (0, 0)
        return (
            int((self.dir / "tx_bytes").read_text()),
            int((self.dir / "rx_bytes").read_text()),
        )

    def pop(self) -> dict[str, float]:
        """``wire/tx_bytes_per_step`` and ``wire/rx_bytes_per_step`` to be summed over ranks.

        The metrics line divides a timer's sum over ranks by the world size and
        the window's steps; empty when no interface is counted.
        """
        if self.dir is None:
            return {}
        now = self._read()
        tx, rx = (now[0] - self.last[0]) * self.scale, (now[1] - self.last[1]) * self.scale
        self.last = now
        return {"wire/tx_bytes_per_step": tx, "wire/rx_bytes_per_step": rx}
