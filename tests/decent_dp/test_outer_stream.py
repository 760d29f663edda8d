"""Streaming and compressed outer rounds on real gloo groups against a float64 replay.

The replay follows :mod:`decent_dp._engine.outer` bucket by bucket: bucket ``b``
belongs to fragment ``f = b % F``, shifted by ``s = f H / F`` steps; at the
steps ``t`` with ``(t - s) % H == 0`` its outer copy steps on ``x_outer -
xbar(t-1)`` and every worker continues from ``x_outer + d(t)``, at the other
steps it mixes with the topology's round ``(t - s - 1) mod period``. Step 1
mixes nothing (no gossip precedes it). One bucket per parameter, so that the
six parameters of the test MLP are six buckets. Compressed outer rounds
(``outer_compression``) replace ``xbar`` by the mean of the decoded
compressed ``Delta_i`` (:func:`mean_delta`), decoded with the re-derived
compressors of :mod:`tests.support.codecs`, not with the library's.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp._engine.bucket import aligned_offsets
from decent_dp.compression.codecs import chunk_len
from decent_dp.topo import LocalSGDTopology
from tests.support.codecs import bf16_value, int8_value
from tests.support.ddp_cases import (
    batch,
    flat,
    loss_of,
    make_model,
    make_optim,
    replay_workers,
    set_flat,
    train_steps,
)
from tests.support.dist_harness import ok_values, run_distributed

ATOL = 1e-9
NESTEROV = {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}
UNIT = {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}


def outer_fn(cfg: dict[str, Any]) -> Any:
    return partial(
        torch.optim.SGD,
        lr=cfg["outer_lr"],
        momentum=cfg["outer_momentum"],
        nesterov=cfg["nesterov"],
    )


def topology(cfg: dict[str, Any], world: int) -> Any:
    if cfg["topology"] == "local-sgd":
        return LocalSGDTopology(world, 1, period=cfg["every"])
    return cfg["topology"]


def wrap(model: torch.nn.Module, cfg: dict[str, Any]) -> DecentralizedDataParallel:
    """The cfg's wrapper; ``fragments`` 0 leaves the outer optimizer out (``every`` is then
    only local-sgd's period)."""
    return DecentralizedDataParallel(
        model,
        optim_fn=make_optim(cfg),
        topology=topology(cfg, dist.get_world_size()),
        bucket_size_in_mb=cfg.get("bucket_mb", 0),  # 0: one bucket per parameter
        param_as_bucket_view=cfg.get("view", True),
        stable_param_storage=cfg.get("stable", False),
        outer_optim_fn=outer_fn(cfg) if cfg["fragments"] else None,
        outer_every=cfg["every"] if cfg["fragments"] else None,
        outer_fragments=cfg["fragments"] or 1,
        outer_compression=cfg.get("outer_compression"),
        compression=cfg.get("compression"),
    )


def runs_worker(rank: int, world: int, cfgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Train one wrapper per cfg in the same process group; return each one's result."""
    out = []
    for cfg in cfgs:
        ddp = wrap(make_model(cfg.get("kind", "mlp"), seed=rank), cfg)
        train_steps(ddp, rank, cfg, 1, cfg["steps"])
        out.append(
            {
                "params": flat(ddp.module),
                "layout": [b["names"] for b in ddp.buckets_info],
                "bytes": ddp.comm_bytes_per_step(),
                "peak": ddp.comm_peak_bytes_per_step(),
                "outer": torch.cat(
                    [x.reshape(-1) for xs in ddp._engine.outer.copies for x in xs]
                    if ddp._engine.outer is not None
                    else [torch.zeros(0)]
                ),
            }
        )
        ddp.close()
    return out


def block(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The bucket block of ``tensors`` (float64, each at a 256-byte boundary, padding zero)."""
    offsets, total = aligned_offsets(tensors, 8)
    out = torch.zeros(total, dtype=torch.float64)
    for t, o in zip(tensors, offsets):
        out[o : o + t.numel()] = t.detach().reshape(-1)
    return out


def unblock(values: torch.Tensor, xs: list[torch.Tensor]) -> None:
    """Hand each tensor of the bucket its part of ``values`` as its gradient."""
    offsets, _ = aligned_offsets(xs, 8)
    for x, o in zip(xs, offsets):
        x.grad = values[o : o + x.numel()].view_as(x).clone()


def quantized(name: str, v: torch.Tensor) -> torch.Tensor:
    """What the compressor's payload of ``v`` decodes to (the documented format)."""
    return int8_value(v) if name == "int8" else bf16_value(v)


def mean_delta(name: str, deltas: list[torch.Tensor]) -> torch.Tensor:
    """The mean of the compressed ``Delta_i`` every rank decodes (rank order).

    A pair sums both decoded payloads; a larger group cuts the block into ``k``
    chunks, member ``c`` sums everyone's decoded chunk ``c`` and compresses the
    sum, and everyone decodes the ``k`` sums.
    """
    k, n = len(deltas), deltas[0].numel()
    if k == 1:
        return deltas[0]  # nothing is sent alone
    if k == 2:
        return (quantized(name, deltas[0]) + quantized(name, deltas[1])) / k
    m = chunk_len(n, k)
    padded = [torch.cat([d, d.new_zeros(k * m - n)]) for d in deltas]
    own = [[quantized(name, v[c * m : (c + 1) * m]) for c in range(k)] for v in padded]
    sums = [sum(own[j][c] for j in range(k)) for c in range(k)]
    return torch.cat([quantized(name, sc) for sc in sums])[:n] / k


def replay(cfg: dict[str, Any], world: int, layout: list[list[str]]) -> list[torch.Tensor]:
    """Single-process float64 replay of streaming outer rounds on the wrapper's bucket layout.

    With ``cfg["plain"]`` an outer round is the plain average ``xbar(t-1)`` (no
    outer optimizer): shifted local-sgd or gossip with shifted global averages.
    With ``cfg["outer_compression"]`` the outer gradient is :func:`mean_delta` of
    the workers' ``x_outer - x_i(t-1)`` over each bucket's block. With
    ``cfg["fail_at"] = (t, i)`` worker ``i``'s backward of step ``t`` stops before
    ``l1``: those buckets take no update then (the wrapper's recovery).
    """
    every, frags = cfg["every"], cfg["fragments"]
    mats, start, models, optims = replay_workers(topology(cfg, world), world, cfg)
    init = dict(start.named_parameters())
    x_outer = [[init[n].detach().clone() for n in names] for names in layout]
    outer_opts = [outer_fn(cfg)(xs) for xs in x_outer]
    for t in range(1, cfg["steps"] + 1):
        old = [{n: p.detach().clone() for n, p in m.named_parameters()} for m in models]
        for i, (m, opt) in enumerate(zip(models, optims)):
            opt.zero_grad(set_to_none=True)
            loss_of(m, i, t, 0, cfg.get("kind", "mlp")).backward()
            if cfg.get("fail_at") == (t, i):
                m.l1.weight.grad = m.l1.bias.grad = None
            opt.step()
        params = [dict(m.named_parameters()) for m in models]
        for b, names in enumerate(layout):
            shift = (b % frags) * (every // frags)
            due = t > 1 and (t - shift) % every == 0  # no gossip precedes the first step
            if due and not cfg.get("plain"):
                name = cfg.get("outer_compression")
                if name is None:
                    for j, n in enumerate(names):
                        x = x_outer[b][j]
                        x.grad = x - torch.stack([o[n] for o in old]).mean(0)
                else:
                    deltas = [block([x - o[n] for x, n in zip(x_outer[b], names)]) for o in old]
                    unblock(mean_delta(name, deltas), x_outer[b])
                outer_opts[b].step()
            w = mats[(t - shift - 1) % len(mats)]
            for j, n in enumerate(names):
                stacked = torch.stack([o[n] for o in old])
                for i in range(world):
                    if t == 1:
                        mixed = stacked[i]
                    elif due:
                        mixed = stacked.mean(0) if cfg.get("plain") else x_outer[b][j].detach()
                    else:
                        mixed = torch.einsum("j,j...->...", w[i], stacked)
                    with torch.no_grad():
                        params[i][n].copy_(mixed + (params[i][n] - old[i][n]))
        if cfg.get("global_avg_at") == t:
            mean = torch.stack([flat(m) for m in models]).mean(0)
            for m in models:
                set_flat(m, mean)
    return [flat(m) for m in models]


def check_runs(cfgs: list[dict[str, Any]], world: int = 4) -> list[list[dict[str, Any]]]:
    """Run every cfg on ``world`` gloo ranks and compare each rank with the replay."""
    results = ok_values(run_distributed(runs_worker, world, cfgs))
    for c, cfg in enumerate(cfgs):
        layout = results[0][c]["layout"]
        expected = replay(cfg, world, layout)
        for rank, (res, exp) in enumerate(zip(results, expected)):
            assert_close(
                res[c]["params"],
                exp,
                rtol=0,
                atol=ATOL,
                msg=lambda m, r=rank, k=cfg: f"{k} rank {r}: {m}",
            )
    return results


# H / F odd in both: a fragment's topology rounds are shifted by an odd number of
# steps, which one-peer-exp's period of 2 tells apart from no shift
SHAPES = [pytest.param(2, 6, id="F2-H6"), pytest.param(3, 9, id="F3-H9")]


@pytest.mark.parametrize(("fragments", "every"), SHAPES)
def test_fragments_match_the_replay(fragments: int, every: int) -> None:
    base = {"fragments": fragments, "every": every, "steps": 2 * every + 2}
    cfgs = [
        {**base, "topology": topology, **outer, "plain": plain}
        for topology in ("local-sgd", "one-peer-exp")
        for outer, plain in ((NESTEROV, False), (UNIT, True))
    ]
    results = check_runs(cfgs)
    for c, cfg in enumerate(cfgs):
        # the workers drift apart after each fragment's outer round: a non-trivial run
        spread = (results[0][c]["params"] - results[1][c]["params"]).abs().max()
        assert spread > 1e-6, cfg


def test_one_fragment_is_the_unfragmented_schedule() -> None:
    """F=1 against the same replay: the schedule of outer_every alone."""
    check_runs([{"fragments": 1, "every": 3, "steps": 8, "topology": "ring", **NESTEROV}])


def test_outer_round_at_step_one_is_skipped_and_global_avg_keeps_the_outer_rounds() -> None:
    """H/F = 1: fragment 1 is due at step 1, which no gossip precedes (its first outer round is
    step 3). A global average after step 4: step 5 is fragment 1's outer round, which still
    takes place, and fragment 0's local step."""
    check_runs(
        [
            {"fragments": 2, "every": 2, "steps": 7, "topology": "local-sgd", **NESTEROV},
            {
                **{"fragments": 2, "every": 2, "steps": 7, "topology": "one-peer-exp"},
                **NESTEROV,
                "global_avg_at": 4,
                "optim": "adam",
            },
        ]
    )


def test_peak_bytes_fall_with_fragments_and_the_mean_stays() -> None:
    """Under local-sgd with period H every bucket is all-reduced once per H steps, with or
    without fragments; fragments spread those all-reduces over the period."""
    cfgs = [
        {"fragments": f, "every": 6, "steps": 2, "topology": "local-sgd", **NESTEROV}
        for f in (1, 2, 3, 6)
    ]
    results = ok_values(run_distributed(runs_worker, 4, cfgs))[0]
    numels = []
    for names in results[0]["layout"]:
        params = dict(make_model("mlp", 0).named_parameters())
        numels.append(-(-params[names[0]].numel() // 32) * 32)  # float64, 256-byte aligned
    per_bucket = [2 * 3 / 4 * 8 * n for n in numels]  # ring all-reduce over 4 ranks
    for f, res in zip((1, 2, 3, 6), results):
        assert res["bytes"] == pytest.approx(sum(per_bucket) / 6, rel=1e-12)
        peak = max(sum(per_bucket[b] for b in range(len(numels)) if b % f == g) for g in range(f))
        assert res["peak"] == pytest.approx(peak, rel=1e-12)
    assert results[3]["peak"] < results[0]["peak"] / 3


def _warn_worker(rank: int, world: int) -> list[str]:
    cfg = {"fragments": 8, "every": 8, "steps": 1, "topology": "complete", **NESTEROV}
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ddp = wrap(make_model("mlp", seed=0), cfg)
        train_steps(ddp, rank, cfg, 1, 1)
        ddp.close()
    return [str(w.message) for w in caught if "outer_fragments" in str(w.message)]


def test_more_fragments_than_buckets_warns_once_buckets_exist() -> None:
    (messages,) = ok_values(run_distributed(_warn_worker, 1))
    assert len(messages) == 1 and "6 bucket(s)" in messages[0] and "6..7" in messages[0]


# ------------------------------------------------------------------ compressed outer rounds
@pytest.mark.parametrize("fragments", [1, 2])
def test_compressed_outer_rounds_match_the_replay(fragments: int) -> None:
    """Four ranks: the two-phase exchange; every rank steps the same x_outer, bit for bit."""
    base = {"fragments": fragments, "every": 4, "steps": 11, **NESTEROV}
    cfgs = [
        {**base, "topology": "local-sgd", "outer_compression": "int8"},
        {**base, "topology": "one-peer-exp", "outer_compression": "bf16", "optim": "adamw"},
    ]
    results = check_runs(cfgs)
    exact = replay({**cfgs[0], "outer_compression": None}, 4, results[0][0]["layout"])
    for c in range(len(cfgs)):
        for res in results[1:]:
            assert torch.equal(res[c]["outer"], results[0][c]["outer"])
    # the compression changed something: the replay is not the exact run
    assert (exact[0] - results[0][0]["params"]).abs().max() > 1e-6


def test_compressed_outer_rounds_of_a_pair_match_the_replay() -> None:
    """Two ranks: the pair all-gathers its payloads and sums them in rank order."""
    cfg = {"fragments": 2, "every": 4, "steps": 9, "topology": "local-sgd", **NESTEROV}
    results = check_runs([{**cfg, "outer_compression": "int8"}], world=2)
    assert torch.equal(results[0][0]["outer"], results[1][0]["outer"])


def _skewed_worker(rank: int, world: int) -> dict[str, Any]:
    """Fragments over a world group with compressed gossip too, ranks late by turns."""
    import time

    cfg = {"fragments": 2, "every": 2, "topology": "complete", **NESTEROV}
    ddp = wrap(make_model("mlp", seed=rank), {**cfg, "compression": "int8"})
    for t in range(1, 9):
        a, b = batch(rank, t)
        out = ddp(a, t, rank)
        if (rank + t) % 2:
            time.sleep(0.02)  # some ranks step a bucket early, others at the end of backward
        ((out - b) ** 2).mean().backward()
    outer = torch.cat([x.reshape(-1) for xs in ddp._engine.outer.copies for x in xs])
    ddp.close()
    return {"outer": outer}


def test_fragments_with_two_phase_gossip_on_the_world_group_keep_one_order() -> None:
    """A bucket's outer all-reduce and another's second phase both use the world group: the
    second phases run on a group of their own, so the ranks cannot issue them in two orders."""
    results = ok_values(run_distributed(_skewed_worker, 4, timeout=60))
    for res in results[1:]:
        assert torch.equal(res["outer"], results[0]["outer"])


def _bytes_worker(rank: int, world: int, cfgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the collectives move in each step, beside what the wrapper says it sends.

    Launches (all-reduces, all-to-alls, a pair's all-gather) happen during the
    step before the one that mixes them; second phases (the all-gathers of
    groups of more than two) during that step or the final drain.
    """
    from decent_dp._comm import compressed as _compression

    out = []
    real_a2a, real_gather, real_ar = (
        dist.all_to_all_single,
        _compression._all_gather,
        dist.all_reduce,
    )
    for cfg in cfgs:
        sent: dict[int, float] = {}
        ddp = wrap(make_model("mlp", seed=rank), cfg)

        def note(nbytes: float, launch: bool, ddp: Any = ddp, sent: dict[int, float] = sent):
            step = ddp.step_count + (2 if launch else 1)  # the step that mixes it
            sent[step] = sent.get(step, 0.0) + nbytes

        def a2a(o, i, group=None, async_op=False, note=note):
            k = dist.get_world_size(group)
            note(i.numel() * i.element_size() * (k - 1) / k, True)  # the own chunk stays
            return real_a2a(o, i, group=group, async_op=async_op)

        def gather(o, i, group=None, async_op=False, note=note):
            k = dist.get_world_size(group)
            note(i.numel() * i.element_size() * (k - 1), k == 2)
            return real_gather(o, i, group=group, async_op=async_op)

        def all_reduce(t, op=dist.ReduceOp.SUM, group=None, async_op=False, note=note):
            k = dist.get_world_size(group)
            note(2 * (k - 1) / k * t.numel() * t.element_size(), True)
            return real_ar(t, op=op, group=group, async_op=async_op)

        dist.all_to_all_single, _compression._all_gather, dist.all_reduce = a2a, gather, all_reduce
        try:
            train_steps(ddp, rank, cfg, 1, cfg["steps"])
            ddp._engine.drain()  # starts the second phases of the rounds launched last
        finally:
            dist.all_to_all_single, _compression._all_gather, dist.all_reduce = (
                real_a2a,
                real_gather,
                real_ar,
            )
        out.append(
            {
                "sent": sent,
                "mean": ddp.comm_bytes_per_step(),
                "peak": ddp.comm_peak_bytes_per_step(),
            }
        )
        ddp.close()
    return out


def test_bytes_count_the_compressed_outer_rounds_the_collectives_move() -> None:
    base = {"fragments": 2, "every": 4, "steps": 8, "outer_compression": "int8", **NESTEROV}
    cfgs = [
        {**base, "topology": "local-sgd"},
        {**base, "topology": "local-sgd", "outer_compression": None},
        {**base, "topology": "one-peer-exp", "compression": "bf16"},
        {**base, "topology": "local-sgd", "fragments": 0, "outer_compression": None},  # no outer
    ]
    results = ok_values(run_distributed(_bytes_worker, 4, cfgs))
    for res in results:
        for r in res:
            # steps 2..9 hold every step of two periods (none precedes step 1)
            per_step = [r["sent"].get(t, 0.0) for t in range(2, 10)]
            assert sum(per_step) / 8 == pytest.approx(r["mean"], rel=1e-12)
            assert max(per_step) == pytest.approx(r["peak"], rel=1e-12)
    mine = results[0]
    assert mine[3]["peak"] == pytest.approx(4 * mine[3]["mean"], rel=1e-12)  # one round in 4
    # int8 of float64 values: 1/8 of the exact all-reduce's bytes, plus a float32 scale per
    # chunk, which in these buckets of 32 or 64 elements cut in four is one per 8 or 16
    assert 1 / 8 * mine[1]["mean"] < mine[0]["mean"] < 1.5 / 8 * mine[1]["mean"]


def test_compressed_outer_rounds_of_parameters_apart_from_the_buckets() -> None:
    """DiLoCo with ``param_as_bucket_view=False``: each rank's ``Delta`` is gathered from the
    parameters themselves into the bucket's block, zero between and after them (int8's chunk
    scale reads the padding too): one bucket per parameter, one bucket of all, fragments."""
    base = {"fragments": 1, "every": 4, "steps": 10, "topology": "local-sgd", "view": False}
    base = {**base, "outer_compression": "int8", **NESTEROV}
    cfgs = [
        base,
        {**base, "bucket_mb": 25},
        {**base, "outer_compression": "bf16", "fragments": 2},
    ]
    results = check_runs(cfgs)
    for c, cfg in enumerate(cfgs):
        for res in results[1:]:
            assert torch.equal(res[c]["outer"], results[0][c]["outer"])
        exact = replay({**cfg, "outer_compression": None}, 4, results[0][c]["layout"])
        assert (exact[0] - results[0][c]["params"]).abs().max() > 1e-6  # compression mattered


def test_second_phases_keep_the_launch_order_when_a_backward_fails() -> None:
    """Rank 1's backward of step 4 (an outer round, int8 in two phases) fails before ``l1``;
    the ``branch`` used from step 3 on is the last bucket but completes among the first. Its
    recovery steps the complete buckets in the order they completed, and the others at the
    end in bucket order: the second phases on the world's second group must still start in
    the order the first phases were launched, as on the ranks that did not fail."""
    cfg = {"fragments": 1, "every": 4, "steps": 7, "topology": "local-sgd", **NESTEROV}
    cfg = {**cfg, "outer_compression": "int8", "kind": "late", "fail_at": (4, 1)}
    results = check_runs([cfg])
    for res in results[1:]:
        assert torch.equal(res[0]["outer"], results[0][0]["outer"])
