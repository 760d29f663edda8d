"""Network emulation's calibration terms: a cost per collective, the network stack's CPU, and
their way through the Hydra config and the up-front validation."""

from __future__ import annotations

import time

import pytest
from omegaconf import OmegaConf

from experiments.network import netem
from experiments.network.netem import NetworkProfile

ETH = NetworkProfile("eth", latency_ms=0.02, bandwidth_gbps=25.0)

# --- calibration terms: a cost per collective and the network stack's CPU ----------------------

CALIBRATED = ("collective_ms", "stack_cpu_ms_per_mb")


@pytest.mark.parametrize("key", CALIBRATED)
@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), True, "1"])
def test_calibration_terms_reject_bad_values(key: str, bad: object) -> None:
    with pytest.raises(ValueError) as info:
        NetworkProfile("a", latency_ms=0.1, bandwidth_gbps=1.0, **{key: bad})  # type: ignore[arg-type]
    message = str(info.value)
    assert f"{key}={bad!r} is invalid; it must be a finite number >= 0" in message
    assert "\n" not in message


def test_calibration_terms_default_to_zero_and_are_floats() -> None:
    assert (ETH.collective_ms, ETH.stack_cpu_ms_per_mb) == (0.0, 0.0)
    prof = NetworkProfile("a", latency_ms=0.1, bandwidth_gbps=1.0, collective_ms=0,
                          stack_cpu_ms_per_mb=3)  # fmt: skip
    assert type(prof.collective_ms) is float and type(prof.stack_cpu_ms_per_mb) is float
    assert prof.as_dict() == {"network": "a", "latency_ms": 0.1, "bandwidth_gbps": 1.0,
                              "efficiency": 1.0, "collective_ms": 0.0,
                              "stack_cpu_ms_per_mb": 3.0}  # fmt: skip


def test_collective_cost_is_added_once_per_call() -> None:
    costly = NetworkProfile("eth", latency_ms=0.02, bandwidth_gbps=25.0, collective_ms=2.0)
    for n in (2, 4, 8):
        # once per call, not per ring step: the difference does not grow with n
        extra = netem.ring_allreduce_time(3_125_000, n, costly) - netem.ring_allreduce_time(
            3_125_000, n, ETH
        )
        assert extra == pytest.approx(2e-3, rel=1e-9)
    assert netem.gossip_time(3_125_000, 2, costly) == pytest.approx(2e-3 + 1e-3 + 40e-6)
    assert netem.ring_allreduce_time(3_125_000, 4, costly) == pytest.approx(2e-3 + 1.5e-3 + 120e-6)
    assert netem.ring_allreduce_time(3_125_000, 1, costly) == 0.0  # a group of one: no call
    delay = netem.make_gossip_delay(costly, shared_link=False)
    assert delay(0, 2) == pytest.approx(2e-3 + 40e-6)
    assert delay(0, 1) == 0.0


def test_sent_bytes_of_a_ring_member() -> None:
    assert netem.sent_bytes(1e6, 1) == 0.0
    assert netem.sent_bytes(1e6, 2) == 1e6
    assert netem.sent_bytes(1e6, 4) == 1.5e6


def test_profile_from_cfg_reads_the_calibration_terms() -> None:
    base = {"name": "custom", "latency_ms": 0.5, "bandwidth_gbps": 10}
    got = netem.profile_from_cfg({**base, "collective_ms": 1.5, "stack_cpu_ms_per_mb": 3})
    assert got == NetworkProfile("custom", 0.5, 10.0, collective_ms=1.5, stack_cpu_ms_per_mb=3.0)
    # missing or null in the config: no cost
    unset = netem.profile_from_cfg(OmegaConf.create({**base, "collective_ms": None}))
    assert unset is not None and (unset.collective_ms, unset.stack_cpu_ms_per_mb) == (0.0, 0.0)
    with pytest.raises(ValueError, match="stack_cpu_ms_per_mb=-2 is invalid") as info:
        netem.profile_from_cfg({**base, "stack_cpu_ms_per_mb": -2})
    assert "\n" not in str(info.value)


def _wait_burned(burner: netem.CpuBurner, target: float, timeout_s: float = 30.0) -> None:
    """Until ``burner`` has spent ``target`` seconds in all (CPU time, so slow on busy cores)."""
    deadline = time.monotonic() + timeout_s
    while burner.burned_s < target - 1e-9:
        assert time.monotonic() < deadline, (
            f"burned {burner.burned_s:.3f}s, waiting for {target:.3f}s"
        )
        time.sleep(0.01)


def test_cpu_burner_spends_the_cpu_time_it_was_given() -> None:
    burner = netem.CpuBurner()  # its own thread and queue: no other test's burns mixed in
    assert netem.CpuBurner.shared() is netem.CpuBurner.shared()
    cpu0 = time.process_time()
    burner.burn(0.2)
    while not burner._todo.empty():  # the thread has taken the 0.2 s and is busy with it
        time.sleep(0.001)
    burner.burn(0)
    burner.burn(-1)
    assert burner._todo.empty()
    _wait_burned(burner, 0.2)
    spent = time.process_time() - cpu0
    assert 0.18 <= spent < 0.6, f"the process spent {spent:.3f}s of CPU for a 0.2s burn"
    time.sleep(0.05)
    assert burner.burned_s == pytest.approx(0.2)  # a queued -1 would have taken a second off


def test_gossip_delay_burns_stack_cpu_only_across_hosts() -> None:
    # 50 ms per MB: a pair's 1 MB costs 0.05 s, a 4-ring member's 1.5 MB 0.075 s
    stack = NetworkProfile("a", latency_ms=0.02, bandwidth_gbps=25.0, stack_cpu_ms_per_mb=50.0)
    burner = netem.CpuBurner.shared()
    before = burner.burned_s
    per_rank = netem.make_gossip_delay(stack, shared_link=False)
    hosts_of_two = netem.make_gossip_delay(stack, shared_link=False, procs_per_host=2)
    assert hosts_of_two(1_000_000, 2, [0, 1]) == 0.0  # inside one host: loopback, no stack CPU
    hosts_of_two(1_000_000, 1, [3])  # a group of one sends nothing
    per_rank(1_000_000, 2, [0, 1])  # every rank its own host: crosses
    # The queue runs in order: anything the calls above had queued would show up here.
    _wait_burned(burner, before + 0.05)
    hosts_of_two(1_000_000, 2, [1, 2])  # across hosts 0 and 1
    hosts_of_two(1_000_000, 4)  # no ranks given: counted as crossing
    _wait_burned(burner, before + 0.05 + 0.05 + 0.075)
    time.sleep(0.05)
    assert burner.burned_s - before == pytest.approx(0.175)


def test_allreduce_state_burns_stack_cpu_for_more_than_one_member() -> None:
    stack = NetworkProfile("a", latency_ms=0.02, bandwidth_gbps=25.0, collective_ms=1.0,
                           stack_cpu_ms_per_mb=50.0)  # fmt: skip
    burner = netem.CpuBurner.shared()
    before = burner.burned_s
    alone = netem.EmulatedAllreduceState(stack, 1)
    assert alone.reserve(1_000_000, 5.0) == 5.0
    state = netem.EmulatedAllreduceState(stack, 4)
    # 1 ms per call + 1.5 MB at 3.125 GB/s + 6 hops of 20 us
    assert state.reserve(1_000_000, 5.0) == pytest.approx(5.0 + 1e-3 + 0.48e-3 + 120e-6)
    _wait_burned(burner, before + 0.075)
    time.sleep(0.05)
    assert burner.burned_s - before == pytest.approx(0.075)


# --- the Hydra config and the up-front validation ----------------------------------------------


def test_hydra_config_accepts_the_calibration_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.train.run import validate
    from tests.support.launch import compose_config

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cfg = compose_config(
        "network=custom", "network.collective_ms=1.5", "network.stack_cpu_ms_per_mb=3"
    )
    assert (cfg.network.collective_ms, cfg.network.stack_cpu_ms_per_mb) == (1.5, 3.0)
    validate(cfg, 2)
    prof = netem.profile_from_cfg(cfg.network)
    assert prof is not None and (prof.collective_ms, prof.stack_cpu_ms_per_mb) == (1.5, 3.0)
    # not given: the schema's null, no cost
    plain = netem.profile_from_cfg(compose_config("network=custom").network)
    assert plain is not None and (plain.collective_ms, plain.stack_cpu_ms_per_mb) == (0.0, 0.0)


@pytest.mark.parametrize("override", ["network.collective_ms=-1", "network.stack_cpu_ms_per_mb=-1"])
def test_validation_refuses_a_negative_calibration_term(
    override: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments.train.run import ConfigError, validate
    from tests.support.launch import compose_config

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError) as info:
        validate(compose_config("network=custom", override), 2)
    message = str(info.value)
    # the schema's float turns -1 into -1.0
    key = override.removeprefix("network.").removesuffix("=-1")
    assert message.startswith("network=custom: ")
    assert f"{key}=-1.0 is invalid; it must be a finite number >= 0" in message
    assert "\n" not in message
