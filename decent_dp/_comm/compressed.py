"""Compressed gossip: each round's group exchanges compressed deviations from a shared reference.

Compressing the model itself adds noise of the size of the parameters'
rounding error at every step, which swamps the updates. What is compressed
here is what shrinks as training goes on: the distance of each member's
model to a reference that all members of the round's group hold identically.

The algorithm, per bucket and per round ``r`` of the topology's period (the
round's group ``G``, ``k = |G|`` members, weights ``w = W_ii`` and
``p = W_ij`` for ``j != i`` in ``G``; ``a`` the mixing step size)::

    launch (after step t-1):    v_i = x_i(t-1) - ref_r          (exact, the bucket's dtype)
                                q_i = C(v_i)                    (the compressor, sent)
    step t (after the exchange): S = sum_{j in G} q_j           (decoded, rank order)
                                x_i(t) = x_i(t-1) + a (sum_j W_ij xhat_j - xhat_i) + d_i(t)
                                ref_r <- ref_r + S / k

with the public estimates ``xhat_j = ref_r + q_j``. The reference cancels in
the mix: ``sum_j W_ij xhat_j - xhat_i = p S + (w - p - 1) q_i``, so the
correction is computed from the compressed deviations alone. Three
properties follow:

* the group's sum of corrections is ``k p S + (w - p - 1) S = 0`` (as
  ``w + (k-1) p = 1``), so the average of the models is exactly the one of
  uncompressed gossip, for any compressor;
* each worker keeps its own exact value: only the neighbours' information
  is compressed, and what ``C`` drops of ``v_i`` stays in ``x_i``, so it is
  in the next ``v_i`` (the reference moves to the group mean of the public
  estimates, not to ``x_i``). That is why no separate error-feedback buffer
  is kept: it would count the dropped part twice (once in ``x_i - ref``,
  once in the buffer) and make the reference overshoot (``randk:0.1`` on
  a pair of fixed models diverges with it and reaches consensus without);
* with ``C`` the identity, this is uncompressed gossip exactly, and the
  reference is the group's mean.

The reference starts at zero (the first exchange of each round sends the
compressed model; the next ones a deviation that shrinks) and is identical
on every member because it changes only by ``S / k``, which every member
computes from the same payloads in the same order.

The code is in four parts: the compressors and the geometry of their
payloads (:mod:`decent_dp.compression.codecs`), an exchange between its launch
and its step (:mod:`decent_dp._comm.inflight`: how payloads travel, pairs
apart from larger groups, and the group's decoded sum), what it costs in bytes
and memory (:mod:`decent_dp.compression.cost`), and here the collectives of an
exchange (:func:`start_exchange`) and the per-bucket state of compressed gossip
(:class:`GossipCompressor`).

:func:`start_exchange` and :func:`decoded_sum` are the exchange alone (the
group's sum of compressed values, the same on every member); compressed outer
rounds (:mod:`decent_dp._engine.outer`) send their outer gradients through them.

The collectives run within the round's group. Nothing is sent on a round
alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..compression.codecs import (
    ENCODERS,
    CompressionSpec,
    chunk_len,
    exchange_len,
    exchange_nbytes,
    payload_nbytes,
    randk_indices,
    randk_seed,
    split_exchange,
)
from .inflight import Chained, InFlight, decoded_sum

__all__ = ["GossipCompressor", "start_exchange"]

# torch 2.14 renamed all_gather_into_tensor; torch >= 2.4 is supported (the tests count
# the bytes of compressed exchanges by replacing this name, so it lives beside its callers)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def start_exchange(
    name: str,
    values: torch.Tensor,
    numel: int,
    k: int,
    group: Any,
    round_index: int = 0,
    stream: Any = None,
    on_encoded: Callable[[], None] | None = None,
    second: tuple[Any, list[Chained]] | None = None,
) -> tuple[Any, InFlight]:
    """Compress ``values`` and start the exchange whose result is the group's sum of the compressed values.

    A pair all-gathers its payloads; a larger group exchanges in two phases
    (see the module docstring). :func:`decoded_sum` then gives the same sum on
    every member.

    Args:
        name: ``bf16`` or ``int8``.
        values: Flat, :func:`exchange_len` elements, zero past ``numel``.
        numel: The elements that count.
        k: The group's size.
        group: The group's process group.
        round_index: Kept with the exchange for its reader.
        stream: The CUDA side stream of the bucket work, or ``None``.
        on_encoded: Called once the payload is encoded, just before it is sent.
        second: A process group of the same members for the second phase, and the
            queue of second phases started there; ``None`` runs both phases on ``group``.

    Returns:
        The work handle and the exchange's buffers.
    """
    encode, _ = ENCODERS[name]
    device = values.device
    if not split_exchange(name, k):
        size = payload_nbytes(name, numel, 0)
        own = encode(values[:numel], torch.empty(size, dtype=torch.uint8, device=device))
        recv = torch.empty(k * size, dtype=torch.uint8, device=device)
        fl = InFlight(round_index, k, own, recv)
        if on_encoded is not None:
            on_encoded()
        return _all_gather(recv, own, group=group, async_op=True), fl
    m = chunk_len(numel, k)
    size = payload_nbytes(name, m, 0)
    own = torch.empty(k * size, dtype=torch.uint8, device=device)
    for c in range(k):  # chunk c goes to the group's member c, who sums it
        encode(values[c * m : (c + 1) * m], own[c * size : (c + 1) * size])
    recv = torch.empty(k * size, dtype=torch.uint8, device=device)
    fl = InFlight(round_index, k, own, recv, chunk=m, member=dist.get_rank(group))
    if on_encoded is not None:
        on_encoded()
    first = dist.all_to_all_single(recv, own, group=group, async_op=True)
    group2, queue = second if second is not None else (group, None)
    dtype = values.dtype
    work = Chained(first, lambda: _sum_own_chunk(name, fl, dtype, group2), stream, queue)
    if dist.get_backend(group) == "nccl":
        work.start_second()  # queued behind the first on the streams; the host goes on
    return work, fl


def _sum_own_chunk(name: str, fl: InFlight, dtype: torch.dtype, group: Any) -> Any:
    """Between the phases: sum the received chunks in group order, send the sum's payload."""
    encode, decode = ENCODERS[name]
    m, k = fl.chunk, fl.k
    rows = fl.recv.view(k, -1)
    s = decode(rows[0], m, dtype)
    for j in range(1, k):  # a fixed order: the sum is the same whoever computes it
        s.add_(decode(rows[j], m, dtype))
    fl.sums = s
    fl.mine = encode(s, torch.empty(rows.shape[1], dtype=torch.uint8, device=s.device))
    fl.gathered = torch.empty_like(fl.recv)
    return _all_gather(fl.gathered, fl.mine, group=group, async_op=True)


@dataclass
class GossipCompressor:
    """The references and in-flight payloads of compressed gossip; see the module docstring.

    Args:
        spec: The compressor.
        seconds: For a process group, a group of the same members where the
            second phases of its two-phase exchanges run (see
            :func:`start_exchange`); groups without one run both phases.
    """

    spec: CompressionSpec
    refs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    # one block per dtype and device, shared by every bucket (see _scratch)
    scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = field(default_factory=dict)
    inflight: dict[int, InFlight] = field(default_factory=dict)
    seconds: dict[Any, tuple[Any, list[Chained]]] = field(default_factory=dict)
    # a hierarchical topology's references of this rank's chunk, keyed ("host", round, bucket)
    host_refs: dict[Any, torch.Tensor] = field(default_factory=dict)

    def _ref(self, round_index: int, bucket: Any) -> torch.Tensor:
        key = (round_index, bucket.index)
        ref = self.refs.get(key)
        if ref is None:
            ref = torch.zeros(bucket.numel, dtype=bucket.dtype, device=bucket.device)
            self.refs[key] = ref
        return ref

    def _scratch(self, bucket: Any, length: int) -> torch.Tensor:
        """A block of at least ``length`` elements, one per dtype and device for all buckets.

        Sharing is safe because nothing reads the block after the launch that
        filled it: the payloads are encoded (``randk``: selected) into buffers
        of their own there, and on CUDA every launch runs on the one side
        stream, so the next bucket's deviation overwrites it only after the
        previous encoding has read it. It grows to the largest need.
        """
        key = (bucket.dtype, bucket.device)
        buf = self.scratch.get(key)
        if buf is None or buf.numel() < length:
            buf = torch.zeros(length, dtype=bucket.dtype, device=bucket.device)
            self.scratch[key] = buf
        return buf

    def scratch_nbytes(self) -> int:
        """Bytes of the scratch blocks held now."""
        return sum(b.numel() * b.element_size() for b in self.scratch.values())

    def _deviation(self, bucket: Any, ref: torch.Tensor, length: int) -> torch.Tensor:
        """``x - ref`` over the bucket's whole block, zero-padded to ``length`` elements."""
        buf = self._scratch(bucket, length)
        dev = buf[: bucket.numel]
        if bucket.flat is not None:
            torch.sub(bucket.flat, ref, out=dev)
        else:
            dev.zero_()  # the padding between the parameters; another bucket wrote there
            for p, o in zip(bucket.params, bucket.offsets):
                n = p.numel()
                torch.sub(p.data.reshape(-1), ref[o : o + n], out=dev[o : o + n])
        buf[bucket.numel : length].zero_()  # the exchange's padding, likewise
        return buf[:length]

    def launch(
        self,
        bucket: Any,
        round_index: int,
        k: int,
        group: Any,
        for_step: int,
        stream: Any = None,
        on_encoded: Callable[[], None] | None = None,
    ) -> Any:
        """Compress this bucket's deviation and start the exchange; returns the work handle.

        Args:
            bucket: The bucket.
            round_index: The topology round whose reference the exchange uses.
            k: The round's group size.
            group: The round's process group.
            for_step: The step that mixes the result in (``randk``'s seed).
            stream: The CUDA side stream of the bucket work, or ``None``.
            on_encoded: Called once the payload is encoded, just before it is sent
                (the network emulation's clock starts there).
        """
        name = self.spec.name
        ref = self._ref(round_index, bucket)
        if name == "randk":
            dev = self._deviation(bucket, ref, bucket.numel)
            seed = randk_seed(self.spec.seed, for_step, bucket.index)
            idx = randk_indices(bucket.numel, self.spec.ratio, seed, bucket.device)
            own = dev.index_select(0, idx)
            recv = own.clone()
            self.inflight[bucket.index] = InFlight(round_index, k, own, recv, idx)
            if on_encoded is not None:
                on_encoded()
            return dist.all_reduce(recv, group=group, async_op=True)
        dev = self._deviation(bucket, ref, exchange_len(name, bucket.numel, k))
        work, fl = start_exchange(
            name,
            dev,
            bucket.numel,
            k,
            group,
            round_index,
            stream,
            on_encoded,
            self.seconds.get(group),
        )
        self.inflight[bucket.index] = fl
        return work

    def nbytes(self, bucket: Any, k: int = 2) -> int:
        """The payload of this bucket's exchange in a group of ``k``, as the network emulation counts it.

        The emulation times an all-reduce of this many bytes: for a pair that is
        one payload, for a split exchange the ``k`` chunk payloads.
        """
        return exchange_nbytes(self.spec, bucket.numel, bucket.comm.element_size(), k)

    def correction(self, bucket: Any, self_w: float, peer_w: float) -> None:
        """``comm := p S + (w - p - 1) q_i`` (the mix's correction), and move the reference.

        ``comm`` is the bucket's flat communication block; its padding stays zero.
        """
        fl: Any = self.inflight.pop(bucket.index)
        if hasattr(fl, "finish"):  # a three-phase exchange (decent_dp._comm.hierarchical)
            fl.finish(bucket)
            return
        ref = self._ref(fl.round_index, bucket)
        comm = bucket.comm
        if fl.idx is not None:
            comm.zero_()
            s = fl.recv
            ref.index_add_(0, fl.idx, s, alpha=1.0 / fl.k)
            comm.index_copy_(0, fl.idx, s * peer_w + fl.own * (self_w - peer_w - 1.0))
            return
        _, decode = ENCODERS[self.spec.name]
        n, dtype = bucket.numel, bucket.dtype
        if fl.chunk:
            self._split_correction(fl, comm, ref, self_w, peer_w)
            return
        decoded_sum(self.spec.name, fl, comm)
        ref.add_(comm, alpha=1.0 / fl.k)
        comm.mul_(peer_w).add_(decode(fl.own, n, dtype), alpha=self_w - peer_w - 1.0)

    def _split_correction(
        self, fl: InFlight, comm: torch.Tensor, ref: torch.Tensor, self_w: float, peer_w: float
    ) -> None:
        """The correction of a split exchange, the own chunk's rounding of its sum taken back.

        ``S`` is the concatenation of the decoded chunk sums, the same on every
        member. The member that summed chunk ``c`` adds ``k p (S_c - dec(C(S_c)))``
        there, so the group's corrections still add up to zero and the average
        of the models stays exact.
        """
        _, decode = ENCODERS[self.spec.name]
        n, dtype, m, k = comm.numel(), comm.dtype, fl.chunk, fl.k
        assert fl.gathered is not None and fl.sums is not None
        sums, own = fl.gathered.view(k, -1), fl.own.view(k, -1)
        lo = fl.member * m
        err = fl.sums - decode(sums[fl.member], m, dtype)
        decoded_sum(self.spec.name, fl, comm)
        ref.add_(comm, alpha=1.0 / k)
        comm.mul_(peer_w)
        for c in range(k):
            a, b = min(n, c * m), min(n, (c + 1) * m)
            comm[a:b].add_(decode(own[c], m, dtype)[: b - a], alpha=self_w - peer_w - 1.0)
        hi = min(n, lo + m)
        if lo < hi:
            comm[lo:hi].add_(err[: hi - lo], alpha=k * peer_w)

    def forget(self, bucket_index: int) -> None:
        """Drop a bucket's exchange without using it (every member of its group does the same)."""
        self.inflight.pop(bucket_index, None)

    # ---------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        """The references (the only state that outlives a step), keyed ``"round:bucket"``."""
        out: dict[str, Any] = {
            "name": self.spec.name,
            "ratio": self.spec.ratio,
            "refs": {f"{r}:{b}": t.clone() for (r, b), t in sorted(self.refs.items())},
        }
        if self.host_refs:  # a hierarchical topology's chunk references
            out["host_refs"] = {
                f"{r}:{b}": t.clone() for (_, r, b), t in sorted(self.host_refs.items())
            }
        return out

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state`; ``None`` (an older checkpoint) starts the references afresh.

        Raises:
            ValueError: The state was saved with another compressor.
        """
        self.inflight.clear()
        self.refs.clear()
        self.host_refs.clear()
        if state is None:
            return
        if state.get("name") != self.spec.name or float(state.get("ratio", 1.0)) != self.spec.ratio:
            raise ValueError(
                f"training state was saved with compression={state.get('name')!r} "
                f"(ratio {state.get('ratio')}); this run has {self.spec.name!r} "
                f"(ratio {self.spec.ratio})"
            )
        for key, t in state["refs"].items():
            r, b = (int(s) for s in key.split(":"))
            self.refs[(r, b)] = t.clone()
        for key, t in (state.get("host_refs") or {}).items():
            r, b = (int(s) for s in key.split(":"))
            self.host_refs[("host", r, b)] = t.clone()

    def place(self, buckets: list[Any]) -> None:
        """Move loaded references to their buckets' device and dtype."""
        by_index = {b.index: b for b in buckets}
        for (r, b), t in list(self.refs.items()):
            bucket = by_index.get(b)
            if bucket is None or t.numel() != bucket.numel:
                raise ValueError(
                    f"the saved compression reference {r}:{b} does not fit this model's buckets"
                )
            self.refs[(r, b)] = t.to(bucket.device, bucket.dtype)
        for key, t in list(self.host_refs.items()):
            bucket = by_index.get(key[2])
            if bucket is None or t.numel() > bucket.numel:  # a chunk of the bucket
                raise ValueError(
                    f"the saved compression reference {key[1]}:{key[2]} (host chunk) does not "
                    "fit this model's buckets"
                )
            self.host_refs[key] = t.to(bucket.device, bucket.dtype)
