"""The elastic wrapper's pure parts: which topologies can be elastic, their builds, healing sources, ids.

:mod:`decent_dp.elastic` re-exports the public names.
"""

from __future__ import annotations

import copy
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch

from ..topo import Topology, TopologyReg
from ._quorum import QuorumView, default_advertise_host

__all__ = [
    "check_elastic_topology",
    "default_replica_id",
    "elastic_topology",
    "heal_sources",
]

# what a topology that cannot be built for some member counts becomes for those counts
_FALLBACK = {"one-peer-exp": ("base-k", {"k": 1})}
# the member counts a topology is checked on when elastic gossip starts
_CHECKED_COUNTS = range(1, 65)
# topologies that need more than a count of members
_NOT_ELASTIC = {
    "hierarchical": "its hosts are replica groups of several processes; a replica group of "
    "one process has no host level (use its inter-host topology, e.g. one-peer-exp, directly)",
}


def check_elastic_topology(
    topology: Any, kwargs: dict[str, Any] | None = None, local_world_size: int = 1
) -> str:
    """Return the registered name if ``topology`` can be rebuilt for any membership.

    It is built here for every count of members from 1 to 64 (with the fallback of
    :func:`elastic_topology`), so that neither a bad keyword argument nor a count
    it cannot take fails in the middle of a run. ``hierarchical`` is elastic where
    a member (a host) has several processes (``local_world_size > 1``).

    Raises:
        ValueError: An instance, an unknown name, or a topology that cannot be elastic.
    """
    if isinstance(topology, Topology):
        raise ValueError(
            f"topology={type(topology).__name__}(...) cannot be elastic: an instance is built "
            "for one world size; pass a registered name, which is rebuilt at every change"
        )
    if not isinstance(topology, str) or topology not in TopologyReg.registry:
        known = ", ".join(sorted(n for n in TopologyReg.registry if n not in _NOT_ELASTIC))
        raise ValueError(f"topology={topology!r} is not registered; elastic ones: {known}")
    if topology in _NOT_ELASTIC and local_world_size == 1:
        raise ValueError(f"topology={topology!r} cannot be elastic: {_NOT_ELASTIC[topology]}")
    for n in _CHECKED_COUNTS:
        elastic_topology(topology, n * local_world_size, dict(kwargs or {}), local_world_size)
    return topology


def elastic_topology(
    name: str, n: int, kwargs: dict[str, Any], local_world_size: int = 1
) -> Topology:
    """``name`` built for ``n`` processes (hosts of ``local_world_size``), or its fallback.

    ``one-peer-exp`` needs a power of two; for other counts it becomes
    ``base-k`` with ``k=1``, one peer per round as well, with an exact average
    after each period. ``hierarchical``'s inter-host ``one-peer-exp`` becomes
    ``ring`` there (its edges between hosts must average uniformly).

    Raises:
        ValueError: ``name`` cannot be built for ``n`` and has no fallback.
    """
    lws = local_world_size
    try:
        return TopologyReg.create(name, n, lws, **kwargs)
    except ValueError as exc:
        if name == "hierarchical" and kwargs.get("inter", "one-peer-exp") in _FALLBACK:
            # between hosts an edge averages uniformly, which base-k's may not: ring's pairs do
            swapped = dict(kwargs, inter="ring", inter_kwargs={})
            return TopologyReg.create(name, n, lws, **swapped)
        if name not in _FALLBACK:
            raise ValueError(
                f"topology={name!r} cannot be elastic: it cannot be built for {n} members ({exc})"
            ) from None
        other, other_kwargs = _FALLBACK[name]
        return TopologyReg.create(other, n, lws, **other_kwargs)


def heal_sources(
    topology: Topology,
    view: QuorumView,
    joiners: list[int],
    top: int,
    group_world_size: int = 1,
    behind: list[int] | None = None,
) -> dict[int, int]:
    """The live neighbour each joiner heals from, the same on every member.

    A member's processes are ranks ``member * L + local rank`` of ``topology``;
    a joiner's source is the lowest member up to date (at step ``top``) in the
    edge of its first process in the round it gossips in next, or the next
    round with one, or else the lowest member up to date.

    Args:
        topology: The topology built for the new members.
        view: The quorum.
        joiners: The members that heal.
        top: The quorum's highest step.
        group_world_size: ``L``, processes per member.
        behind: The members not up to date (``joiners`` by default).

    Returns:
        ``{joiner: source member}``.
    """
    lws = group_world_size
    late = set(joiners if behind is None else behind)
    up = [m for m in range(view.world_size) if m not in late]
    out = {}
    for j in joiners:
        out[j] = up[0]
        for k in range(topology.period):
            edge = topology.get_edge((top + k) % topology.period, j * lws)
            peers = sorted({r // lws for r in edge.ranks} & set(up))
            if peers:
                out[j] = peers[0]
                break
    return out


def host_snapshot(state: Any) -> Any:
    """A deep copy of ``state`` (a heal's staged copy) whose tensors are copied to host memory.

    ``copy.deepcopy`` copies a CUDA tensor on its device: a heal would hold the
    model and its optimizer's state a second time on the GPU until the transport
    copied them to the host. Each tensor in the state's dicts, lists and tuples
    is copied straight to the host instead (a host tensor too: the transport
    serves host tensors by reference); whatever else holds a tensor is deep-copied.
    """
    memo: dict[int, Any] = {}

    def walk(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            if id(obj) not in memo:
                memo[id(obj)] = obj.detach().to("cpu", copy=True)
        elif isinstance(obj, dict):
            for value in obj.values():
                walk(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                walk(value)

    walk(state)
    # deepcopy's memo maps an object's id to its copy: the tensors' host copies are taken as
    # they are; keep the originals alive meanwhile (deepcopy's own rule for its memo)
    memo[id(memo)] = [state]
    return copy.deepcopy(state, memo)


def default_replica_id(lighthouse: str | None = None, host: str | None = None) -> str:
    """``HOSTNAME-ADDRESS-LAUNCH``: unique per host even where hosts share a hostname.

    The address is this host's interface towards the lighthouse, which differs
    between hosts that share a name (network namespaces, containers). ``LAUNCH``
    tells this launch apart from an earlier one on the host: torchrun's run id,
    the same in all of the host's processes (``TORCHELASTIC_RUN_ID``), or else
    the process id.
    """
    if host is None:
        host = default_advertise_host(lighthouse) if lighthouse else "local"
    launch = os.environ.get("TORCHELASTIC_RUN_ID") or str(os.getpid())
    return f"{socket.gethostname()}-{host}-{launch}".replace(":", ".")


def _positive(name: str, value: Any, kind: type = int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise ValueError(f"{name}={value!r} is invalid; it must be a positive {kind.__name__}")
    if not value > 0:
        raise ValueError(f"{name}={value!r} is invalid; it must be > 0")


def check_numbers(min_replicas: Any, quorum_every: Any, timeout_s: Any, replica_id: Any) -> None:
    """The one-line checks of the elastic wrapper's membership arguments."""
    _positive("min_replicas", min_replicas)
    _positive("quorum_every", quorum_every)
    _positive("timeout_s", timeout_s, float)
    if replica_id is not None and (not isinstance(replica_id, str) or not replica_id):
        raise ValueError(f"replica_id={replica_id!r} is invalid; it must be a non-empty string")


def ask_quorum(
    ask: Callable[[], QuorumView],
    work: Callable[[QuorumView], None],
    log: Callable[[str], None],
    replica_id: str,
    failed: Callable[[], None] | None = None,
) -> None:
    """Take part in a quorum (``ask``) and its work; ask again if a member dies meanwhile.

    After torchft forms the quorum, its members rebuild, heal the joiners and
    all-reduce; a member that dies meanwhile fails that work (after up to
    ``timeout_s``), and a new quorum, which the lighthouse forms without it once
    its heartbeats stop, takes over. ``failed`` is called at each failure.
    """
    for attempt in range(4):
        view = ask()  # its own one-line errors go up
        try:
            work(view)
            return
        except (RuntimeError, OSError) as exc:  # TimeoutError is an OSError
            if failed is not None:
                failed()
            if attempt == 3:
                raise
            log(
                f"[decent_dp.elastic] {replica_id}: the quorum's work failed "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); asking again"
            )


def change_record(
    old: QuorumView | None, view: QuorumView, step: int, healed_from: str | None, start: float
) -> dict[str, Any] | None:
    """What changed at a quorum (members, who left, who joined, the healing source), or ``None``."""
    if old is not None and old.members == view.members:
        return None
    before = set(old.members) if old is not None else set()
    return {
        "step": step,
        "quorum_id": view.quorum_id,
        "members": list(view.members),
        "left": sorted(before - set(view.members)),
        "joined": sorted(set(view.members) - before) if old is not None else [],
        "healed_from": healed_from,
        "seconds": time.monotonic() - start,
    }
