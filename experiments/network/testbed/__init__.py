"""The testbed: a real multi-host network on one machine (see :mod:`.hosts`), and jobs run on it (:mod:`.launch`).

``python -m experiments.network.testbed --help`` lists its commands.
"""

from .hosts import (
    PREFIX,
    Spec,
    TestbedError,
    address,
    current,
    down,
    host_ns,
    link_stats,
    missing,
    parse_rate,
    read_state,
    testbed,
    up,
)
from .launch import launch, wire_summary

__all__ = [
    "PREFIX",
    "Spec",
    "TestbedError",
    "address",
    "current",
    "down",
    "host_ns",
    "launch",
    "link_stats",
    "missing",
    "parse_rate",
    "read_state",
    "testbed",
    "up",
    "wire_summary",
]
