"""Compressed gossip: the compressors, and real gloo runs against a float64 replay of the algorithm.

The replay runs every worker in one process in float64 and applies the same
compressor to the same deviation ``x_i - ref`` where the real run does
(after each launch): one payload per member for pairs, and for larger groups
the two phases (each member's chunks to their owners, the owners' sums back
to all). The real runs are float64 too, so the only differences left are the
order of the additions: the tolerance is 1e-12.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp.compression.codecs import (
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
from tests.support.compression_replay import compressed_replay
from tests.support.ddp_cases import (
    assert_same_runs,
    batch,
    flat,
    make_model,
    make_optim,
    resume_worker,
    set_flat,
    topology_of,
    train_steps,
)
from tests.support.dist_harness import ok_values, run_distributed

TOL = 1e-12


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
        topology=topology_of(cfg),
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


@pytest.mark.parametrize("topology", ["ring", "one-peer-exp", "complete", "triples"])
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


# ------------------------------------------------------------------ dtypes
PARAM_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", PARAM_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["bf16", "int8"])
def test_compressors_decode_small_deviations_in_every_dtype(name: str, dtype: torch.dtype) -> None:
    """Late in training the deviations are tiny: they must come back at the compressor's precision."""
    g = torch.Generator().manual_seed(3)
    for magnitude in (1.0, 1e-3, 1e-5):
        v = (torch.randn(2 * INT8_CHUNK + 5, generator=g) * magnitude).to(dtype)
        enc, dec = (int8_encode, int8_decode) if name == "int8" else (bf16_encode, bf16_decode)
        back = dec(enc(v), v.numel(), dtype)
        assert back.dtype == dtype
        err = ((back.double() - v.double()).norm() / v.double().norm()).item()
        # int8: half a step of max/127 per element; bf16: 2^-9 relative; both under 1%
        assert err < 0.01, (name, dtype, magnitude, err)


@pytest.mark.parametrize("dtype", PARAM_DTYPES, ids=str)
def test_randk_selects_exact_values_in_every_dtype(dtype: torch.dtype) -> None:
    v = torch.randn(1000, generator=torch.Generator().manual_seed(4)).to(dtype) * 1e-4
    idx = randk_indices(v.numel(), 0.2, randk_seed(0, 1, 0))
    assert torch.equal(v.index_select(0, idx), v[idx])


def test_randk_indices_are_stratified_and_cover_every_coordinate() -> None:
    n, ratio = 1003, 0.1
    k = randk_count(n, ratio)
    counts = torch.zeros(n)
    for step in range(400):
        idx = randk_indices(n, ratio, randk_seed(0, step, 0))
        assert idx.numel() == k and bool((idx[1:] > idx[:-1]).all())  # sorted, distinct
        bounds = torch.div(torch.arange(k + 1) * n, k, rounding_mode="floor")
        assert bool(((idx >= bounds[:-1]) & (idx < bounds[1:])).all())  # one per stratum
        counts[idx] += 1
    # every coordinate is drawn about ratio of the time (400 * 0.1 = 40 expected)
    assert int(counts.min()) > 15 and int(counts.max()) < 75


def test_randk_draw_does_not_scale_with_the_bucket() -> None:
    """No tensor of the bucket's size is made to pick its coordinates (no permutation, no sort)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.largest = max(self.largest, t.numel())
            return out

    n = 2_000_000
    with Largest() as mode:
        idx = randk_indices(n, 0.001, randk_seed(0, 1, 0))
    assert idx.numel() == randk_count(n, 0.001) == 2000
    assert mode.largest <= 2001


# ------------------------------------------------------------------ large groups
def _invariants_worker(rank: int, world: int, comp: str) -> dict[str, Any]:
    """Distinct models, no local update: compressed gossip alone, on the whole world."""
    ddp = DecentralizedDataParallel(
        make_model("mlp", seed=0),
        optim_fn=lambda ps: torch.optim.SGD([p for _, p in ps], lr=0.0),
        topology="complete",
        bucket_size_in_mb=0,
        compression=comp,
    )
    set_flat(ddp.module, flat(make_model("mlp", seed=rank)))  # distinct, before the buckets exist
    start = flat(ddp.module).clone()
    dists = []
    for t in range(1, 9):
        a, _ = batch(rank, t)
        ddp(a, t, rank).sum().backward()
        dists.append(ddp.consensus_distance())
    refs = ddp.training_state_dict()["compression"]["refs"]
    out = {"start": start, "end": flat(ddp.module), "dists": dists, "refs": refs}
    ddp.close()
    return out


@pytest.mark.parametrize("comp", ["bf16", "int8"])
def test_split_exchange_keeps_the_average_and_the_references_agree(comp: str) -> None:
    res = ok_values(run_distributed(_invariants_worker, 4, comp))
    start = torch.stack([r["start"] for r in res]).mean(0)
    end = torch.stack([r["end"] for r in res]).mean(0)
    assert_close(end, start, rtol=0, atol=1e-13)  # the group's corrections add up to zero
    for r in res[1:]:  # every member moved its references by the same decoded sums
        for key, t in r["refs"].items():
            assert torch.equal(t, res[0]["refs"][key]), key
    d = res[0]["dists"]
    assert d[-1] < 1e-3 * d[0], d  # and the models still reach consensus


def _bytes_worker(rank: int, world: int, comp: str) -> dict[str, Any]:
    """What the collectives move during a real run, beside what the wrapper says it sends."""
    import torch.distributed as dist

    from decent_dp._comm import compressed as _compression

    sent: list[float] = []
    real_a2a, real_gather = dist.all_to_all_single, _compression._all_gather

    def a2a(out, inp, group=None, async_op=False):
        k = dist.get_world_size(group)
        sent.append(inp.numel() * inp.element_size() * (k - 1) / k)  # the own chunk stays
        return real_a2a(out, inp, group=group, async_op=async_op)

    def gather(out, inp, group=None, async_op=False):
        sent.append(inp.numel() * inp.element_size() * (dist.get_world_size(group) - 1))
        return real_gather(out, inp, group=group, async_op=async_op)

    dist.all_to_all_single, _compression._all_gather = a2a, gather
    try:
        model = make_model("mlp", seed=rank)
        ddp = DecentralizedDataParallel(
            model,
            optim_fn=make_optim({}),
            topology="complete",
            bucket_size_in_mb=0,
            compression=comp,
        )
        steps = 5
        for t in range(1, steps + 1):
            a, b = batch(rank, t)
            ((ddp(a, t, rank) - b) ** 2).mean().backward()
        ddp._engine.drain()  # wait() starts the second phase of the exchange launched after the last step
        out = {"sent": sum(sent) / steps, "formula": ddp.comm_bytes_per_step()}
        ddp.close()
    finally:
        dist.all_to_all_single, _compression._all_gather = real_a2a, real_gather
    return out


@pytest.mark.parametrize("comp", ["bf16", "int8"])
def test_bytes_formula_is_what_the_collectives_move(comp: str) -> None:
    for res in ok_values(run_distributed(_bytes_worker, 4, comp)):
        assert res["sent"] == pytest.approx(res["formula"], rel=1e-12)


@pytest.mark.parametrize("n", [4, 8, 16, 32])
def test_compression_saves_bytes_on_every_builtin_topology(n: int) -> None:
    """bf16 at most half of exact gossip's bytes, int8 at most 0.27, whatever the group sizes."""
    from decent_dp.compression import bytes_per_step, inflight_bytes
    from decent_dp.compression.codecs import payload_nbytes

    numels = [25 * 2**20 // 4]  # one 25 MB float32 bucket
    for name in TopologyReg.names():
        topo = TopologyReg.create(name, n, 1)
        for rank in range(n):
            edges = [topo.get_edge(r, rank) for r in range(topo.period)]
            exact = bytes_per_step(parse_compression("none"), edges, numels, 4)
            for comp, ratio in (("bf16", 0.5), ("int8", 0.27)):
                got = bytes_per_step(parse_compression(comp), edges, numels, 4)
                assert got <= ratio * exact, (name, n, rank, comp, got / exact)
            # held in flight: (3k + 1) / k payloads and the own chunk's float32 sum, 4 / k of
            # one int8 payload: (3k + 5) / k <= 14/3 of one member's, whatever k
            payload = payload_nbytes("int8", numels[0], 4)
            for edge in edges:
                k = len(edge.ranks)
                held = inflight_bytes(parse_compression("int8"), numels[0], 4, k)
                assert held <= 14 / 3 * payload * 1.001, (name, n, k, held / payload)


# ------------------------------------------------------------------ outer rounds between
OUTER = {"outer_every": 3, "outer_lr": 0.7}


def _outer_fn(lr: float) -> Any:
    from functools import partial

    return partial(torch.optim.SGD, lr=lr, momentum=0.9, nesterov=True)


def _outer_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    ddp = DecentralizedDataParallel(
        make_model("mlp", seed=rank),
        optim_fn=make_optim(cfg),
        topology=cfg["topology"],
        bucket_size_in_mb=0,
        compression=cfg["compression"],
        outer_optim_fn=_outer_fn(cfg["outer_lr"]),
        outer_every=cfg["outer_every"],
    )
    train_steps(ddp, rank, cfg, 1, cfg["steps"])
    out = {"params": flat(ddp.module), "layout": [b["names"] for b in ddp.buckets_info]}
    ddp.close()
    return out


@pytest.mark.parametrize(("topology", "comp"), [("ring", "int8"), ("complete", "bf16")])
def test_outer_rounds_between_compressed_gossip_match_the_replay(topology: str, comp: str) -> None:
    """Compressed exchanges, an exact outer round every third step, and compressed ones again."""
    cfg = {"topology": topology, "steps": 8, "compression": comp, **OUTER}
    results = ok_values(run_distributed(_outer_worker, 4, cfg))
    expected = compressed_replay(
        {**cfg, "outer_fn": _outer_fn(cfg["outer_lr"])}, 4, results[0]["layout"]
    )
    for rank, (res, exp) in enumerate(zip(results, expected)):
        assert_close(res["params"], exp, rtol=TOL, atol=TOL, msg=lambda m, r=rank: f"rank {r}: {m}")


# ------------------------------------------------------------------ memory
def _memory_worker(rank: int, world: int, topology: str, comp: str) -> dict[str, Any]:
    """What a real compressed run holds: the scratch blocks and each in-flight exchange's buffers."""
    from decent_dp.compression import inflight_bytes
    from decent_dp.compression.codecs import exchange_len

    ddp = DecentralizedDataParallel(
        make_model("mlp", seed=rank),
        optim_fn=make_optim({}),
        topology=topology,
        bucket_size_in_mb=0,  # one bucket per parameter: buckets of different sizes
        compression=comp,
    )
    train_steps(ddp, rank, {}, 1, 3)
    ddp._engine.drain()  # off NCCL the second phases start here: their buffers exist now
    compressor = ddp._engine.gossip.compressor
    assert compressor is not None and ddp._buckets is not None
    spec, name = compressor.spec, compressor.spec.name
    scratch = list(compressor.scratch.values())
    ks = [len(e.ranks) for e in ddp._engine.gossip.edges if len(e.ranks) > 1]
    needs = [
        max(exchange_len(name, b.numel, k) for k in ks) * b.comm.element_size()
        for b in ddp._buckets
    ]
    held, expected, aliased = [], [], 0
    for b in ddp._buckets:
        fl = compressor.inflight.get(b.index)
        if fl is None:
            continue
        bufs = [fl.own, fl.recv, fl.idx, fl.sums, fl.mine, fl.gathered]
        bufs = [t for t in bufs if t is not None]
        held.append(sum(t.numel() * t.element_size() for t in bufs))
        expected.append(inflight_bytes(spec, b.numel, b.comm.element_size(), fl.k))
        storages = {s.untyped_storage().data_ptr() for s in scratch}
        aliased += sum(t.untyped_storage().data_ptr() in storages for t in bufs)
    ddp.close()
    return {
        "scratch": sum(t.numel() * t.element_size() for t in scratch),
        "needs": needs,
        "held": held,
        "expected": expected,
        "aliased": aliased,
    }


@pytest.mark.parametrize(
    ("topology", "comp"),
    [("complete", "int8"), ("complete", "bf16"), ("one-peer-exp", "int8"), ("ring", "randk:0.3")],
)
def test_scratch_is_one_block_of_the_largest_bucket(topology: str, comp: str) -> None:
    """One scratch block sized to the largest bucket's exchange, not one per bucket."""
    for res in ok_values(run_distributed(_memory_worker, 4, topology, comp)):
        assert len(res["needs"]) > 1 and max(res["needs"]) < sum(res["needs"])
        assert res["scratch"] == max(res["needs"])
        assert res["aliased"] == 0  # no payload in flight reads the shared block


@pytest.mark.parametrize(
    ("topology", "comp"),
    [("complete", "int8"), ("complete", "bf16"), ("one-peer-exp", "bf16"), ("ring", "randk:0.3")],
)
def test_inflight_bytes_are_the_buffers_an_exchange_holds(topology: str, comp: str) -> None:
    """The cost model counts every buffer of a real exchange in flight, the chunk's exact sum too."""
    for res in ok_values(run_distributed(_memory_worker, 4, topology, comp)):
        assert res["held"] and res["held"] == res["expected"]
