"""Compressed hierarchical gossip: phase 2 (between hosts) compressed, the host's phases exact.

Real runs on 8 gloo ranks (4 hosts of 2, ``one-peer-exp`` between hosts: every edge
pairs two hosts) are compared with a float64 replay in one process that compresses
with the reference encoders of :mod:`tests.support.codecs`, not the library's.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp._comm.compressed import GossipCompressor
from decent_dp._comm.hierarchical import check_compression
from decent_dp._engine.bucket import Bucket
from decent_dp.compression import CompressionSpec, parse_compression
from decent_dp.topo import HierarchicalTopology
from tests.support.codecs import compressed, int8_payload
from tests.support.compression_replay import buckets_of, set_buckets
from tests.support.ddp_cases import flat, loss_of, make_model, make_optim, set_flat, train_steps
from tests.support.dist_harness import ok_values, run_distributed

HOSTS, LOCAL = 4, 2
WORLD = HOSTS * LOCAL
TOL = 1e-12


def _worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    ddp = DecentralizedDataParallel(
        make_model("mlp", seed=rank),
        optim_fn=make_optim(cfg),
        topology=HierarchicalTopology(world, LOCAL),
        local_world_size=LOCAL,
        bucket_size_in_mb=0,
        compression=cfg["compression"],
    )
    ddp.set_adaptive_factor(cfg["alpha"])
    train_steps(ddp, rank, cfg, 1, cfg["steps"])
    out = {
        "params": flat(ddp.module),
        "layout": [b["names"] for b in ddp.buckets_info],
        "by_link": ddp.comm_bytes_by_link(),
        "numels": [b["numel"] for b in ddp.buckets_info],
    }
    ddp.close()
    return out


def _replay(cfg: dict[str, Any], layout: list[list[str]], name: str | None) -> list[torch.Tensor]:
    """The workers' models after ``cfg["steps"]`` steps; ``name=None``: phase 2 exact."""
    topo = HierarchicalTopology(WORLD, LOCAL)
    start = make_model("mlp", seed=0)
    models = [make_model("mlp", seed=0) for _ in range(WORLD)]
    for m in models:
        set_flat(m, flat(start))
    optims = [make_optim(cfg)([(p, n) for n, p in m.named_parameters()]) for m in models]
    refs: dict[tuple[int, int, int, int], torch.Tensor] = {}  # (first host, round, bucket, chunk)
    a = cfg["alpha"]
    for t in range(1, cfg["steps"] + 1):
        old = [buckets_of(m, layout) for m in models]
        for i, (m, opt) in enumerate(zip(models, optims)):
            opt.zero_grad(set_to_none=True)
            loss_of(m, i, t).backward()
            opt.step()
        new = [buckets_of(m, layout) for m in models]
        r = (t - 1) % topo.period
        mixed = [[nb.clone() for nb in new[i]] for i in range(WORLD)]
        for edge in topo.rounds[r] if t > 1 else []:  # step 1 mixes nothing
            hosts = sorted({j // LOCAL for j in edge.ranks})
            assert len(hosts) == 2 and len(edge.ranks) == 2 * LOCAL
            k, w = len(hosts), edge.peer_weight
            for b in range(len(layout)):
                n = old[0][b].numel()
                size = math.ceil(n / LOCAL)
                y = {}
                for h in hosts:
                    ranks = range(h * LOCAL, (h + 1) * LOCAL)
                    total = sum(old[j][b] * w for j in ranks)
                    y[h] = torch.cat([total, total.new_zeros(LOCAL * size - n)])
                out = {h: torch.empty_like(y[h]) for h in hosts}
                for c in range(LOCAL):
                    part = slice(c * size, (c + 1) * size)
                    ref = refs.setdefault(
                        (hosts[0], r, b, c), torch.zeros(size, dtype=torch.float64)
                    )
                    q = {}
                    for h in hosts:
                        dev = y[h][part] - ref
                        q[h] = dev if name is None else compressed(name, dev)
                    s = q[hosts[0]] + q[hosts[1]]
                    for h in hosts:
                        out[h][part] = k * y[h][part] + s - k * q[h]
                    refs[(hosts[0], r, b, c)] = ref + s / k
                if name is None:  # exact phase 2: every host holds the edge's sum
                    for h in hosts:
                        assert_close(out[h], y[hosts[0]] + y[hosts[1]], rtol=0, atol=1e-15)
                corr = {j: out[j // LOCAL][:n] - old[j][b] for j in edge.ranks}
                # the edge's corrections add up to zero: the average is exact gossip's
                assert sum(corr.values()).abs().max() < 1e-12
                for j in edge.ranks:
                    mixed[j][b] = new[j][b] + a * corr[j]
        for i, m in enumerate(models):
            set_buckets(m, layout, mixed[i])
    return [flat(m) for m in models]


@pytest.mark.parametrize("compression", ["int8"])
def test_real_runs_match_the_replay_with_int8_between_hosts(compression: str) -> None:
    cfg = {"steps": 6, "alpha": 0.8, "compression": compression}
    results = ok_values(run_distributed(_worker, WORLD, cfg, local_world_size=LOCAL))
    layout = results[0]["layout"]
    expected = _replay(cfg, layout, compression)
    for rank, (res, exp) in enumerate(zip(results, expected)):
        assert_close(res["params"], exp, rtol=TOL, atol=TOL, msg=lambda m, r=rank: f"{r}: {m}")
    # the compressor changed the run: the replay is not exact hierarchical gossip
    exact = _replay(cfg, layout, None)
    assert max((e - x).abs().max().item() for e, x in zip(expected, exact)) > 1e-4
    # bytes: the host's phases exact (float64), between hosts one int8 payload of the chunk
    intra = inter = 0.0
    for numel in results[0]["numels"]:
        size = math.ceil(numel / LOCAL)
        intra += 2 * (LOCAL - 1) * size * 8
        inter += int8_payload(torch.zeros(size, dtype=torch.float64)).numel()
    for res in results:
        assert res["by_link"] == pytest.approx({"intra_host": intra, "inter_host": inter})


def test_what_is_refused_between_hosts() -> None:
    check_compression(HierarchicalTopology(8, 2), parse_compression("int8"))
    check_compression(HierarchicalTopology(8, 2, inter="ring"), parse_compression("bf16"))
    check_compression(HierarchicalTopology(8, 2, inter="complete"), CompressionSpec("none"))
    with pytest.raises(ValueError, match="compression='randk'.*allowed there: none, bf16, int8"):
        check_compression(HierarchicalTopology(8, 2), parse_compression("randk:0.1"))
    with pytest.raises(ValueError, match="edges of 4 hosts"):
        check_compression(HierarchicalTopology(8, 2, inter="complete"), parse_compression("int8"))
    # one host: no edge between hosts, flat compressed gossip inside it
    check_compression(HierarchicalTopology(4, 4), parse_compression("randk:0.1"))


def test_chunk_references_travel_with_the_training_state() -> None:
    spec = parse_compression("int8")
    bucket = Bucket(0, [torch.nn.Parameter(torch.zeros(8, dtype=torch.float32))], ["w"], True)
    saved = GossipCompressor(spec)
    saved.refs[(0, 0)] = torch.zeros(bucket.numel, dtype=torch.float64)
    half = bucket.numel // LOCAL  # this rank's chunk
    saved.host_refs[("host", 1, 0)] = torch.arange(half, dtype=torch.float64) + 0.5
    state = saved.state()
    back = GossipCompressor(spec)
    back.load_state(state)
    assert torch.equal(back.host_refs[("host", 1, 0)], saved.host_refs[("host", 1, 0)])
    back.place([bucket])
    assert back.host_refs[("host", 1, 0)].dtype == torch.float32
    back.load_state(None)  # an older state: every reference starts afresh
    assert not back.host_refs
    back.load_state({**state, "host_refs": {"1:0": torch.zeros(bucket.numel + 1)}})
    with pytest.raises(ValueError, match="1:0 \\(host chunk\\) does not fit"):
        back.place([bucket])
