"""Compressed gossip: the compressors, and real gloo runs against a float64 replay of the algorithm.

The replay runs every worker in one process in float64 and applies the same
compressor to the same deviation ``x_i - ref`` where the real run does
(after each launch), so the only differences left are the rounding of the
real run's additions: the tolerance is 1e-6, against parameters of order 1
and compressor outputs that are exactly representable in float32.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp._bucket import aligned_offsets
from decent_dp._compression import (
    INT8_CHUNK,
    bf16_decode,
    bf16_encode,
    int8_decode,
    int8_encode,
    int8_nbytes,
    parse_compression,
    randk_count,
    randk_indices,
    randk_seed,
)
from decent_dp.topo import TopologyReg
from tests.support.ddp_cases import (
    assert_same_runs,
    flat,
    loss_of,
    make_model,
    make_optim,
    resume_worker,
    set_flat,
    train_steps,
)
from tests.support.dist_harness import ok_values, run_distributed

TOL = 1e-6


# ------------------------------------------------------------------ compressors
def test_int8_round_trip_error_is_half_a_step_per_chunk() -> None:
    g = torch.Generator().manual_seed(0)
    n = 3 * INT8_CHUNK + 17  # a partial last chunk
    v = torch.randn(n, generator=g, dtype=torch.float32) * torch.linspace(1e-4, 10, n)
    v[INT8_CHUNK : 2 * INT8_CHUNK] = 0.0  # a chunk of zeros stays exactly zero
    payload = int8_encode(v)
    assert payload.numel() == int8_nbytes(n) == 4 * 4 + (n + 3) // 4 * 4
    back = int8_decode(payload, n, torch.float32)
    for c in range(4):
        chunk = slice(c * INT8_CHUNK, min(n, (c + 1) * INT8_CHUNK))
        step = v[chunk].abs().max().item() / 127
        err = (back[chunk] - v[chunk]).abs().max().item()
        assert err <= step / 2 * (1 + 1e-5) + 1e-12, (c, err, step)
    assert torch.equal(back[INT8_CHUNK : 2 * INT8_CHUNK], torch.zeros(INT8_CHUNK))
    assert torch.equal(int8_encode(v), payload)  # deterministic
    # the largest entry of a chunk is exact up to the float32 scale
    i = int(v[:INT8_CHUNK].abs().argmax())
    assert abs(back[i].item() - v[i].item()) <= abs(v[i].item()) * 1e-6


def test_bf16_is_round_to_nearest_bfloat16() -> None:
    v = torch.randn(1000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    back = bf16_decode(bf16_encode(v), v.numel(), torch.float64)
    assert bf16_encode(v).numel() == 2000
    assert torch.equal(back, v.to(torch.bfloat16).to(torch.float64))
    assert (back - v).abs().max().item() <= v.abs().max().item() * 2.0**-8


def test_randk_indices_depend_on_the_seed_only() -> None:
    a = randk_indices(5000, 0.1, randk_seed(0, 7, 3))
    b = randk_indices(5000, 0.1, randk_seed(0, 7, 3))
    c = randk_indices(5000, 0.1, randk_seed(0, 8, 3))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.numel() == randk_count(5000, 0.1) == 500
    assert a.unique().numel() == 500 and int(a.min()) >= 0 and int(a.max()) < 5000


@pytest.mark.parametrize(
    "value", ["gzip", "int4", "randk:0", "randk:1.5", "randk:x", "bf16:0.5", 3]
)
def test_bad_compression_is_one_line_value_error(value: Any) -> None:
    with pytest.raises(ValueError, match="compression") as info:
        parse_compression(value)
    assert "\n" not in str(info.value)


def test_parse_compression() -> None:
    assert parse_compression(None).name == "none"
    assert parse_compression("none").name == "none"
    assert parse_compression("randk").ratio == 0.1
    assert parse_compression("randk:0.25").ratio == 0.25
    assert parse_compression("int8").name == "int8"


def test_randk_indices_agree_across_ranks() -> None:
    values = ok_values(run_distributed(_indices_worker, 2))
    assert torch.equal(values[0], values[1])


def _indices_worker(rank: int, world: int) -> torch.Tensor:
    return randk_indices(10_000, 0.05, randk_seed(0, 12, 2))


# ------------------------------------------------------------------ real runs
VARIANTS = [
    ("bf16", "swap"),
    ("int8", "swap"),
    ("randk:0.3", "swap"),
    ("bf16", "inplace"),
    ("int8", "inplace"),
    ("randk:0.3", "inplace"),
    ("int8", "noview"),  # parameters apart from the bucket block: the in-place path, per tensor
    ("randk:0.3", "clip_avg"),  # deferred steps (clipping) and a global average mid-run
]
EXTRA = {"clip_avg": {"clip": 0.5, "global_avg_at": 3}}


def _wrap(model: torch.nn.Module, cfg: dict[str, Any]) -> DecentralizedDataParallel:
    return DecentralizedDataParallel(
        model,
        optim_fn=make_optim(cfg),
        topology=cfg["topology"],
        bucket_size_in_mb=cfg.get("bucket_mb", 0),
        grad_clip_norm=cfg.get("clip", 0.0),
        param_as_bucket_view=cfg.get("path") != "noview",
        stable_param_storage=cfg.get("path") == "inplace",
        compression=cfg.get("compression"),
    )


def _variants_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train one wrapper per variant in the same process group; return each one's result."""
    out: dict[str, Any] = {}
    for comp, path in [(None, "swap"), ("none", "swap"), *VARIANTS]:
        run = {**cfg, "compression": comp, "path": path, **EXTRA.get(path, {})}
        ddp = _wrap(make_model("mlp", seed=rank), run)
        if run.get("alpha") is not None:
            ddp.set_adaptive_factor(run["alpha"])
        train_steps(ddp, rank, run, 1, run["steps"])
        out[f"{comp}/{path}"] = {
            "params": flat(ddp.module),
            "layout": [b["names"] for b in ddp.buckets_info],
            "numel": [b["numel"] for b in ddp.buckets_info],
            "bytes": ddp.comm_bytes_per_step(),
        }
        ddp.close()
    return out


def _buckets_of(model: torch.nn.Module, layout: list[list[str]]) -> list[torch.Tensor]:
    """The model as the wrapper's bucket blocks (padding included, zero)."""
    params = dict(model.named_parameters())
    blocks = []
    for names in layout:
        ps = [params[n] for n in names]
        offsets, total = aligned_offsets(ps, 8)
        block = torch.zeros(total, dtype=torch.float64)
        for p, o in zip(ps, offsets):
            block[o : o + p.numel()] = p.detach().reshape(-1)
        blocks.append(block)
    return blocks


def _set_buckets(model: torch.nn.Module, layout: list[list[str]], blocks: list[torch.Tensor]):
    params = dict(model.named_parameters())
    with torch.no_grad():
        for names, block in zip(layout, blocks):
            ps = [params[n] for n in names]
            offsets, _ = aligned_offsets(ps, 8)
            for p, o in zip(ps, offsets):
                p.copy_(block[o : o + p.numel()].view_as(p))


def _compress(name: str, v: torch.Tensor, for_step: int, bucket: int) -> torch.Tensor:
    """The value the real run's compressor stands for, computed in float64."""
    n = v.numel()
    if name == "bf16":
        return bf16_decode(bf16_encode(v), n, torch.float64)
    if name == "int8":
        return int8_decode(int8_encode(v), n, torch.float64)
    ratio = parse_compression(name).ratio
    idx = randk_indices(n, ratio, randk_seed(0, for_step, bucket))
    q = torch.zeros_like(v)
    q[idx] = v[idx]
    return q


def compressed_replay(
    cfg: dict[str, Any], world: int, layout: list[list[str]]
) -> list[torch.Tensor]:
    """Float64 replay of compressed gossip (see decent_dp._compression) on the given bucket layout."""
    name = cfg["compression"]
    topo = TopologyReg.create(cfg["topology"], world, 1)
    start = make_model("mlp", seed=0)
    models = [make_model("mlp", seed=0) for _ in range(world)]
    for m in models:
        set_flat(m, flat(start))
    optims = [make_optim(cfg)([(p, n) for n, p in m.named_parameters()]) for m in models]
    refs: dict[tuple[int, int, int], torch.Tensor] = {}  # (rank, round, bucket)
    a = cfg.get("alpha", 1.0)
    for t in range(1, cfg["steps"] + 1):
        old = [_buckets_of(m, layout) for m in models]
        for i, (m, opt) in enumerate(zip(models, optims)):
            opt.zero_grad(set_to_none=True)
            loss_of(m, i, t).backward()
            if cfg.get("clip"):
                torch.nn.utils.clip_grad_norm_(m.parameters(), cfg["clip"])
            opt.step()
        new = [_buckets_of(m, layout) for m in models]
        r = (t - 1) % topo.period
        mixed = [[nb.clone() for nb in new[i]] for i in range(world)]
        # step 1 mixes nothing: the first gossip is launched after it (and the models are
        # equal); nor does the step after a global average, which drops the exchange in flight
        # on every rank (and so moves no reference)
        mixes = t > 1 and cfg.get("global_avg_at") != t - 1
        for edge in topo.rounds[r] if mixes else []:
            k = len(edge.ranks)
            if k == 1:
                continue
            w, p = edge.self_weight, edge.peer_weight
            for b in range(len(layout)):
                ref = refs.setdefault((edge.ranks[0], r, b), torch.zeros_like(old[0][b]))
                q = {j: _compress(name, old[j][b] - ref, t, b) for j in edge.ranks}
                s = sum(q[j] for j in sorted(edge.ranks))
                for j in edge.ranks:
                    mixed[j][b] = new[j][b] + a * (p * s + (w - p - 1.0) * q[j])
                ref_new = ref + s / k
                for j in edge.ranks:
                    refs[(j, r, b)] = ref_new
        for i, m in enumerate(models):
            _set_buckets(m, layout, mixed[i])
        if cfg.get("global_avg_at") == t:
            mean = torch.stack([flat(m) for m in models]).mean(0)
            for m in models:
                set_flat(m, mean)
    return [flat(m) for m in models]


@pytest.mark.parametrize("topology", ["ring", "one-peer-exp"])
def test_matches_compressed_replay(topology: str) -> None:
    cfg = {"topology": topology, "steps": 6, "alpha": 0.8}
    results = ok_values(run_distributed(_variants_worker, 4, cfg))
    # compression=None and "none" take today's path: bit for bit the same
    for res in results:
        assert torch.equal(res["None/swap"]["params"], res["none/swap"]["params"])
    plain = [res["None/swap"]["params"] for res in results]
    for comp, path in VARIANTS:
        key = f"{comp}/{path}"
        layout = results[0][key]["layout"]
        expected = compressed_replay({**cfg, "compression": comp, **EXTRA.get(path, {})}, 4, layout)
        for rank, (res, exp) in enumerate(zip(results, expected)):
            assert_close(
                res[key]["params"],
                exp,
                rtol=TOL,
                atol=TOL,
                msg=lambda m, r=rank, k=key: f"{k} rank {r}: {m}",
            )
        # compression changed something: the replay is not plain gossip
        assert max((e - p).abs().max().item() for e, p in zip(expected, plain)) > 1e-4


def test_bytes_per_step_follows_the_payloads() -> None:
    cfg = {"topology": "ring", "steps": 2}
    res = ok_values(run_distributed(_variants_worker, 4, cfg))[0]
    numels = res["None/swap"]["numel"]
    full = sum(n * 8 for n in numels)  # float64 buckets, one payload per pair exchange
    assert res["None/swap"]["bytes"] == res["none/swap"]["bytes"] == full
    assert res["bf16/swap"]["bytes"] == sum(2 * n for n in numels)
    assert res["int8/swap"]["bytes"] == sum(
        4 * math.ceil(n / INT8_CHUNK) + math.ceil(n / 4) * 4 for n in numels
    )
    assert res["randk:0.3/swap"]["bytes"] == sum(8 * math.ceil(0.3 * n) for n in numels)
    assert res["int8/swap"]["bytes"] / full < 0.3 * 0.5  # int8 of float64 is under 1/8 + scales


# ------------------------------------------------------------------ resume
def test_resume_with_compression_is_bit_exact(tmp_path) -> None:
    cfg = {"topology": "one-peer-exp", "steps": 9, "resume_at": 5, "compression": "int8"}
    args = (str(tmp_path),)
    straight = ok_values(run_distributed(resume_worker, 4, cfg, *args, "straight", _wrap))
    ok_values(run_distributed(resume_worker, 4, cfg, *args, "first", _wrap))
    resumed = ok_values(run_distributed(resume_worker, 4, cfg, *args, "second", _wrap))
    assert_same_runs(straight, resumed, 9)
    # a state without references still loads; the references start afresh (and differ)
    before = {**cfg, "drop_train_keys": ["compression"]}  # saved before compression existed
    old = ok_values(run_distributed(resume_worker, 4, before, *args, "second", _wrap))
    assert old[0]["step"] == 9
    assert not torch.equal(old[0]["params"], straight[0]["params"])
