"""``comm_bytes_per_step()`` and ``comm_peak_bytes_per_step()`` equal what the collectives move.

Every built-in topology on four gloo ranks, exact and compressed gossip, and
outer rounds (exact and compressed, with fragments): each collective a rank
starts is recorded at the ``torch.distributed`` boundary
(:mod:`tests.support.collectives`), turned into the bytes that rank sends, and
charged to the step that mixes its result. Over one span of the schedule
(``lcm(period, H)`` steps, from step 2: nothing precedes step 1) the mean and
the largest step must be the wrapper's numbers exactly. Four ranks keep every
count a dyadic fraction, so the comparison is ``==``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial
from typing import Any

import pytest
import torch

from decent_dp import DecentralizedDataParallel
from decent_dp.topo import TopologyReg
from tests.support.collectives import recording, sent_bytes
from tests.support.ddp_cases import make_model, make_optim, train_steps
from tests.support.dist_harness import ok_values, run_distributed

WORLD = 4
TOPOLOGIES = TopologyReg.names()


def _wrap(model: torch.nn.Module, cfg: dict[str, Any]) -> DecentralizedDataParallel:
    every = cfg.get("every")
    return DecentralizedDataParallel(
        model,
        optim_fn=make_optim({"optim": cfg.get("optim", "sgd")}),
        topology=cfg["topology"],
        local_world_size=1,  # one rank per node: alternating-exp-ring needs several nodes
        bucket_size_in_mb=cfg.get("bucket_mb", 0),
        compression=cfg.get("compression"),
        outer_optim_fn=partial(torch.optim.SGD, lr=0.7, momentum=0.9) if every else None,
        outer_every=every,
        outer_fragments=cfg.get("fragments", 1),
        outer_compression=cfg.get("outer_compression"),
        state_sync=cfg.get("state_sync"),
    )


def _span(cfg: dict[str, Any]) -> int:
    period = TopologyReg.create(cfg["topology"], WORLD, 1).period
    return math.lcm(period, cfg.get("every") or 1, *(cfg.get("state_sync") or {}).values())


def _bytes_worker(rank: int, world: int, cfgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for cfg in cfgs:
        ddp = _wrap(make_model("mlp", seed=rank), cfg)
        sent: dict[int, Fraction] = {}

        def note(kind: str, nbytes: int, k: int, ddp: Any = ddp, sent: Any = sent) -> None:
            # a launch (every collective but a two-phase exchange's second all-gather) is
            # made during the step before the one that mixes it; a second phase during it
            second = kind == "all_gather" and k > 2
            step = ddp.step_count + (1 if second else 2)
            sent[step] = sent.get(step, Fraction(0)) + sent_bytes(kind, nbytes, k)

        with recording(note):
            train_steps(ddp, rank, cfg, 1, _span(cfg))  # mixes 2 .. span + 1
            ddp._engine.drain()  # starts the second phases of the exchanges launched last
        out.append(
            {
                "sent": {str(t): [b.numerator, b.denominator] for t, b in sent.items()},
                "mean": ddp.comm_bytes_per_step(),
                "peak": ddp.comm_peak_bytes_per_step(),
            }
        )
        ddp.close()
    return out


def _check(cfgs: list[dict[str, Any]]) -> None:
    results = ok_values(run_distributed(_bytes_worker, WORLD, cfgs, timeout=300))
    for rank, per_cfg in enumerate(results):
        for cfg, res in zip(cfgs, per_cfg):
            span = _span(cfg)
            sent = {int(t): Fraction(n, d) for t, (n, d) in res["sent"].items()}
            assert set(sent) <= set(range(2, span + 2)), (cfg, rank, sorted(sent))
            steps = [sent.get(t, Fraction(0)) for t in range(2, span + 2)]
            mean, peak = sum(steps) / span, max(steps)
            assert mean > 0, (cfg, rank)
            # exact, or the nearest float where the mean has none (a span of 3 or 6)
            assert Fraction(res["mean"]) == mean or res["mean"] == float(mean), (cfg, rank, mean)
            assert Fraction(res["peak"]) == peak, (cfg, rank, res["peak"], float(peak))


@pytest.mark.parametrize("compression", [None, "bf16", "int8", "randk:0.3"])
def test_gossip_bytes_are_the_collectives_on_every_topology(compression: str | None) -> None:
    _check([{"topology": name, "compression": compression} for name in TOPOLOGIES])


def test_outer_round_bytes_are_the_collectives() -> None:
    """Exact and compressed outer rounds, fragments, over gossip (compressed or not)."""
    cfgs = [
        {"topology": "local-sgd", "every": 8, "fragments": 2, "outer_compression": "int8"},
        {"topology": "local-sgd", "every": 8, "outer_compression": "bf16", "bucket_mb": 25},
        {"topology": "ring", "every": 4, "fragments": 2, "compression": "int8"},
        {"topology": "complete", "every": 4, "fragments": 4, "compression": "bf16"},
        {"topology": "one-peer-exp", "every": 4, "outer_compression": "int8"},
    ]
    _check(cfgs)


def test_state_sync_bytes_are_the_collectives() -> None:
    """Optimizer states sent beside the gossip, every K steps, over exact and compressed gossip."""
    cfgs = [
        {"topology": "one-peer-exp", "state_sync": {"exp_avg_sq": 1}},
        {"topology": "ring", "state_sync": {"exp_avg_sq": 3, "exp_avg": 2}, "compression": "int8"},
        {"topology": "complete", "state_sync": {"exp_avg_sq": 4}, "compression": "bf16"},
        {"topology": "local-sgd", "state_sync": {"exp_avg_sq": 2}, "bucket_mb": 25},
    ]
    _check([dict(c, optim="adam") for c in cfgs])
