"""The decisions behind the CUDA/NCCL paths that can be reached on CPU.

Their GPU halves are in ``test_gpu.py``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from decent_dp import DecentralizedDataParallel
from decent_dp._comm.groups import communicators_per_rank
from decent_dp._engine.device import records_cuda_graphs
from decent_dp.optim import optim_fn_sgd
from decent_dp.topo import Edge, Topology, TopologyReg
from tests.support.dist_harness import free_port, run_distributed


# ------------------------------------------------ the topology's edges in the signature
class _PairsByRank(Topology):
    """Rank 0 pairs (0 1)(2 3); every other rank builds (0 2)(1 3): same name and period."""

    def _get_topo_edges(self) -> list[list[Edge]]:
        if dist.get_rank() == 0:
            return [[Edge([0, 1], 0.5), Edge([2, 3], 0.5)]]
        return [[Edge([0, 2], 0.5), Edge([1, 3], 0.5)]]


def _wrap_rank_dependent_topology(rank: int, world: int) -> str:
    model = nn.Linear(4, 2)
    try:
        DecentralizedDataParallel(model, optim_fn_sgd, topology=_PairsByRank(world, world))
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_a_topology_whose_edges_differ_across_ranks_fails_on_every_rank_in_one_line() -> None:
    results = run_distributed(_wrap_rank_dependent_topology, 4, timeout=60)
    assert [s for s, _ in results] == ["ok"] * 4, results
    for _, message in results:
        assert "ranks disagree on the edges" in message and "round 0" in message, message
        assert "\n" not in message


# ------------------------------------------------ communicators per rank
@pytest.mark.parametrize(
    ("name", "world", "expected"),
    [
        ("complete", 8, [1] * 8),  # the default group
        ("ring", 8, [2] * 8),
        ("one-peer-exp", 8, [3] * 8),
        ("one-peer-exp", 32, [5] * 32),
    ],
)
def test_communicators_per_rank(name: str, world: int, expected: list[int]) -> None:
    assert communicators_per_rank(TopologyReg.create(name, world, world)) == expected


def test_communicators_per_rank_count_each_distinct_group_once() -> None:
    class Repeats(Topology):
        def _get_topo_edges(self) -> list[list[Edge]]:
            a = [Edge([0, 1], 0.5), Edge([2, 3], 0.5)]
            b = [Edge([0, 2], 0.5), Edge([1], 1.0), Edge([3], 1.0)]
            return [a, b, a]

    assert communicators_per_rank(Repeats(4, 4)) == [2, 1, 2, 1]


# ------------------------------------------------ CUDA graphs and the swapping storage
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize(
    ("kwargs", "graphs"),
    [
        ({"backend": "cudagraphs"}, True),
        ({"backend": "eager"}, False),
        # Inductor's modes: importing Inductor costs about 15 s on a busy 2-core machine
        *(
            pytest.param(kwargs, graphs, marks=pytest.mark.slow)
            for kwargs, graphs in [
                ({}, False),
                ({"mode": "default"}, False),
                ({"mode": "reduce-overhead"}, True),
                ({"mode": "max-autotune"}, True),
                ({"mode": "max-autotune-no-cudagraphs"}, False),
            ]
        ),
    ],
)
def test_records_cuda_graphs_reads_what_torch_compile_leaves(
    kwargs: dict[str, Any], graphs: bool
) -> None:
    assert records_cuda_graphs(torch.compile(_mlp(), **kwargs)) is graphs
    forward_compiled = _mlp()
    forward_compiled.forward = torch.compile(forward_compiled.forward, **kwargs)  # type: ignore[method-assign]
    assert records_cuda_graphs(forward_compiled) is graphs
    block_compiled = _mlp()
    block_compiled[0].compile(**kwargs)  # a compiled block inside the model
    assert records_cuda_graphs(block_compiled) is graphs
    assert records_cuda_graphs(_mlp()) is False


@pytest.fixture
def world_of_one() -> Any:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _wrap_caught(model: nn.Module, **kwargs: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DecentralizedDataParallel(model, optim_fn_sgd, topology="complete", **kwargs).close()
    return [str(w.message) for w in caught if "stable_param_storage=True" in str(w.message)]


def test_wrapping_a_cuda_graph_forward_warns_to_keep_the_storage(world_of_one: None) -> None:
    assert len(_wrap_caught(torch.compile(_mlp(), backend="cudagraphs"))) == 1
    assert (
        _wrap_caught(torch.compile(_mlp(), backend="cudagraphs"), stable_param_storage=True) == []
    )
    assert _wrap_caught(torch.compile(_mlp(), backend="eager")) == []
    assert _wrap_caught(_mlp()) == []


# ------------------------------------------------ fp16: the fused unscale and inf check
def _scaled_run(rank: int, world: int, inf_at: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    ddp = DecentralizedDataParallel(
        model, optim_fn_sgd, topology="complete", scaler=scaler, bucket_size_in_mb=0
    )
    g = torch.Generator().manual_seed(0)  # the same batches: the workers stay identical
    scales = []
    for step in range(5):
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        loss = nn.functional.cross_entropy(ddp(x), y)
        if step == inf_at and rank == 1:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scales.append(float(scaler.get_scale()))
    return {"scales": scales, "params": [p.detach().clone() for p in model.parameters()]}


def test_fused_unscale_skips_every_worker_on_one_inf_and_keeps_the_scale_equal() -> None:
    results = run_distributed(_scaled_run, 2, 2, timeout=60)
    assert [s for s, _ in results] == ["ok", "ok"], results
    a, b = (v for _, v in results)
    # growth every 2 good steps: 1024 -> 2048 after steps 0-1, halved at the inf of step 2
    assert a["scales"] == b["scales"] == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0]
    for pa, pb in zip(a["params"], b["params"]):
        torch.testing.assert_close(pa, pb, rtol=0, atol=1e-6)  # complete: identical workers


def test_cpu_tests_see_no_gpu_and_their_ranks_pick_gloo_on_cpu() -> None:
    """Holds on a GPU machine too: only ``gpu`` tests touch CUDA."""
    from tests.support.dist_harness import ok_values, run_distributed

    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ""
    ranks = run_distributed(_backend_worker, 2, init=False, start_method="spawn")
    for res in ok_values(ranks):
        assert res == {"backend": "gloo", "device": "cpu", "cuda": False}


def _backend_worker(rank: int, world: int) -> dict[str, object]:
    import torch.distributed as dist

    from decent_dp.utils import get_device, initialize_dist

    initialize_dist()  # the choice a training run makes: NCCL on a visible GPU
    try:
        return {
            "backend": dist.get_backend(),
            "device": str(get_device()),
            "cuda": torch.cuda.is_available(),
        }
    finally:
        dist.destroy_process_group()
