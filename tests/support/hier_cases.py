"""Worker bodies of the hierarchical-gossip tests: several runs per process group, and a spy
that counts the bytes handed to each collective (the real collective still runs).

The topology travels to the workers as a :class:`decent_dp.topo.HierarchicalTopology`
instance in the cfg (forked workers inherit it), so that the replay of
:mod:`tests.support.ddp_cases` builds the very same matrices from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

import decent_dp._comm.hierarchical as hier
from decent_dp import DecentralizedDataParallel
from decent_dp.topo import HierarchicalTopology
from tests.support.ddp_cases import flat, make_model, make_optim, train_steps, train_worker, wrap

__all__ = ["collective_bytes", "hier_cfg", "hosts_of_two", "runs_worker", "spy_worker"]


def hier_cfg(hosts: int, local: int, inter: str = "one-peer-exp", **cfg: Any) -> dict[str, Any]:
    """A ddp_cases cfg whose topology is ``hierarchical`` over ``hosts`` hosts of ``local`` ranks."""
    topo = HierarchicalTopology(hosts * local, local, inter=inter, inter_kwargs=cfg.pop("ik", None))
    return {"topology": topo, "local_world_size": local, "bucket_mb": 0, **cfg}


def hosts_of_two(
    rank: int, world: int, compression: str | None = None
) -> DecentralizedDataParallel:
    """Rank ``rank``'s mlp wrapped with ``hierarchical`` over hosts of 2 ranks, a bucket per parameter."""
    return DecentralizedDataParallel(
        make_model("mlp", seed=rank),
        make_optim({}),
        topology=HierarchicalTopology(world, 2),
        local_world_size=2,
        bucket_size_in_mb=0,
        compression=compression,
    )


def runs_worker(rank: int, world: int, cfgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`tests.support.ddp_cases.train_worker` for each cfg, in one process group."""
    return [train_worker(rank, world, cfg) for cfg in cfgs]


def _spy(
    log: list[tuple[str, list[int], int]], kind: str, fn: Callable[..., Any], at: int
) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group")
        ranks = (
            list(range(dist.get_world_size()))
            if group is None
            else dist.get_process_group_ranks(group)
        )
        t = args[at]
        log.append((kind, ranks, t.numel() * t.element_size()))
        return fn(*args, **kwargs)

    return call


def collective_bytes(log: list[tuple[str, list[int], int]], local: int) -> tuple[float, float]:
    """Bytes sent by one rank for the logged collectives (bandwidth-optimal ring algorithms):
    ``(g-1)/g`` of a reduce-scatter's input and of an all-gather's output, ``2 (g-1)/g`` of an
    all-reduce's tensor; inside one host or between hosts, by the group's ranks."""
    intra = inter = 0.0
    for kind, ranks, nbytes in log:
        g = len(ranks)
        sent = (2.0 if kind == "all_reduce" else 1.0) * (g - 1) / g * nbytes
        if len({r // local for r in ranks}) == 1:
            intra += sent
        else:
            inter += sent
    return intra, inter


def spy_worker(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train with every gossip collective logged: which group, what bytes.

    The wrapper is built before the spy goes in (its setup's collectives are not
    gossip); every launched gossip is drained before the spy comes out.
    """
    ddp = wrap(make_model("mlp", seed=rank), cfg)
    log: list[tuple[str, list[int], int]] = []
    saved = (hier._reduce_scatter, hier._all_gather, dist.all_reduce)
    hier._reduce_scatter = _spy(log, "reduce_scatter", saved[0], 1)  # type: ignore[assignment]
    hier._all_gather = _spy(log, "all_gather", saved[1], 0)  # type: ignore[assignment]
    dist.all_reduce = _spy(log, "all_reduce", saved[2], 0)  # type: ignore[assignment]
    try:
        train_steps(ddp, rank, cfg, 1, cfg["steps"])
        ddp._engine.drain()
    finally:
        hier._reduce_scatter, hier._all_gather, dist.all_reduce = saved  # type: ignore[assignment]
    local = cfg["local_world_size"]
    intra, inter = collective_bytes(log, local)
    return {
        "params": flat(ddp.module),
        "intra": intra,
        "inter": inter,
        "by_link": ddp.comm_bytes_by_link(),
        "peak_by_link": ddp.comm_bytes_by_link(peak=True),
        "total": ddp.comm_bytes_per_step(),
        "peak": ddp.comm_peak_bytes_per_step(),
        "numels": [b["numel"] for b in ddp.buckets_info],
        "kinds": sorted({(k, len(r)) for k, r, _ in log}),
    }
