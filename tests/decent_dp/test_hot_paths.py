"""Per-parameter work on the step's hot path, and group creation in one order on every rank.

The kernel counts are read with a dispatch mode around the real step: what
they check is how many elementary operations run, not how long they take.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from decent_dp import DecentralizedDataParallel
from decent_dp._engine.clip import clip_grads_
from decent_dp.topo import Edge, Topology
from tests.support.ddp_cases import (
    assert_same_runs,
    flat,
    make_model,
    make_optim,
    replay,
    resume_worker,
    train_steps,
)
from tests.support.dist_harness import ok_values, run_distributed


class OpCount(TorchDispatchMode):
    """Counts the aten operations run under it, by overload name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def test_clipping_casts_the_norms_once_per_dtype() -> None:
    grads = [torch.randn(3, 4) for _ in range(40)] + [torch.randn(5).half() for _ in range(10)]
    expected = torch.cat([g.double().reshape(-1) for g in grads]).norm()
    copies = [g.clone() for g in grads]
    with OpCount() as count:
        total = clip_grads_(copies, 0.5)
    assert_close(total, expected, rtol=1e-6, atol=0)
    # the norms to float64 once, the coefficient to each of the two dtypes: 3 casts for 50 tensors
    assert count.ops["_to_copy"] <= 3, count.ops


def _decay_worker(rank: int, world: int) -> dict[str, Any]:
    layers = 12
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])
    ddp = DecentralizedDataParallel(
        model,
        optim_fn=lambda ps: torch.optim.SGD([p for _, p in ps], lr=0.1, weight_decay=0.01),
        topology="ring",
        bucket_size_in_mb=25,  # one bucket: the decay of all 24 parameters folds into the mix
    )
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        ddp(x).square().mean().backward()
    with OpCount() as count:
        ddp(x).square().mean().backward()
    return {"add_": count.ops["add_"], "foreach": count.ops["_foreach_add_"], "params": layers * 2}


def test_weight_decay_folds_in_with_one_kernel_per_group() -> None:
    for res in ok_values(run_distributed(_decay_worker, 2)):
        assert res["foreach"] >= 1
        # the backward's own accumulations aside, no add per parameter for the decay
        assert res["add_"] < res["params"], res


class ListedByRank(Topology):
    """``ring``'s edges, each round listed in an order that depends on the rank reading it."""

    def _get_topo_edges(self) -> list[list[Edge]]:
        import torch.distributed as dist

        n = self._world_size
        rounds = [
            [Edge([i, i + 1], 0.5) for i in range(0, n, 2)],
            [Edge([i, (i + 1) % n], 0.5) for i in range(1, n, 2)],
        ]
        return [r[::-1] if dist.get_rank() >= n // 2 else r for r in rounds]


def _listed_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    ddp = DecentralizedDataParallel(
        make_model("mlp", seed=rank),
        optim_fn=make_optim(cfg),
        topology=ListedByRank(world, 1),
        bucket_size_in_mb=0,
    )
    train_steps(ddp, rank, cfg, 1, cfg["steps"])
    return {"params": flat(ddp.module)}


def test_groups_are_created_in_one_order_whatever_order_a_topology_lists() -> None:
    cfg = {"topology": "ring", "steps": 4}
    values = ok_values(run_distributed(_listed_worker, 4, cfg, timeout=60))
    for got, exp in zip(values, replay(cfg, 4)):
        assert_close(got["params"], exp, rtol=0, atol=1e-9)


# the paper's scripts compile the forward; the other two ways run in the slow suite
@pytest.mark.parametrize(
    "how",
    [
        # slow, each: a compiled resume; compiled training is checked fast in test_lifecycle
        pytest.param("forward", marks=pytest.mark.slow),
        pytest.param("module", marks=pytest.mark.slow),
        pytest.param("wrapper", marks=pytest.mark.slow),
    ],
)
def test_resume_is_bit_exact_under_each_way_of_compiling(how: str, tmp_path) -> None:
    """``model.forward = torch.compile(...)``, ``torch.compile(model)`` and ``torch.compile(wrapper)``."""
    cfg = {"topology": "ring", "steps": 6, "resume_at": 3, "compile": how}
    args = (str(tmp_path),)
    straight = ok_values(run_distributed(resume_worker, 2, cfg, *args, "straight"))
    ok_values(run_distributed(resume_worker, 2, cfg, *args, "first"))
    saved = torch.load(tmp_path / "rank0.pt", weights_only=True)
    assert not any(k.startswith("_orig_mod.") for k in saved["model"])
    resumed = ok_values(run_distributed(resume_worker, 2, cfg, *args, "second"))
    assert_same_runs(straight, resumed, 6)
