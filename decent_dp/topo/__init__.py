"""Communication topologies as pure data.

A topology is a periodic sequence of *rounds*. Each round partitions the ranks
``0..n-1`` into disjoint groups (:class:`Edge`); inside a group every member
keeps ``weight`` of its own model and takes ``(1 - weight) / (k - 1)`` of each
of the ``k - 1`` other members. Nothing here needs ``torch.distributed``: the
rounds and their mixing matrices can be computed for any world size, and only
:class:`~decent_dp.ddp.DecentralizedDataParallel` turns edges into process
groups.

The package: :mod:`~decent_dp.topo.graph` (:class:`Edge`, :class:`Topology`,
:class:`TopologyReg`), :mod:`~decent_dp.topo.builtin` (the registered
topologies), :mod:`~decent_dp.topo.base_k` (the base-(k+1) schedule) and
:mod:`~decent_dp.topo.hosts` (which edges of a ``hierarchical`` topology span
hosts); every public name is re-exported here. Run ``python -m decent_dp.topo
--world-size 64`` for a table of every registered topology.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch

from ..mixing import consensus_rate, period_contraction, spectral_gap
from .base_k import base_k_period_bound
from .builtin import (
    AlternatingExpRingTopology,
    BaseKTopology,
    CompleteTopology,
    HierarchicalTopology,
    LocalSGDTopology,
    OnePeerExpTopology,
    RandomMatchingTopology,
    RingTopology,
)
from .graph import Edge, Topology, TopologyReg
from .hosts import hierarchical_keys, host_size, is_hierarchical

__all__ = [
    "Edge",
    "Topology",
    "TopologyReg",
    "CompleteTopology",
    "RingTopology",
    "OnePeerExpTopology",
    "AlternatingExpRingTopology",
    "RandomMatchingTopology",
    "LocalSGDTopology",
    "BaseKTopology",
    "HierarchicalTopology",
    "base_k_period_bound",
    "host_size",
    "is_hierarchical",
    "hierarchical_keys",
    "mixing_matrices",
    "spectral_gap",
    "period_contraction",
    "describe",
]


def mixing_matrices(
    topology: str | type[Topology] | Topology,
    world_size: int,
    local_world_size: int = 1,
    **kwargs: Any,
) -> list[torch.Tensor]:
    """One float64 ``n x n`` mixing matrix per round of the topology's period.

    Args:
        topology: A registered name, a :class:`Topology` subclass or an instance.
        world_size: Number of workers ``n``.
        local_world_size: Workers per node ``L``.
        **kwargs: Extra arguments of the topology's constructor.

    Returns:
        A list of ``period`` symmetric, doubly stochastic matrices.
    """
    return TopologyReg.create(topology, world_size, local_world_size, **kwargs).mixing_matrices()


def describe(
    name: str, world_size: int, local_world_size: int = 1, **kwargs: Any
) -> dict[str, Any]:
    """Summary row of one registered topology: period, peers, gap, contraction.

    ``kwargs`` go to the topology's constructor. Where the size does not fit,
    the row has ``error`` with the reason.
    """
    try:
        topo = TopologyReg.create(name, world_size, local_world_size, **kwargs)
    except ValueError as exc:
        return {"name": name, "error": str(exc)}
    mats = topo.mixing_matrices()
    peers = max(len(e.ranks) - 1 for edges in topo.rounds for e in edges)
    contraction = period_contraction(mats)
    return {
        "name": name,
        "period": topo.period,
        "peers_per_round": peers,
        "worst_gap": min(spectral_gap(w) for w in mats),
        "contraction": contraction,
        "rate_per_step": consensus_rate(mats),
    }


def _table(world_size: int, local_world_size: int, inter: str = "one-peer-exp") -> str:
    head = "| topology | period | peers/round | worst-round spectral gap | period contraction | per-step rate |"
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for name in TopologyReg.names():
        # hierarchical's gap is its inter topology's at n / L hosts
        kwargs = {"inter": inter} if name == HierarchicalTopology.name else {}
        row = describe(name, world_size, local_world_size, **kwargs)
        if "error" in row:
            lines.append(f"| {name} | n/a: {row['error']} | | | | |")
        else:
            lines.append(
                f"| {name} | {row['period']} | {row['peers_per_round']} | "
                f"{row['worst_gap']:.4f} | {row['contraction']:.3e} | {row['rate_per_step']:.4f} |"
            )
    if world_size % local_world_size == 0:
        hosts = world_size // local_world_size
        lines.append(
            f"\nhierarchical: {inter} over {hosts} hosts of {local_world_size} ranks (--inter NAME)"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the topology table (``python -m decent_dp.topo --world-size 64``)."""
    parser = argparse.ArgumentParser(
        description="Print every registered topology's mixing properties."
    )
    parser.add_argument("--world-size", "-n", type=int, default=64)
    parser.add_argument(
        "--local-world-size",
        "-l",
        type=int,
        default=8,
        help="ranks per node (for alternating-exp-ring and hierarchical)",
    )
    parser.add_argument(
        "--inter",
        default="one-peer-exp",
        help="the topology between hosts of hierarchical (default one-peer-exp)",
    )
    args = parser.parse_args(argv)
    if args.world_size < 1 or args.local_world_size < 1:
        parser.error(
            f"--world-size={args.world_size} and --local-world-size={args.local_world_size} must be >= 1"
        )
    print(f"world size n={args.world_size}, local world size L={args.local_world_size}")
    print(
        "spectral gap = 1 - max(|λ2|, |λn|) of one round's W; period contraction = ||W(P-1)...W(0) - 11ᵀ/n||₂;"
    )
    print(
        "per-step rate = 1 - contraction^(1/period), the average shrink of the disagreement per step"
    )
    print(_table(args.world_size, args.local_world_size, args.inter))
