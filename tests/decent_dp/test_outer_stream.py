"""Streaming outer rounds (``outer_fragments``) on real gloo groups against a float64 replay.

The replay follows :mod:`decent_dp._outer` bucket by bucket: bucket ``b``
belongs to fragment ``f = b % F``, shifted by ``s = f H / F`` steps; at the
steps ``t`` with ``(t - s) % H == 0`` its outer copy steps on ``x_outer -
xbar(t-1)`` and every worker continues from ``x_outer + d(t)``, at the other
steps it mixes with the topology's round ``(t - s - 1) mod period``. Step 1
mixes nothing (no gossip precedes it). One bucket per parameter, so that the
six parameters of the test MLP are six buckets.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from decent_dp import DecentralizedDataParallel
from decent_dp.topo import LocalSGDTopology, mixing_matrices
from tests.support.ddp_cases import flat, loss_of, make_model, make_optim, set_flat, train_steps
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
    return DecentralizedDataParallel(
        model,
        optim_fn=make_optim(cfg),
        topology=topology(cfg, dist.get_world_size()),
        bucket_size_in_mb=0,  # one bucket per parameter
        stable_param_storage=cfg.get("stable", False),
        outer_optim_fn=outer_fn(cfg),
        outer_every=cfg["every"],
        outer_fragments=cfg["fragments"],
    )


def runs_worker(rank: int, world: int, cfgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Train one wrapper per cfg in the same process group; return each one's result."""
    out = []
    for cfg in cfgs:
        ddp = wrap(make_model("mlp", seed=rank), cfg)
        train_steps(ddp, rank, cfg, 1, cfg["steps"])
        out.append(
            {
                "params": flat(ddp.module),
                "layout": [b["names"] for b in ddp.buckets_info],
                "bytes": ddp.comm_bytes_per_step(),
                "peak": ddp.comm_peak_bytes_per_step(),
            }
        )
        ddp.close()
    return out


def replay(cfg: dict[str, Any], world: int, layout: list[list[str]]) -> list[torch.Tensor]:
    """Single-process float64 replay of streaming outer rounds on the wrapper's bucket layout.

    With ``cfg["plain"]`` an outer round is the plain average ``xbar(t-1)`` (no
    outer optimizer): shifted local-sgd or gossip with shifted global averages.
    """
    every, frags = cfg["every"], cfg["fragments"]
    mats = mixing_matrices(topology(cfg, world), world, 1)
    start = make_model("mlp", seed=0)  # rank 0's initial model is broadcast
    models = [make_model("mlp", seed=0) for _ in range(world)]
    for m in models:
        set_flat(m, flat(start))
    optims = [make_optim(cfg)([(p, n) for n, p in m.named_parameters()]) for m in models]
    init = dict(start.named_parameters())
    x_outer = [[init[n].detach().clone() for n in names] for names in layout]
    outer_opts = [outer_fn(cfg)(xs) for xs in x_outer]
    for t in range(1, cfg["steps"] + 1):
        old = [{n: p.detach().clone() for n, p in m.named_parameters()} for m in models]
        for i, (m, opt) in enumerate(zip(models, optims)):
            opt.zero_grad(set_to_none=True)
            loss_of(m, i, t).backward()
            opt.step()
        params = [dict(m.named_parameters()) for m in models]
        for b, names in enumerate(layout):
            shift = (b % frags) * (every // frags)
            due = t > 1 and (t - shift) % every == 0  # no gossip precedes the first step
            if due and not cfg.get("plain"):
                for j, n in enumerate(names):
                    x = x_outer[b][j]
                    x.grad = x - torch.stack([o[n] for o in old]).mean(0)
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
