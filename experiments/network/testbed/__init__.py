"""The testbed: a real multi-host network on one machine (see :mod:`.hosts`), and jobs run on it (:mod:`.launch`).

Every entry point that builds hosts tears them down on SIGTERM and SIGINT too (:mod:`.stop`).

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
from .stop import Interrupted, teardown_on_signals

__all__ = [
    "PREFIX",
    "Interrupted",
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
    "teardown_on_signals",
    "testbed",
    "up",
    "wire_summary",
]
