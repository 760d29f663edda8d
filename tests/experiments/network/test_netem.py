"""Network emulation: the cost model by hand, profile validation, and real gloo groups.

The calibration terms (a cost per collective, the stack's CPU) are tested in
``test_netem_calibration.py``.
"""

import gc
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel

from experiments.network import netem
from experiments.network.netem import NetworkProfile
from tests.support.dist_harness import free_port

ETH = NetworkProfile("eth", latency_ms=0.02, bandwidth_gbps=25.0)


# --- cost model, computed by hand -------------------------------------------------------------


def test_ring_allreduce_100mb_over_25g_four_workers() -> None:
    # 25 Gb/s = 3.125e9 B/s; 2*3/4 * 1e8 / 3.125e9 = 0.048 s; latency 2*3*20 us = 120 us.
    assert netem.ring_allreduce_time(100e6, 4, ETH) == pytest.approx(0.048 + 120e-6, rel=1e-12)


def test_ring_allreduce_single_worker_is_free() -> None:
    assert netem.ring_allreduce_time(100e6, 1, ETH) == 0.0
    assert netem.gossip_time(100e6, 1, ETH) == 0.0


def test_gossip_pair_over_infiniband() -> None:
    ib = netem.PROFILES["infiniband_100g"]
    assert (ib.latency_ms, ib.bandwidth_gbps) == (0.002, 100.0)
    # 100 Gb/s = 1.25e10 B/s: 1e7 / 1.25e10 = 0.8 ms, plus 2 * 2 us.
    assert netem.gossip_time(10e6, 2, ib) == pytest.approx(0.8e-3 + 4e-6, rel=1e-12)


def test_gossip_group_is_a_ring_over_its_members() -> None:
    # 8 members, 1 MB: 2*7/8 * 1e6 / 3.125e9 = 0.56 ms; 14 latencies of 20 us = 0.28 ms.
    assert netem.gossip_time(1e6, 8, ETH) == pytest.approx(0.56e-3 + 0.28e-3, rel=1e-12)


def test_gossip_delay_by_hand_for_groups_of_one_two_and_four() -> None:
    delay = netem.make_gossip_delay(ETH, shared_link=False)
    assert delay(0, 2) == pytest.approx(40e-6)
    assert delay(3_125_000, 2) == pytest.approx(1e-3 + 40e-6)
    assert delay(3_125_000, 1) == 0.0
    assert delay(3_125_000, 4) == pytest.approx(1.5e-3 + 120e-6)


def test_gossip_delay_shares_the_link_between_overlapping_gossips() -> None:
    now = [10.0]
    delay = netem.make_gossip_delay(ETH, clock=lambda: now[0])
    pair = 1e-3 + 40e-6  # 3.125 MB over a pair, as above
    assert delay(3_125_000, 2) == pytest.approx(pair)
    # Launched at the same instant: waits for the first transfer, then its own.
    assert delay(3_125_000, 2) == pytest.approx(2 * pair)
    now[0] += 0.5 * pair  # half-way through the first one
    assert delay(3_125_000, 2) == pytest.approx(2.5 * pair)
    assert delay(3_125_000, 1) == 0.0  # a group of one sends nothing
    now[0] += 10.0  # long idle: the link is free again
    assert delay(3_125_000, 2) == pytest.approx(pair)


def test_gossip_delay_with_hosts_of_two_ranks() -> None:
    """Inside a host nothing is held back; across hosts the host's groups share its link."""
    delay = netem.make_gossip_delay(ETH, shared_link=False, procs_per_host=2)
    assert delay(3_125_000, 2, [0, 1]) == 0.0  # one host: loopback
    assert delay(3_125_000, 2, [2, 3]) == 0.0
    assert delay(3_125_000, 2, [1, 2]) == pytest.approx(2e-3 + 40e-6)  # 2 x 3.125 MB
    # a hierarchical edge's phase 2: local rank 1 of hosts 0 and 1, half a model each
    assert delay(1_562_500, 2, [1, 3]) == pytest.approx(1e-3 + 40e-6)
    # two whole hosts: the ring leaves each host once, no other group shares the link
    assert delay(3_125_000, 4, [0, 1, 2, 3]) == pytest.approx(1.5e-3 + 120e-6)
    # one rank of each of 4 hosts (c = 1): the host's two such groups share its link
    assert delay(3_125_000, 4, [0, 2, 4, 6]) == pytest.approx(3e-3 + 120e-6)
    assert delay(3_125_000, 2) == pytest.approx(1e-3 + 40e-6)  # no ranks: a link per rank
    assert netem.make_gossip_delay(ETH, shared_link=False)(3_125_000, 2, [0, 1]) > 0
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="procs_per_host"):
            netem.make_gossip_delay(ETH, procs_per_host=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("nbytes", "n"), [(-1, 2), (float("nan"), 2), (10, 0), (10, -3), (10, 2.5), (10, True)]
)
def test_cost_model_rejects_bad_sizes(nbytes: float, n: int) -> None:
    with pytest.raises(ValueError, match="invalid"):
        netem.ring_allreduce_time(nbytes, n, ETH)


# --- profiles ------------------------------------------------------------------------------


def test_profile_from_cfg_presets_and_none() -> None:
    assert netem.profile_from_cfg(None) is None
    assert netem.profile_from_cfg({"name": "none"}) is None
    assert netem.profile_from_cfg("none") is None
    eth = netem.profile_from_cfg(OmegaConf.create({"name": "ethernet_25g"}))
    assert eth is netem.PROFILES["ethernet_25g"]
    assert eth.bandwidth_bytes_per_s == 25e9 / 8
    assert eth.latency_s == pytest.approx(eth.latency_ms / 1000)
    same = {"name": "infiniband_100g", "latency_ms": 0.002, "bandwidth_gbps": 100}
    assert netem.profile_from_cfg(same) is netem.PROFILES["infiniband_100g"]


def test_efficiency_scales_the_payload_bandwidth() -> None:
    full = NetworkProfile("a", latency_ms=0.1, bandwidth_gbps=0.01)
    half = NetworkProfile("a", latency_ms=0.1, bandwidth_gbps=0.01, efficiency=0.5)
    assert half.bandwidth_bytes_per_s == full.bandwidth_bytes_per_s / 2
    pair = netem.gossip_time(1e6, 2, half)
    assert pair == pytest.approx(1e6 / (0.5 * 0.01e9 / 8) + 2 * 1e-4)
    got = netem.profile_from_cfg({"name": "custom", "latency_ms": 0.1, "bandwidth_gbps": 1.0,
                                  "efficiency": 0.8})  # fmt: skip
    assert got is not None and got.efficiency == 0.8
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=f"efficiency={bad!r} is invalid"):
            NetworkProfile("a", latency_ms=0.1, bandwidth_gbps=1.0, efficiency=bad)


def test_profile_from_cfg_custom() -> None:
    cfg = OmegaConf.create({"name": "custom", "latency_ms": 0.5, "bandwidth_gbps": 10})
    prof = netem.profile_from_cfg(cfg)
    assert prof == NetworkProfile("custom", 0.5, 10.0)
    assert prof.bandwidth_bytes_per_s == 1.25e9


def test_profile_from_structured_config_enums() -> None:
    from experiments.train.config import NetworkConfig, NetworkName

    cfg = OmegaConf.structured(NetworkConfig(name=NetworkName("custom"), latency_ms=0.5,
                                             bandwidth_gbps=10.0))  # fmt: skip
    assert netem.profile_from_cfg(cfg) == NetworkProfile("custom", 0.5, 10.0)
    preset = OmegaConf.structured(NetworkConfig(name=NetworkName("infiniband_100g")))
    assert netem.profile_from_cfg(preset) is netem.PROFILES["infiniband_100g"]
    assert (
        netem.profile_from_cfg(OmegaConf.structured(NetworkConfig(name=NetworkName("none"))))
        is None
    )


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"name": "custom", "latency_ms": 0.1, "bandwidth_gbps": 0}, "bandwidth_gbps=0"),
        ({"name": "custom", "latency_ms": -1, "bandwidth_gbps": 10}, "latency_ms=-1"),
        ({"name": "custom", "latency_ms": 0.1, "bandwidth_gbps": float("inf")}, "bandwidth_gbps"),
        ({"name": "custom", "bandwidth_gbps": 10}, "needs latency_ms"),
        ({"name": "custom", "latency_ms": 0.1}, "needs bandwidth_gbps"),
        ({"name": "custom", "latency_ms": "fast", "bandwidth_gbps": 10}, "latency_ms='fast'"),
        ({"name": "wifi"}, "unknown network profile 'wifi'; known profiles: none, ethernet_25g"),
        ({"name": "ethernet_25g", "bandwidth_gbps": 40}, "use name=custom"),
        # a preset would silently drop the calibration terms: refused instead
        ({"name": "ethernet_25g", "collective_ms": 2}, "collective_ms=0.0, not 2; use name=custom"),
        ({"name": "infiniband_100g", "stack_cpu_ms_per_mb": 5}, "stack_cpu_ms_per_mb=0.0, not 5"),
        ({"name": "ethernet_25g", "efficiency": 0.5}, "efficiency=1.0, not 0.5"),
        (
            {"name": "custom", "latency_ms": 0.1, "bandwidth_gbps": 1, "efficiency": True},
            "efficiency=True",
        ),
        ("custom", "needs latency_ms"),
    ],
)
def test_profile_from_cfg_rejects_bad_values(cfg: object, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        netem.profile_from_cfg(cfg)
    assert "\n" not in str(info.value)


def test_apply_network_off_returns_none_and_rejects_other_models() -> None:
    model = torch.nn.Linear(2, 2)
    assert netem.apply_network({"name": "none"}, model, 4) is None
    with pytest.raises(ValueError, match="world_size=0"):
        netem.apply_network({"name": "ethernet_25g"}, model, 0)
    with pytest.raises(ValueError, match="got Linear"):
        netem.apply_network({"name": "ethernet_25g"}, model, 2)


# --- real 2-process gloo groups ------------------------------------------------------------


# Slow enough that the modelled time dominates the real gloo and compute time on a busy CPU.
SLOW = {"name": "custom", "latency_ms": 5.0, "bandwidth_gbps": 0.01}
SLACK_S = 1.5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
        torch.nn.Linear(256, 10),
    )  # fmt: skip


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)


def _reference_grads(world_size: int) -> list[torch.Tensor]:
    """Gradient of the mean of the workers' losses, on one process, without any group."""
    model = _model()
    loss = sum(
        torch.nn.functional.cross_entropy(model(x), y)
        for x, y in (_batch(r) for r in range(world_size))
    )
    (loss / world_size).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _plain_allreduce_hook(
    state: int, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0] / state)


@contextmanager
def _gloo_group(rank: int, world_size: int, port: int) -> Iterator[None]:
    """This spawned process's gloo group on ``port``, one torch thread, destroyed at the end."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        torch.set_num_threads(1)
        yield
    finally:
        dist.destroy_process_group()


def _torch_ddp_worker(rank: int, world_size: int, port: int) -> None:
    with _gloo_group(rank, world_size, port):
        x, y = _batch(rank)
        expected = _reference_grads(world_size)

        # Off: nothing installed, so registering a hook of our own still works.
        plain = DistributedDataParallel(_model())
        assert netem.apply_network({"name": "none"}, plain, world_size) is None
        plain.register_comm_hook(world_size, _plain_allreduce_hook)

        # apply_network installs the hook (DDP allows only one).
        applied = DistributedDataParallel(_model())
        info = netem.apply_network(SLOW, applied, world_size)
        assert info == {"network": "custom", "latency_ms": 5.0, "bandwidth_gbps": 0.01,
                        "efficiency": 1.0, "collective_ms": 0.0, "stack_cpu_ms_per_mb": 0.0,
                        "emulated": True}  # fmt: skip
        with pytest.raises(RuntimeError):
            applied.register_comm_hook(world_size, _plain_allreduce_hook)

        # Timing and values, with the state in hand.
        profile = netem.profile_from_cfg(SLOW)
        model = DistributedDataParallel(_model(), bucket_cap_mb=0.1)
        state = netem.EmulatedAllreduceState(profile, world_size)
        model.register_comm_hook(state, netem.emulated_allreduce_hook)
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        counts: list[int] = []
        for step in range(3):
            model.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            buckets_before = state.buckets
            start = time.monotonic()
            loss.backward()
            elapsed = time.monotonic() - start
            buckets = state.buckets - buckets_before
            # n = 2: every bucket costs bytes / B + 2 latencies, and buckets share the link.
            modelled = nbytes / profile.bandwidth_bytes_per_s + buckets * 2 * profile.latency_s
            counts.append(buckets)
            print(
                f"rank {rank} step {step}: {buckets} buckets, {elapsed:.3f}s, modelled {modelled:.3f}s"
            )
            assert elapsed >= modelled, f"step {step}: {elapsed:.3f}s < modelled {modelled:.3f}s"
            assert elapsed <= modelled + SLACK_S, f"step {step}: {elapsed:.3f}s vs {modelled:.3f}s"
            for p, g in zip(model.parameters(), expected):
                torch.testing.assert_close(p.grad, g)
        # DDP rebuilds its buckets after the first step; by then they are several.
        assert counts[-1] >= 2, f"expected several buckets, got {counts}"
        total_bytes = 3 * nbytes / profile.bandwidth_bytes_per_s
        assert state.modelled_s == pytest.approx(total_bytes + sum(counts) * 2 * profile.latency_s)
        del plain, applied, model
        gc.collect()  # dropping DDP before the group avoids a rare abort at exit


@pytest.mark.slow
def test_torch_ddp_hook_holds_backward_for_the_modelled_time() -> None:
    mp.spawn(_torch_ddp_worker, args=(2, free_port()), nprocs=2, join=True)


def _gossip_worker(rank: int, world_size: int, port: int) -> None:
    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_sgd

    with _gloo_group(rank, world_size, port):
        x, y = _batch(rank)
        profile = netem.profile_from_cfg(SLOW)
        nbytes = sum(p.numel() * p.element_size() for p in _model().parameters())
        pair_s = netem.gossip_time(nbytes, 2, profile)
        finals, times = [], []
        for net in ({"name": "none"}, SLOW):
            ddp = DecentralizedDataParallel(
                _model(), lambda params: optim_fn_sgd(params, lr=0.1), topology="ring"
            )
            info = netem.apply_network(net, ddp, world_size)
            assert (info is None) == (net["name"] == "none")
            steps = 4
            dist.barrier()
            start = time.monotonic()
            for _ in range(steps):
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            ddp.global_avg()
            times.append(time.monotonic() - start)
            finals.append([p.detach().clone() for p in ddp.parameters()])
            del ddp
            gc.collect()
        # Emulation changes timing, never values.
        for a, b in zip(*finals):
            torch.testing.assert_close(a, b)
        # Each gossip is held pair_s after its launch; the next step waits for it.
        assert times[1] >= (steps - 1) * pair_s, f"{times[1]:.3f}s < {(steps - 1) * pair_s:.3f}s"
        assert times[1] <= steps * pair_s + times[0] + SLACK_S, f"{times} vs {pair_s:.3f}s/step"


@pytest.mark.slow
def test_wrapper_gossip_is_held_for_the_modelled_time() -> None:
    mp.spawn(_gossip_worker, args=(2, free_port()), nprocs=2, join=True)


def test_profile_constants_are_documented_values() -> None:
    eth = netem.PROFILES["ethernet_25g"]
    assert eth.bandwidth_gbps == 25.0 and 0 < eth.latency_ms < 0.1
    assert math.isclose(netem.INTRA_NODE_PROFILE.bandwidth_gbps, 300 * 8)


def _installed_delays(rank: int, world_size: int, nets: list[dict]) -> list[list[float]]:
    from decent_dp import DecentralizedDataParallel
    from decent_dp.optim import optim_fn_sgd

    out = []
    for net in nets:
        ddp = DecentralizedDataParallel(
            _model(), lambda params: optim_fn_sgd(params, lr=0.1), topology="ring"
        )
        netem.apply_network(OmegaConf.create(net), ddp, world_size)
        delay = ddp._engine.gossip.comm_delay  # what the wrapper calls at each launch
        # a pair inside host 0 (ranks 0, 1), then one across the two hosts (1, 2)
        out.append([delay(4000, 2, ranks=[0, 1]), delay(4000, 2, ranks=[1, 2])])
        ddp.close()
    return out


def test_apply_network_passes_the_configs_hosts_to_the_emulator() -> None:
    """``network.procs_per_host`` reaches the emulator: a pair inside one host is not held."""
    from tests.support.dist_harness import ok_values, run_distributed

    hosts = dict(SLOW, procs_per_host=2)
    got = ok_values(run_distributed(_installed_delays, 4, [hosts, SLOW], timeout=120))
    profile = netem.profile_from_cfg(SLOW)
    pair = netem.gossip_time(4000, 2, profile)
    for (inside, across), (flat_a, flat_b) in got:
        assert inside == 0.0  # the loopback's own time
        # across hosts the pair shares the host's link with the other L / c = 2 pairs
        assert across == pytest.approx(netem.gossip_time(2 * 4000, 2, profile))
        assert flat_a == pytest.approx(pair) and flat_b >= pair  # a link per rank
