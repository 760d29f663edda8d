"""Hierarchical gossip: an edge of whole hosts in three phases, one model per host link.

An edge of the ``hierarchical`` topology over hosts ``H`` (``L`` ranks each,
``|H| > 1``, ``L > 1``) averages the ``|H| L`` ranks of those hosts uniformly.
A flat all-reduce over them would move each rank's model across the hosts'
links; here every host's link carries one model per step:

1. reduce-scatter (sum) inside the host: local rank ``l`` holds chunk ``l``
   of its host's sum;
2. local rank ``l`` all-reduces that chunk with local rank ``l`` of each
   partner host (the group ``{h L + l : h in H}``): chunk ``l`` of the edge's sum;
3. all-gather inside the host: every rank holds the edge's sum.

The values are weighted by the edge's weight before phase 1, as the flat
all-reduce's are, so the result is that of the flat path up to the order of
the floating-point sums. A bucket whose element count is not a multiple of
``L`` is padded with zeros to ``L`` equal chunks (in a scratch block, copied
back after phase 3).

The phases run asynchronously, chained as two-phase compressed exchanges
are (:class:`decent_dp._comm.inflight.Chained`): phase 1 starts at the launch,
phases 2 and 3 follow on the bucket's stream, at the launch on NCCL (queued
behind phase 1, the host goes on). Other backends start a collective only
when the host issues it: there a thread of the wrapper's
(:class:`decent_dp._comm.inflight.PhaseDriver`) starts phases 2 and 3 as soon as
phase 1 completes, so the exchange between hosts overlaps the rest of the
backward pass and the next forward. Phase 3 then runs on a host group of its
own, and the driver takes the exchanges in the order of their phase 1s, so
every group sees its collectives in one order on every member, whatever the
order of the waits (the fragments of an outer optimizer mix kinds of rounds).

Groups, created once by the wrapper in one order on every rank: the host
groups (phase 1, and phase 3 on NCCL), off NCCL a second group per host
(phase 3), and for every distinct set of hosts of a round, ``L`` groups
across them (phase 2), made like the topology's own
(:func:`decent_dp._comm.groups.make_groups`: one ``split_group`` per round on
NCCL with a bound device). The topology's own group of such an edge is not
created.

Compressed gossip (``bf16``, ``int8``) on an edge of two hosts compresses
phase 2 only (:meth:`HostExchange.launch_compressed`); the step's correction
is taken in :class:`decent_dp._comm.compressed.GossipCompressor`, whose
``host_refs`` hold this rank's chunk references.

Bytes this rank sends for one bucket of ``N`` elements of ``s`` bytes, with
``m = ceil(N / L)`` and ``k = |H|`` (the cost model of exact gossip:
bandwidth-optimal ring collectives): inside the host ``(L - 1) m s`` for the
reduce-scatter and as much for the all-gather, between hosts
``2 (k - 1) / k m s`` for the all-reduce of the chunk (:func:`edge_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..compression.codecs import ENCODERS, CompressionSpec, exchange_nbytes
from ..compression.cost import exchange_bytes
from ..topo import Edge, Topology
from ..topo.hosts import hierarchical_keys, host_size, is_hierarchical
from .groups import default_group_timeout, make_groups
from .inflight import Chained, PhaseDriver

__all__ = [
    "HostExchange",
    "check_compression",
    "edge_bytes",
    "link_bytes",
    "make_host_groups",
]

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def edge_bytes(
    numel: int, element_size: int, edge: Edge, local: int, spec: CompressionSpec | None = None
) -> tuple[float, float]:
    """Bytes one rank sends for one bucket on a hierarchical edge: (inside its host, between hosts).

    With a compressor (``spec``), the chunk's exchange between hosts is compressed
    (:func:`decent_dp.compression.exchange_bytes` of the chunk); the phases inside
    the host stay exact.
    """
    m = -(-numel // local)
    k = len(edge.ranks) // local
    inside = 2.0 * (local - 1) * m * element_size
    if spec is not None and spec.name != "none":
        return inside, exchange_bytes(spec, m, element_size, k)
    return inside, 2.0 * (k - 1) / k * m * element_size


def check_compression(topology: Topology, compression: CompressionSpec) -> None:
    """Refuse what compressed three-phase edges do not support (one line, before any group).

    Between hosts, ``bf16`` and ``int8`` compress the chunk's exchange of an edge
    of two hosts; ``randk`` and edges of more hosts are refused.
    """
    keys = hierarchical_keys(topology) if compression.name != "none" else set()
    if not keys:
        return
    if compression.name not in ENCODERS:
        raise ValueError(
            f"compression={compression.name!r} is not supported with topology='hierarchical' "
            "across hosts; allowed there: none, bf16, int8"
        )
    local = host_size(topology)
    wide = sorted(len(key) // local for key in keys if len(key) != 2 * local)
    if wide:
        raise ValueError(
            f"compression={compression.name!r} with topology='hierarchical' compresses edges of "
            f"2 hosts only; this inter topology has edges of {wide[-1]} hosts (use compression=None "
            "or an inter topology of pairs, such as one-peer-exp or ring)"
        )


class _Phases(Topology):
    """The groups of the phases as rounds: the hosts, then each round's groups across hosts."""

    def __init__(self, rounds: list[list[Edge]], world_size: int):
        self._given = rounds
        super().__init__(world_size, 1)

    def _get_topo_edges(self) -> list[list[Edge]]:
        return self._given


@dataclass
class HostExchange:
    """This rank's side of the three-phase exchanges, and the scratch blocks of its buckets.

    Attributes:
        local: Ranks per host ``L``.
        position: This rank's index inside its host, the chunk it carries between hosts.
        host: The host's process group (phase 1, and phase 3 on NCCL).
        gather: The group of phase 3 (the host's second group off NCCL).
        inter: For each round of the period, the group across the round's hosts
            (phase 2), or ``None`` where this rank's edge is not hierarchical.
        driver: The thread that starts phases 2 and 3 in launch order (off
            NCCL), or ``None`` (NCCL queues them at the launch).
    """

    local: int
    position: int
    host: Any
    gather: Any
    inter: list[Any]
    driver: PhaseDriver | None
    chunks: dict[int, torch.Tensor] = field(default_factory=dict)
    padded: dict[int, torch.Tensor] = field(default_factory=dict)

    def launch(self, bucket: Any, round_index: int, stream: Any, between: Any = None) -> Any:
        """Start the exchange of ``bucket.comm`` (weighted already); its sum lands in ``bucket.comm``.

        ``between``, if given, replaces phase 2: it turns the chunk of the host's sum
        in place into what phase 3 gathers.
        """
        comm, local = bucket.comm, self.local
        n = comm.numel()
        m = -(-n // local)
        chunk = self.chunks.get(bucket.index)
        if chunk is None or chunk.numel() != m:
            chunk = self.chunks[bucket.index] = torch.empty(m, dtype=comm.dtype, device=comm.device)
        full = comm
        if m * local != n:  # L equal chunks: the tail is zero padding
            full = self.padded.get(bucket.index)
            if full is None or full.numel() != m * local:
                full = torch.zeros(m * local, dtype=comm.dtype, device=comm.device)
                self.padded[bucket.index] = full
            full[:n].copy_(comm)
        inter, gather = self.inter[round_index], self.gather
        first = _reduce_scatter(chunk, full, group=self.host, async_op=True)

        def then() -> Any:
            if between is not None:
                between(chunk)
            else:
                reduced: Any = dist.all_reduce(chunk, group=inter, async_op=True)
                reduced.wait()  # on NCCL this orders the bucket's stream, not the host
            last: Any = _all_gather(full, chunk, group=gather, async_op=True)
            if full is not comm:
                last.wait()
                comm.copy_(full[:n])
            return last

        work = Chained(first, then, stream, driver=self.driver)
        if dist.get_backend(self.host) == "nccl":
            work.start_second()  # queued behind the first on the streams; the host goes on
        return work

    def across(self, ranks: Sequence[int]) -> list[int]:
        """This rank's group of phase 2 on an edge of ``ranks``: its local rank on each host."""
        hosts = sorted({r // self.local for r in ranks})
        return [h * self.local + self.position for h in hosts]

    def nbytes(self, bucket: Any, spec: CompressionSpec | None = None) -> int:
        """The bytes of the chunk that crosses the hosts' links (what an emulated link times)."""
        m = -(-bucket.numel // self.local)
        if spec is not None and spec.name != "none":
            return exchange_nbytes(spec, m, bucket.comm.element_size(), 2)
        return m * bucket.comm.element_size()

    def launch_compressed(
        self,
        bucket: Any,
        round_index: int,
        refs: dict[Any, torch.Tensor],
        name: str,
        weight: float,
        stream: Any,
    ) -> tuple[Any, _HostCorrection]:
        """The three phases with phase 2 compressed (``bf16``/``int8``, an edge of two hosts).

        Phase 1 sums ``weight x`` inside the host: local rank ``l`` holds chunk ``y``
        of its host's weighted sum. Phase 2 is compressed gossip of that chunk in
        the group of local rank ``l`` of the ``k = 2`` hosts, as
        :mod:`decent_dp._comm.compressed` does for a model: ``q = C(y - ref)`` is sent,
        ``S`` is the sum of the decoded ``q`` in host order, the chunk becomes
        ``R = k y + S - k q`` (``sum_h y_h`` when ``C`` is the identity, and the
        hosts' ``R`` add up to ``k sum_h y_h`` for any ``C``), and ``ref += S / k``
        (identical on both members). Phase 3 gathers ``R`` inside the host; the
        step's correction is ``R - x`` (:class:`_HostCorrection`), so the edge's
        sum of the models is that of exact gossip.

        The reference moves at the step (:meth:`_HostCorrection.finish`), as the
        flat compressed path's do, never while the exchange is in flight: off
        NCCL phase 2 runs on the driver's thread, and a training state read
        between the launch and the step would otherwise hold the reference with
        or without this exchange's ``S / k`` depending on timing (so differ
        between partners, and a resume would apply it twice or not at all).
        Saved at any point, the reference is the one the in-flight exchange
        was launched with, which is what the resumed run relaunches it with.
        """
        comm = bucket.comm
        for c, v in zip(bucket.comm_views, bucket.values()):
            torch.mul(v, weight, out=c)
        n, local = comm.numel(), self.local
        m = -(-n // local)
        key = ("host", round_index, bucket.index)
        ref = refs.get(key)
        if ref is None or ref.numel() != m:
            ref = refs[key] = torch.zeros(m, dtype=comm.dtype, device=comm.device)
        encode, decode = ENCODERS[name]
        inter = self.inter[round_index]
        k = dist.get_world_size(inter)
        correction = _HostCorrection(round_index, refs, key, k)

        def between(chunk: torch.Tensor) -> None:
            own = encode(chunk - ref, None)
            recv = torch.empty(k * own.numel(), dtype=own.dtype, device=own.device)
            gathered: Any = _all_gather(recv, own, group=inter, async_op=True)
            gathered.wait()
            rows = recv.view(k, -1)
            total = decode(rows[0], m, chunk.dtype)
            for j in range(1, k):  # host order: the same sum on every member
                total.add_(decode(rows[j], m, chunk.dtype))
            mine = decode(own, m, chunk.dtype)
            chunk.mul_(k).add_(total).sub_(mine.mul_(k))
            correction.total = total  # the reference takes it at the step

        return self.launch(bucket, round_index, stream, between), correction

    def release(self) -> None:
        """Free the scratch blocks and let go of the groups (the wrapper destroys them); idempotent."""
        self.chunks.clear()
        self.padded.clear()
        self.host = self.gather = None
        self.inter = [None] * len(self.inter)


@dataclass
class _HostCorrection:
    """A compressed three-phase exchange in flight: at the step, ``comm := R - x`` and ``ref += S / k``.

    ``total`` (``S``) is set by phase 2; the step comes after the exchange was
    waited for, so it is there. An exchange dropped without a step (a load, a
    global average) leaves the reference as it was, on every member alike.
    """

    round_index: int
    refs: dict[Any, torch.Tensor]
    key: Any
    k: int
    total: torch.Tensor | None = None

    def finish(self, bucket: Any) -> None:
        for c, v in zip(bucket.comm_views, bucket.values()):
            c.sub_(v)
        ref = self.refs.get(self.key)
        if self.total is not None and ref is not None:
            ref.add_(self.total, alpha=1.0 / self.k)
        self.total = None


def make_host_groups(
    topology: Topology, rank: int, world_size: int
) -> tuple[list[Any], HostExchange | None]:
    """The groups of the three phases, created in the same order on every rank.

    Returns:
        The groups created (to destroy on release), and this rank's exchange,
        or ``None`` where the topology has no hierarchical edge.
    """
    local = host_size(topology)
    if not hierarchical_keys(topology):
        return [], None
    hosts = world_size // local
    rounds = [[Edge(range(h * local, (h + 1) * local), 1.0 / local) for h in range(hosts)]]
    for edges in topology.rounds:
        phase2: list[Edge] = []
        for e in sorted(edges, key=lambda e: sorted(e.ranks)):
            ranks = sorted(e.ranks)
            if not is_hierarchical(e, local):
                phase2 += [Edge([r], 1.0) for r in ranks]
                continue
            over = sorted({r // local for r in ranks})
            phase2 += [Edge([h * local + i for h in over], 1.0 / len(over)) for i in range(local)]
        rounds.append(phase2)
    created, _, groups = make_groups(_Phases(rounds, world_size), rank, world_size)
    host, inter = groups[0], groups[1:]
    gather: Any = host
    driver: PhaseDriver | None = None
    if dist.get_backend() != "nccl":
        # the driver's thread issues phase 3: on a group of its own, in launch order
        timeout = default_group_timeout()
        seconds = [
            dist.new_group(list(range(h * local, (h + 1) * local)), timeout=timeout)
            for h in range(hosts)
        ]
        created += seconds
        gather, driver = seconds[rank // local], PhaseDriver()
    mine = [topology.get_edge(r, rank) for r in range(topology.period)]
    inter = [g if is_hierarchical(e, local) else None for g, e in zip(inter, mine)]
    return created, HostExchange(local, rank % local, host, gather, inter, driver)


def link_bytes(
    edges: list[Edge],
    numels: list[int],
    element_size: int,
    local: int,
    three_phase: bool,
    gossip: CompressionSpec,
    outer: Any = None,
) -> list[tuple[float, float]]:
    """Bytes this rank sends at each step of the schedule: (inside its host, between hosts).

    The steps are ``t = 1 .. period`` (``lcm(period, H)`` with an outer
    optimizer, whose rounds, all-reduces of the world, replace the topology's
    per fragment). A three-phase edge counts its phases (:func:`edge_bytes`);
    any other group counts the cost model of
    :func:`decent_dp.compression.exchange_bytes`, inside the host when its
    ranks are on one host of ``local`` ranks, else between hosts.

    Args:
        edges: This rank's edge in each round of the topology's period.
        numels: The element count of each bucket.
        element_size: Bytes per element of the buckets.
        local: Ranks per host.
        three_phase: Whether edges of several hosts run in three phases (a
            ``hierarchical`` topology).
        gossip: The gossip's compressor.
        outer: The outer optimizer, or ``None``.
    """
    period = len(edges)
    span = math.lcm(period, outer.every) if outer is not None else period
    steps = []
    for t in range(1, span + 1):
        intra = inter = 0.0
        for b, n in enumerate(numels):
            if outer is not None and outer.due(t, b):
                edge, spec, phases = outer.edge, CompressionSpec(outer.compression), False
            else:
                shift = outer.shift(b) if outer is not None else 0
                edge, spec = edges[(t - shift - 1) % period], gossip
                phases = three_phase and is_hierarchical(edge, local)
            if phases:
                a, c = edge_bytes(n, element_size, edge, local, spec)
                intra, inter = intra + a, inter + c
            elif len(edge.ranks) > 1:
                sent = exchange_bytes(spec, n, element_size, len(edge.ranks))
                if len({r // local for r in edge.ranks}) == 1:
                    intra += sent
                else:
                    inter += sent
        steps.append((intra, inter))
    return steps
