"""The ``fault_tolerance`` group: its schema, which checks its values, and what it combines with.

``fault_tolerance=none`` (the default) is today's job: a lost host stops every
rank within ``dist.timeout_s`` and torchrun restarts the job from its last
checkpoint (docs/recovery.md). ``fault_tolerance=torchft`` runs elastic gossip
(:mod:`decent_dp.elastic`) instead: each host is one replica group of one
process, launched by its own ``torchrun --nproc_per_node=1``, that joins the
quorum of a torchft lighthouse; a host that dies leaves the gossip, and a host
that starts joins it, healing from a live neighbour (:mod:`experiments.train.elastic`).

Example::

    torchft_lighthouse --min_replicas 2 --bind [::]:29510 &      # or: make lighthouse
    # on every host:
    torchrun --nproc_per_node=1 train.py fault_tolerance=torchft \\
        fault_tolerance.lighthouse=http://10.0.0.1:29510 topology=ring
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

from decent_dp.elastic import check_elastic_topology
from experiments.schema import ConfigError, name_enum, require, require_number

__all__ = [
    "FaultToleranceConfig",
    "FaultToleranceName",
    "check_fault_tolerance",
    "is_elastic",
]

FaultToleranceName = name_enum("FaultToleranceName", ["none", "torchft"], __name__)


@dataclass
class FaultToleranceConfig:
    """``fault_tolerance`` group: ``none``, or elastic gossip on a torchft lighthouse.

    Attributes:
        name: ``none`` or ``torchft``.
        lighthouse: The lighthouse's address, ``http://HOST:PORT``.
        replica_id: This host's replica id; ``None`` gives ``HOSTNAME-ADDRESS-PID``, the
            address being this host's interface towards the lighthouse, so that hosts
            sharing a hostname (the testbed's namespaces, containers) still differ.
        min_replicas: The fewest hosts a quorum may have; the job waits (with a progress
            line) up to ``timeout_s`` for them.
        timeout_s: Seconds for the lighthouse to answer, for a quorum, and for a peer
            before it counts as lost.
        quorum_every: Steps between quorums (a quorum is a rendezvous of every host).
        host: The address this host advertises to its peers; ``None``: its interface
            towards the lighthouse.
    """

    name: FaultToleranceName = FaultToleranceName["none"]  # type: ignore[valid-type]
    lighthouse: str = "http://127.0.0.1:29510"
    replica_id: str | None = None
    min_replicas: int = 1
    timeout_s: float = 60.0
    quorum_every: int = 8
    host: str | None = None

    def __post_init__(self) -> None:
        if self.name != "torchft":  # none reads none of them
            return
        lighthouse = self.lighthouse
        require(
            "fault_tolerance.lighthouse",
            lighthouse,
            isinstance(lighthouse, str) and lighthouse.startswith(("http://", "https://")),
            "an address http://HOST:PORT (start the lighthouse with `make lighthouse`)",
        )
        for key in ("min_replicas", "quorum_every"):
            require_number(f"fault_tolerance.{key}", getattr(self, key), at_least=1, kind="integer")
        require_number("fault_tolerance.timeout_s", self.timeout_s, above=0)
        rid = self.replica_id
        require(
            "fault_tolerance.replica_id",
            rid,
            rid is None or (isinstance(rid, str) and rid != "" and ":" not in rid),
            "null (unique per host) or a non-empty string without ':'",
        )


def is_elastic(cfg: Any) -> bool:
    """Whether the config asks for elastic gossip (``fault_tolerance=torchft``).

    Args:
        cfg: The composed config, or its :class:`~experiments.train.config.MainConfig`.
    """
    section = getattr(cfg, "fault_tolerance", None)
    return section is not None and str(section.name) == "torchft"


# what cannot be elastic, and why (one line each)
_NOT_ELASTIC = {
    "topology": "allreduce is no gossip, and hierarchical needs hosts of several processes "
    "(torchrun --nproc_per_node=L, L > 1)",
    "outer": "a streamed, compressed or scaled outer round is not elastic",
    "shard_size": "a sharded replica's shard ranks would have to leave together",
}


def check_fault_tolerance(cfg: Any, world_size: int) -> None:
    """Check what ``fault_tolerance=torchft`` combines with, before anything connects.

    Args:
        cfg: The config as its schemas' dataclasses
            (:func:`~experiments.train.config.config_object`), each section checked by
            its own schema already.
        world_size: Number of ranks (this host's).

    Raises:
        ConfigError: One line naming the key and the value.
    """
    if not is_elastic(cfg):
        return
    ft = cfg.fault_tolerance
    every = cfg.checkpoint.every_steps
    if ft.replica_id is None and every > 0:
        # each host's checkpoints live under its replica id: a new launch's id finds none
        warnings.warn(
            f"fault_tolerance.replica_id=null with checkpoint.every_steps={every}: the default "
            "id holds this launch's torchrun run id (or PID), so a restart of the whole job "
            "resumes nothing; give each host its own fault_tolerance.replica_id",
            stacklevel=2,
        )
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or world_size)
    if world_size != local:
        raise ConfigError(
            f"fault_tolerance=torchft runs one torchrun per host (a replica group is one host's "
            f"processes), got a world size of {world_size} over hosts of {local}; launch "
            "torchrun --nnodes=1 --nproc_per_node=L on each host"
        )
    total = cfg.train.global_batch_size
    if total is not None:
        # split over the hosts of a quorum, the batch would change with every change
        raise ConfigError(
            f"train.global_batch_size={total} cannot be elastic with fault_tolerance=torchft: "
            "the hosts sharing it come and go; set train.batch_size (each host's batch)"
        )
    shards = cfg.train.shard_size
    if shards != 1:
        # every process would train the whole model: the elastic path builds no device mesh
        raise ConfigError(
            f"train.shard_size={shards} cannot be elastic with fault_tolerance=torchft: "
            f"{_NOT_ELASTIC['shard_size']}; use train.shard_size=1"
        )
    topo = str(cfg.topology.name)
    flat = topo == "allreduce" or (topo == "hierarchical" and local == 1)
    if flat or hasattr(cfg.topology, "_target_"):
        raise ConfigError(
            f"topology={topo} cannot be elastic with fault_tolerance=torchft: "
            f"{_NOT_ELASTIC['topology']}; use ring, one-peer-exp, base-k, complete, ..."
        )
    try:  # built for every count of hosts, as the quorum may change it
        check_elastic_topology(topo, dict(cfg.topology.kwargs), local)
    except ValueError as exc:
        raise ConfigError(f"{exc} (fault_tolerance=torchft)") from None
    outer = cfg.outer
    if outer is not None and str(outer.name) != "none":
        plain_round = (
            outer.fragments == 1 and outer.compression == "none" and not outer.scale_by_inner_lr
        )
        if not plain_round:
            raise ConfigError(
                f"outer={outer.name} with fragments={outer.fragments}, compression="
                f"{outer.compression}, scale_by_inner_lr={outer.scale_by_inner_lr} "
                f"cannot be elastic with fault_tolerance=torchft: {_NOT_ELASTIC['outer']}"
            )
        every = outer.every
        require(
            "outer.every",
            every,
            every is not None and every % ft.quorum_every == 0,
            f"a multiple of fault_tolerance.quorum_every={ft.quorum_every} with "
            "fault_tolerance=torchft (outer rounds fall on quorum steps)",
        )
    sync = {k: v for k, v in vars(cfg.optim.state_sync).items() if v}
    if sync:
        raise ConfigError(
            f"optim.state_sync={sync} cannot be elastic with fault_tolerance=torchft; "
            "leave it empty"
        )
    if str(cfg.network.name) != "none":
        raise ConfigError(
            f"network={cfg.network.name} (emulated delays) does not apply with "
            "fault_tolerance=torchft; run on real hosts (the testbed) with network=none"
        )
