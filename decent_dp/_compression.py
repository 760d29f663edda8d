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

Compressors (``compression=`` of the wrapper; :func:`parse_compression`):

* ``bf16``: ``v`` rounded to bfloat16 (round to nearest even); 2 bytes per
  element.
* ``int8``: per chunk of :data:`INT8_CHUNK` elements, ``scale =
  max(max|v| / 127, tiny)`` as float32 and ``round(v / scale)`` (half to
  even) in ``[-127, 127]``, computed in float32 (float64 for float64 values);
  ``1 + 4 / INT8_CHUNK`` bytes per element (the element bytes padded to a
  multiple of 4). The decoding error is at most ``scale / 2`` per element,
  in every dtype.
* ``randk:<ratio>``: ``K = ceil(ratio * numel)`` coordinates, one drawn in
  each of ``K`` equal strata of the bucket, the same on every member of the
  group (the seed is a function of the step and the bucket); the selected
  values are all-reduced (the other coordinates of ``q`` are zero; indices
  are never sent). ``ratio`` of the bytes, ``O(K)`` work to draw.

How ``bf16`` and ``int8`` payloads travel depends on the group size ``k``:

* a pair all-gathers its two payloads, decoded and summed in rank order:
  one payload sent per member, the least possible;
* a larger group exchanges in two phases, so that what each member sends
  does not grow with ``k``. The bucket is cut into ``k`` chunks; member
  ``c`` receives every member's compressed chunk ``c`` (an all-to-all),
  sums the decoded chunks in member order (``S_c``, exact), and sends
  ``C(S_c)`` to all (an all-gather). ``S`` is then the concatenation of the
  decoded ``C(S_c)``, the same on every member, and member ``c`` adds
  ``k p (S_c - dec(C(S_c)))`` to its correction on chunk ``c``: the
  corrections still add up to zero, so the average of the models stays
  exact, and the rounding of the sum stays in member ``c``'s model, where
  the next exchange sends it. On NCCL the second phase is queued on the side
  stream right behind the first, at the launch; on other backends it starts
  when the result is first waited for (a host-side wait in the launch would
  block the backward pass). Either way every rank issues them at the same
  point, so each group sees its collectives in one order. Where buckets of
  one step can take different kinds of rounds on one group (fragments of the
  outer optimizer, whose buckets' schedules are shifted), that wait could
  fall before another bucket's launch on the group on one rank and after it
  on another: there the second phases run on a group of their own, in the
  order of their first phases (:func:`start_exchange`,
  :func:`decent_dp._setup.make_second_groups`).

:func:`start_exchange` and :func:`decoded_sum` are the exchange alone (the
group's sum of compressed values, the same on every member); compressed outer
rounds (:mod:`decent_dp._outer`) send their outer gradients through them.

The collectives run within the round's group. Nothing is sent on a round
alone.

Memory: one reference per bucket and per round of the period whose group has
more than one member, allocated on first use: ``ring`` 2 rounds (2 model
copies), ``one-peer-exp`` ``log2(n)`` copies, ``complete`` 1; plus, per
bucket, one scratch block of the bucket's size and the payload buffers
(:func:`inflight_bytes`: three payloads for a pair, ``(3k + 1) / k`` of one
for a larger group, whatever ``k``).

Bytes sent (:func:`exchange_bytes`, the cost model of
``comm_bytes_per_step``): an all-reduce of ``N`` bytes over ``k`` ranks
sends ``2 (k-1) / k N`` per rank (ring reduce-scatter plus all-gather, the
bandwidth-optimal volume); a pair's all-gather one payload; the two phases
``2 (k-1) / k`` of the ``k`` chunk payloads. So compressed gossip costs the
compressor's ratio of exact gossip's bytes on every topology (0.5 for
``bf16``, about 0.251 for ``int8``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "COMPRESSIONS",
    "INT8_CHUNK",
    "CompressionSpec",
    "GossipCompressor",
    "bf16_decode",
    "chunk_len",
    "decoded_sum",
    "exchange_bytes",
    "exchange_len",
    "exchange_nbytes",
    "inflight_bytes",
    "bf16_encode",
    "int8_decode",
    "int8_encode",
    "parse_compression",
    "randk_count",
    "randk_indices",
    "randk_seed",
    "split_exchange",
    "start_exchange",
]

COMPRESSIONS = ("none", "bf16", "int8", "randk")
INT8_CHUNK = 1024  # elements per int8 scale: 4 / 1024 bytes of scales per element


@dataclass(frozen=True)
class CompressionSpec:
    """A parsed ``compression=`` argument.

    Attributes:
        name: ``none``, ``bf16``, ``int8`` or ``randk``.
        ratio: The share of coordinates ``randk`` sends (1.0 otherwise).
        seed: Mixed into ``randk``'s index seeds (the same on every rank).
    """

    name: str = "none"
    ratio: float = 1.0
    seed: int = 0


def parse_compression(value: Any) -> CompressionSpec:
    """``None``, ``"none"``, ``"bf16"``, ``"int8"``, ``"randk"`` or ``"randk:<ratio>"`` (default 0.1).

    A :class:`CompressionSpec` is returned as it is, once checked.

    Raises:
        ValueError: Another value, or a ratio outside ``(0, 1]``.
    """
    if value is None:
        return CompressionSpec()
    if isinstance(value, CompressionSpec):
        spec = value
    elif isinstance(value, str):
        name, _, arg = value.strip().partition(":")
        if name not in COMPRESSIONS or (arg and name != "randk"):
            raise ValueError(
                f"compression={value!r} is invalid; use None, 'none', 'bf16', 'int8', "
                "'randk' or 'randk:<ratio>' (e.g. 'randk:0.1')"
            )
        try:
            ratio = float(arg) if arg else (0.1 if name == "randk" else 1.0)
        except ValueError:
            raise ValueError(
                f"compression={value!r} is invalid; the randk ratio must be a number in (0, 1]"
            ) from None
        spec = CompressionSpec(name, ratio)
    else:
        raise ValueError(
            f"compression={value!r} is invalid; use None, 'none', 'bf16', 'int8', 'randk' or "
            "'randk:<ratio>'"
        )
    if spec.name not in COMPRESSIONS:
        raise ValueError(f"compression name {spec.name!r} is invalid; use one of {COMPRESSIONS}")
    if not (0.0 < spec.ratio <= 1.0) or (spec.name != "randk" and spec.ratio != 1.0):
        raise ValueError(
            f"compression ratio={spec.ratio!r} is invalid; randk takes a ratio in (0, 1], "
            "the others 1.0"
        )
    return spec


# ------------------------------------------------------------------ compressors
def _chunks(numel: int) -> int:
    return -(-numel // INT8_CHUNK)


def int8_nbytes(numel: int) -> int:
    """Bytes of an int8 payload: a float32 scale per chunk, then one byte per element (to 4)."""
    return 4 * _chunks(numel) + -(-numel // 4) * 4


def _int8_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the int8 arithmetic: float32, or float64 for float64 values."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def int8_encode(v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``v`` (flat, floating) as int8 values and float32 per-chunk scales, in one byte buffer.

    The scale that divides is the one stored, and :func:`int8_decode` multiplies
    by it: a chunk whose scale is under the smallest normal float32 (a chunk of
    zeros, say) is quantized with that smallest normal, in float32 (float64 for
    float64 values) whatever the values' own dtype, so 16-bit values with a tiny
    scale decode as well as float32 ones.

    Args:
        v: The flat tensor to compress.
        out: A uint8 buffer of :func:`int8_nbytes` bytes to write into, or ``None``.

    Returns:
        The uint8 payload: the scales, then ``numel`` int8 values (the scales
        first, so that each payload of a gathered buffer stays 4-byte aligned).
    """
    n = v.numel()
    c = _chunks(n)
    if out is None:
        out = torch.empty(int8_nbytes(n), dtype=torch.uint8, device=v.device)
    cdt = _int8_dtype(v.dtype)
    padded = torch.zeros(c * INT8_CHUNK, dtype=cdt, device=v.device)
    padded[:n] = v
    blocks = padded.view(c, INT8_CHUNK)
    scale = (blocks.abs().amax(dim=1) / 127.0).to(torch.float32)
    scale.clamp_min_(torch.finfo(torch.float32).tiny)
    q = torch.round(blocks / scale.to(cdt).unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
    out[: 4 * c].copy_(scale.view(torch.uint8))
    out[4 * c : 4 * c + n].copy_(q.view(-1)[:n].view(torch.uint8))
    out[4 * c + n :].zero_()
    return out


def int8_decode(payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The values an :func:`int8_encode` payload stands for, in ``dtype``."""
    c = _chunks(numel)
    cdt = _int8_dtype(dtype)
    scale = payload[: 4 * c].view(torch.float32).to(cdt)
    padded = torch.zeros(c * INT8_CHUNK, dtype=cdt, device=payload.device)
    padded[:numel] = payload[4 * c : 4 * c + numel].view(torch.int8)
    return (padded.view(c, INT8_CHUNK) * scale.unsqueeze(1)).view(-1)[:numel].to(dtype)


def bf16_encode(v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``v`` rounded to bfloat16, as a uint8 buffer of ``2 numel`` bytes."""
    q = v.to(torch.bfloat16)
    if out is None:
        return q.view(torch.uint8)
    out.copy_(q.view(torch.uint8))
    return out


def bf16_decode(payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The values a :func:`bf16_encode` payload stands for, in ``dtype``."""
    return payload[: 2 * numel].view(torch.bfloat16).to(dtype)


def randk_count(numel: int, ratio: float) -> int:
    """How many coordinates ``randk`` sends of a bucket of ``numel`` elements."""
    return max(1, min(numel, math.ceil(ratio * numel)))


def randk_seed(base: int, for_step: int, bucket: int) -> int:
    """The index seed of one exchange: a function of the step and the bucket only."""
    return ((base * 1_000_003 + for_step) * 1_000_003 + bucket) % (2**63 - 1)


def randk_indices(
    numel: int, ratio: float, seed: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The sorted coordinates ``randk`` sends: the same on every rank for the same seed and device type.

    One coordinate drawn uniformly from each of ``K =`` :func:`randk_count`
    nearly equal strata of ``[0, numel)`` (``floor(j numel / K)`` to
    ``floor((j+1) numel / K)``): ``K`` distinct, sorted coordinates for ``O(K)``
    work, every coordinate kept with probability about ``ratio``, instead of a
    permutation and a sort of all ``numel``. Drawn on ``device`` itself, so that
    a CUDA step copies nothing from the host.
    """
    k = randk_count(numel, ratio)
    g = torch.Generator(device=device).manual_seed(seed)
    j = torch.arange(k + 1, dtype=torch.int64, device=device)
    bounds = torch.div(j * numel, k, rounding_mode="floor")
    lo, size = bounds[:-1], bounds[1:] - bounds[:-1]
    u = torch.rand(k, generator=g, dtype=torch.float64, device=device)
    offset = torch.minimum((u * size).to(torch.int64), size - 1)  # floor, and never a stratum's end
    return lo + offset


# torch 2.14 renamed all_gather_into_tensor; torch >= 2.4 is supported
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_ENCODE = {"int8": (int8_encode, int8_decode), "bf16": (bf16_encode, bf16_decode)}


def payload_nbytes(name: str, numel: int, element_size: int, ratio: float = 1.0) -> int:
    """Bytes of one member's payload for a bucket of ``numel`` elements."""
    if name == "int8":
        return int8_nbytes(numel)
    if name == "bf16":
        return 2 * numel
    if name == "randk":
        return randk_count(numel, ratio) * element_size
    return numel * element_size


def chunk_len(numel: int, k: int) -> int:
    """Elements of each of the ``k`` chunks of a split exchange (a multiple of 4, zero-padded)."""
    per = -(-numel // k)
    return -(-per // 4) * 4


def split_exchange(name: str, k: int) -> bool:
    """Whether a group of ``k`` exchanges ``name``'s payloads in two phases (see the module docstring)."""
    return name in _ENCODE and k > 2


def exchange_nbytes(spec: CompressionSpec, numel: int, element_size: int, k: int) -> int:
    """The payload of one exchange in a group of ``k``, as the network emulation counts it.

    The emulation times an all-reduce of this many bytes: for a pair that is
    one payload, for a split exchange the ``k`` chunk payloads.
    """
    name = spec.name
    if split_exchange(name, k):
        return k * payload_nbytes(name, chunk_len(numel, k), 0)
    return payload_nbytes(name, numel, element_size, spec.ratio)


def exchange_bytes(spec: CompressionSpec, numel: int, element_size: int, k: int) -> float:
    """Bytes one rank sends for one bucket's exchange in a group of ``k``.

    An all-reduce of ``N`` bytes sends ``2 (k-1) / k N`` (exact gossip, and
    ``randk``'s selected values); a pair's all-gather one payload; the two
    phases of a larger group ``(k-1)`` chunk payloads each.
    """
    if k <= 1:
        return 0.0
    name = spec.name
    if split_exchange(name, k):
        return 2.0 * (k - 1) * payload_nbytes(name, chunk_len(numel, k), element_size)
    if name in _ENCODE:  # a pair: the own payload to the peer
        return float((k - 1) * payload_nbytes(name, numel, element_size))
    return 2.0 * (k - 1) / k * payload_nbytes(name, numel, element_size, spec.ratio)


def inflight_bytes(spec: CompressionSpec, numel: int, element_size: int, k: int) -> int:
    """Bytes of payload buffers one bucket's exchange holds between its launch and its step.

    The scratch block and the reference are apart (model-sized, one per bucket
    and one per bucket and round). For a group of ``k > 2`` this is about three
    payloads whatever ``k``.
    """
    name = spec.name
    if k <= 1:
        return 0
    if split_exchange(name, k):
        # own chunks, received chunks, the gathered sums (k rows each) and the own sum
        return (3 * k + 1) * payload_nbytes(name, chunk_len(numel, k), element_size)
    if name in _ENCODE:
        return (1 + k) * payload_nbytes(name, numel, element_size)
    if name == "randk":
        return 2 * payload_nbytes(name, numel, element_size, spec.ratio) + 8 * randk_count(
            numel, spec.ratio
        )
    return 0  # exact gossip reduces the bucket's own communication block


class _Chained:
    """The work handle of a two-phase exchange: the second collective starts after the first.

    ``then`` runs (and starts the second collective) on the bucket's stream,
    at :meth:`start_second`: at the launch on NCCL, where waiting only orders
    streams; on other backends when the result is first waited for, since a
    host-side wait in the launch would block the backward pass. Either way at
    the same point on every rank, so each group sees its collectives in one order.

    Where the second phases run on a group of their own (``queue`` given, see
    :func:`start_exchange`), they start in the order their first phases did:
    starting one starts every earlier one of the queue first.
    """

    def __init__(
        self,
        first: Any,
        then: Callable[[], Any],
        stream: Any,
        queue: list[_Chained] | None = None,
    ) -> None:
        self.first, self.then, self.stream = first, then, stream
        self.second: Any = None
        self.queue = queue
        if queue is not None:
            queue.append(self)

    def start_second(self) -> None:
        if self.second is not None:
            return
        queue = self.queue
        if queue is not None:
            while queue and queue[0] is not self:
                queue[0].start_second()  # removes itself from the queue
            if queue and queue[0] is self:
                queue.pop(0)
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()
        with ctx:
            self.first.wait()
            self.second = self.then()

    def wait(self) -> bool:
        self.start_second()
        self.second.wait()
        return True

    def is_completed(self) -> bool:
        return self.second is not None and bool(self.second.is_completed())


# ------------------------------------------------------------------ the state
@dataclass
class _InFlight:
    """One bucket's exchange between its launch and its step."""

    round_index: int
    k: int
    own: torch.Tensor  # the own payload(s) (gather, split) or the own selected values (randk)
    recv: torch.Tensor  # the gathered payloads, the received chunks, or the all-reduced values
    idx: torch.Tensor | None = None  # randk's coordinates
    chunk: int = 0  # split exchange: elements per chunk (0: one phase)
    member: int = 0  # split exchange: this rank's position in the group, the chunk it sums
    sums: torch.Tensor | None = None  # split exchange: the exact sum of the own chunk
    mine: torch.Tensor | None = None  # split exchange: that sum's payload
    gathered: torch.Tensor | None = None  # split exchange: every chunk's sum, k payloads


def exchange_len(name: str, numel: int, k: int) -> int:
    """Elements of the (zero-padded) values :func:`start_exchange` compresses for a group of ``k``."""
    return k * chunk_len(numel, k) if split_exchange(name, k) else numel


def start_exchange(
    name: str,
    values: torch.Tensor,
    numel: int,
    k: int,
    group: Any,
    round_index: int = 0,
    stream: Any = None,
    on_encoded: Callable[[], None] | None = None,
    second: tuple[Any, list[_Chained]] | None = None,
) -> tuple[Any, _InFlight]:
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
    encode, _ = _ENCODE[name]
    device = values.device
    if not split_exchange(name, k):
        size = payload_nbytes(name, numel, 0)
        own = encode(values[:numel], torch.empty(size, dtype=torch.uint8, device=device))
        recv = torch.empty(k * size, dtype=torch.uint8, device=device)
        fl = _InFlight(round_index, k, own, recv)
        if on_encoded is not None:
            on_encoded()
        return _all_gather(recv, own, group=group, async_op=True), fl
    m = chunk_len(numel, k)
    size = payload_nbytes(name, m, 0)
    own = torch.empty(k * size, dtype=torch.uint8, device=device)
    for c in range(k):  # chunk c goes to the group's member c, who sums it
        encode(values[c * m : (c + 1) * m], own[c * size : (c + 1) * size])
    recv = torch.empty(k * size, dtype=torch.uint8, device=device)
    fl = _InFlight(round_index, k, own, recv, chunk=m, member=dist.get_rank(group))
    if on_encoded is not None:
        on_encoded()
    first = dist.all_to_all_single(recv, own, group=group, async_op=True)
    group2, queue = second if second is not None else (group, None)
    dtype = values.dtype
    work = _Chained(first, lambda: _sum_own_chunk(name, fl, dtype, group2), stream, queue)
    if dist.get_backend(group) == "nccl":
        work.start_second()  # queued behind the first on the streams; the host goes on
    return work, fl


def _sum_own_chunk(name: str, fl: _InFlight, dtype: torch.dtype, group: Any) -> Any:
    """Between the phases: sum the received chunks in group order, send the sum's payload."""
    encode, decode = _ENCODE[name]
    m, k = fl.chunk, fl.k
    rows = fl.recv.view(k, -1)
    s = decode(rows[0], m, dtype)
    for j in range(1, k):  # a fixed order: the sum is the same whoever computes it
        s.add_(decode(rows[j], m, dtype))
    fl.sums = s
    fl.mine = encode(s, torch.empty(rows.shape[1], dtype=torch.uint8, device=s.device))
    fl.gathered = torch.empty_like(fl.recv)
    return _all_gather(fl.gathered, fl.mine, group=group, async_op=True)


def decoded_sum(name: str, fl: _InFlight, out: torch.Tensor) -> None:
    """``out :=`` the group's sum of the compressed values, the same on every member.

    Summed in member order (a pair), or the concatenation of the decoded chunk
    sums (two phases).
    """
    _, decode = _ENCODE[name]
    n, dtype, k = out.numel(), out.dtype, fl.k
    if fl.chunk:
        assert fl.gathered is not None
        m, sums = fl.chunk, fl.gathered.view(k, -1)
        for c in range(k):
            a, b = min(n, c * m), min(n, (c + 1) * m)
            out[a:b].copy_(decode(sums[c], m, dtype)[: b - a])
        return
    rows = fl.recv.view(k, -1)
    out.copy_(decode(rows[0], n, dtype))
    for j in range(1, k):  # a fixed order: every member sums the same way
        out.add_(decode(rows[j], n, dtype))


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
    scratch: dict[int, torch.Tensor] = field(default_factory=dict)
    inflight: dict[int, _InFlight] = field(default_factory=dict)
    seconds: dict[Any, tuple[Any, list[_Chained]]] = field(default_factory=dict)

    def _ref(self, round_index: int, bucket: Any) -> torch.Tensor:
        key = (round_index, bucket.index)
        ref = self.refs.get(key)
        if ref is None:
            ref = torch.zeros(bucket.numel, dtype=bucket.dtype, device=bucket.device)
            self.refs[key] = ref
        return ref

    def _scratch(self, bucket: Any, length: int) -> torch.Tensor:
        """A block of at least ``length`` elements whose part past ``bucket.numel`` stays zero."""
        buf = self.scratch.get(bucket.index)
        if buf is None or buf.numel() < length:
            buf = torch.zeros(length, dtype=bucket.dtype, device=bucket.device)
            self.scratch[bucket.index] = buf
        return buf

    def _deviation(self, bucket: Any, ref: torch.Tensor, length: int) -> torch.Tensor:
        """``x - ref`` over the bucket's whole block, zero-padded to ``length`` elements."""
        buf = self._scratch(bucket, length)
        dev = buf[: bucket.numel]
        if bucket.flat is not None:
            torch.sub(bucket.flat, ref, out=dev)
        else:
            for p, o in zip(bucket.params, bucket.offsets):
                n = p.numel()
                torch.sub(p.data.reshape(-1), ref[o : o + n], out=dev[o : o + n])
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
            self.inflight[bucket.index] = _InFlight(round_index, k, own, recv, idx)
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
        fl = self.inflight.pop(bucket.index)
        ref = self._ref(fl.round_index, bucket)
        comm = bucket.comm
        if fl.idx is not None:
            comm.zero_()
            s = fl.recv
            ref.index_add_(0, fl.idx, s, alpha=1.0 / fl.k)
            comm.index_copy_(0, fl.idx, s * peer_w + fl.own * (self_w - peer_w - 1.0))
            return
        _, decode = _ENCODE[self.spec.name]
        n, dtype = bucket.numel, bucket.dtype
        if fl.chunk:
            self._split_correction(fl, comm, ref, self_w, peer_w)
            return
        decoded_sum(self.spec.name, fl, comm)
        ref.add_(comm, alpha=1.0 / fl.k)
        comm.mul_(peer_w).add_(decode(fl.own, n, dtype), alpha=self_w - peer_w - 1.0)

    def _split_correction(
        self, fl: _InFlight, comm: torch.Tensor, ref: torch.Tensor, self_w: float, peer_w: float
    ) -> None:
        """The correction of a split exchange, the own chunk's rounding of its sum taken back.

        ``S`` is the concatenation of the decoded chunk sums, the same on every
        member. The member that summed chunk ``c`` adds ``k p (S_c - dec(C(S_c)))``
        there, so the group's corrections still add up to zero and the average
        of the models stays exact.
        """
        _, decode = _ENCODE[self.spec.name]
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
        return {
            "name": self.spec.name,
            "ratio": self.spec.ratio,
            "refs": {f"{r}:{b}": t.clone() for (r, b), t in sorted(self.refs.items())},
        }

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state`; ``None`` (an older checkpoint) starts the references afresh.

        Raises:
            ValueError: The state was saved with another compressor.
        """
        self.inflight.clear()
        self.refs.clear()
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


def bytes_per_step(
    spec: CompressionSpec, edges: list[Any], numels: list[int], element_size: int
) -> float:
    """Bytes this rank sends per step, averaged over the period (see :func:`exchange_bytes`).

    Args:
        spec: The compressor (``none`` is the all-reduce of the whole block).
        edges: This rank's edge in each round.
        numels: The element count of each bucket (padding included).
        element_size: Bytes per element of the buckets.
    """
    total = sum(
        exchange_bytes(spec, n, element_size, len(edge.ranks)) for edge in edges for n in numels
    )
    return total / max(1, len(edges))
