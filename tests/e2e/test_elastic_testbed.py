"""Elastic gossip on the testbed: a host killed outright and started again (slow, root).

Four testbed hosts of one ``train.py fault_tolerance=torchft`` process each, on
links capped at 100 Mb/s, the lighthouse on host 0. Host 2 is killed (every
process in its namespace) after step 60 and started again 5 s later. What
``docs/recovery.md`` promises is checked: no survivor restarts or loses a
step, none pauses longer than ``fault_tolerance.timeout_s + 5`` s, and the
restarted host heals from a neighbour and finishes with the others.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

pytest.importorskip("torchft")

from experiments.bench.elastic_faults import run_once  # noqa: E402
from experiments.network import testbed as tb  # noqa: E402

TIMEOUT_S = 20.0
STEPS = 200


@pytest.mark.slow
def test_a_killed_host_leaves_and_rejoins_on_the_wire(tmp_path: Path) -> None:
    why = tb.missing()
    if why is not None:
        pytest.skip(why)
    args = argparse.Namespace(
        hosts=4,
        topology="ring",
        steps=STEPS,
        quorum_every=10,
        min_replicas=2,
        timeout_s=TIMEOUT_S,
        join_timeout_ms=30000,
        heartbeat_timeout_ms=2000,
        kill_step=60,
        victim=2,
        restart_after=5.0,
        seed=0,
        limit_s=600.0,
        overrides=["log.progress=false"],
    )
    spec = tb.Spec(hosts=4, rate_bps=tb.parse_rate("100mbit"), prefix="ddpet")
    with tb.testbed(spec) as bed:
        result = run_once(args, tmp_path / "fault", True, bed)
    hosts = result["hosts"]
    assert all(h["steps"] == STEPS for h in hosts.values()), hosts  # every host finished
    assert result["survivor_steps_lost"] == 0, hosts
    assert result["survivor_gap_s"] < TIMEOUT_S + 5, hosts
    assert hosts["h2"].get("healed_from") in ("h1", "h3"), hosts  # a ring neighbour
    assert result["rejoin_s"] is not None, hosts
