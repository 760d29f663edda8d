"""The ``engine`` config group: one process per worker, or every worker in one process.

``engine=distributed`` (the default) is torchrun's job: one process per worker,
the wrapper gossiping over a process group. ``engine=packed`` trains
``engine.workers`` workers in one process with :class:`decent_dp.PackedWorkers`
(:mod:`experiments.train.packed`), with the same mathematics.

Example::

    python train.py engine=packed engine.workers=32 topology=one-peer-exp
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from experiments.schema import name_enum

__all__ = ["EngineConfig", "EngineName", "engine_workers", "is_packed"]

EngineName = name_enum("EngineName", ["distributed", "packed"], __name__)


@dataclass
class EngineConfig:
    """``engine`` group: one process per worker (``distributed``) or all in one (``packed``).

    Attributes:
        name: ``distributed`` (torchrun, one process per worker) or ``packed``.
        workers: The number of packed workers ``N`` (``packed``); ``distributed`` takes
            the world size, and refuses another value here in one line.
    """

    name: EngineName = EngineName["distributed"]  # type: ignore[valid-type]
    workers: int | None = None


def is_packed(cfg: Any) -> bool:
    """Whether the config asks for packed workers (``engine=packed``)."""
    section = cfg.get("engine")
    return section is not None and str(section.name) == "packed"


def engine_workers(cfg: Any, world_size: int) -> int:
    """The job's number of workers: ``engine.workers`` when packed, else the world size."""
    return int(cfg.engine.workers) if is_packed(cfg) else world_size
