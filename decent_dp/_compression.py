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
  element. All-gathered, decoded to the bucket's dtype and summed in rank
  order.
* ``int8``: per chunk of :data:`INT8_CHUNK` elements, ``scale =
  max|v| / 127`` as float32 and ``round(v / scale)`` (half to even) in
  ``[-127, 127]``; ``1 + 4 / INT8_CHUNK`` bytes per element (the element bytes padded to
  a multiple of 4). The decoding
  error is at most ``scale / 2`` per element. All-gathered (values and
  scales in one byte buffer), decoded and summed in rank order.
* ``randk:<ratio>``: the same ``ceil(ratio * numel)`` random coordinates on
  every member of the group, drawn from a seed that is a function of the
  step and the bucket; the selected values are all-reduced (the other
  coordinates of ``q`` are zero; indices are never sent). ``ratio`` of the
  bytes.

The collectives run within the round's group. Nothing is sent on a round
alone.

Memory: one reference per bucket and per round of the period whose group has
more than one member, allocated on first use: ``ring`` 2 rounds (2 model
copies), ``one-peer-exp`` ``log2(n)`` copies, ``complete`` 1; plus, per
bucket, one scratch block of the bucket's size and the payload buffers
(``k`` payloads for the gather compressors).

Bytes sent (:meth:`GossipCompressor.bytes_sent`, the cost model of
``comm_bytes_per_step``): an all-reduce of ``N`` bytes over ``k`` ranks
sends ``2 (k-1) / k N`` per rank (ring reduce-scatter plus all-gather, the
bandwidth-optimal volume), an all-gather of a ``P``-byte payload sends
``(k-1) P``. For pairs (``ring``, ``one-peer-exp``) both are exactly one
payload, whatever algorithm gloo or NCCL picks.
"""

from __future__ import annotations

import math
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
    "bf16_encode",
    "int8_decode",
    "int8_encode",
    "parse_compression",
    "randk_count",
    "randk_indices",
    "randk_seed",
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


def int8_encode(v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``v`` (flat, floating) as int8 values and float32 per-chunk scales, in one byte buffer.

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
    padded = v.new_zeros(c * INT8_CHUNK)
    padded[:n] = v
    blocks = padded.view(c, INT8_CHUNK)
    scale = (blocks.abs().amax(dim=1) / 127.0).to(torch.float32)
    # a chunk of zeros has scale 0 and stays zero: divide it by the smallest normal instead
    s = scale.to(v.dtype).unsqueeze(1).clamp_min(torch.finfo(v.dtype).tiny)
    q = torch.round(blocks / s).clamp_(-127, 127).to(torch.int8).view(-1)[:n]
    out[: 4 * c].copy_(scale.view(torch.uint8))
    out[4 * c : 4 * c + n].copy_(q.view(torch.uint8))
    out[4 * c + n :].zero_()
    return out


def int8_decode(payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The values an :func:`int8_encode` payload stands for, in ``dtype``."""
    c = _chunks(numel)
    scale = payload[: 4 * c].view(torch.float32).to(dtype)
    q = payload[4 * c : 4 * c + numel].view(torch.int8).to(dtype)
    padded = q.new_zeros(c * INT8_CHUNK)
    padded[:numel] = q
    return (padded.view(c, INT8_CHUNK) * scale.unsqueeze(1)).view(-1)[:numel]


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

    Drawn on ``device`` itself, so that a CUDA step copies nothing from the host.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    idx = torch.randperm(numel, generator=g, device=device)[: randk_count(numel, ratio)]
    return idx.sort().values


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


def collective_bytes(name: str, payload: int, k: int) -> float:
    """Bytes one rank sends for one exchange of ``payload`` bytes in a group of ``k``."""
    if k <= 1:
        return 0.0
    if name in _ENCODE:  # all-gather: the own payload to k-1 peers
        return float((k - 1) * payload)
    return 2.0 * (k - 1) / k * payload  # all-reduce


# ------------------------------------------------------------------ the state
@dataclass
class _InFlight:
    """One bucket's exchange between its launch and its step."""

    round_index: int
    k: int
    own: torch.Tensor  # the own payload (gather) or the own selected values (randk)
    recv: torch.Tensor  # the gathered payloads (k rows) or the all-reduced values
    idx: torch.Tensor | None = None  # randk's coordinates


@dataclass
class GossipCompressor:
    """The references and in-flight payloads of compressed gossip; see the module docstring.

    Args:
        spec: The compressor.
    """

    spec: CompressionSpec
    refs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    scratch: dict[int, torch.Tensor] = field(default_factory=dict)
    inflight: dict[int, _InFlight] = field(default_factory=dict)

    def _ref(self, round_index: int, bucket: Any) -> torch.Tensor:
        key = (round_index, bucket.index)
        ref = self.refs.get(key)
        if ref is None:
            ref = torch.zeros(bucket.numel, dtype=bucket.dtype, device=bucket.device)
            self.refs[key] = ref
        return ref

    def _scratch(self, bucket: Any) -> torch.Tensor:
        buf = self.scratch.get(bucket.index)
        if buf is None:
            buf = torch.zeros(bucket.numel, dtype=bucket.dtype, device=bucket.device)
            self.scratch[bucket.index] = buf
        return buf

    def _deviation(self, bucket: Any, ref: torch.Tensor) -> torch.Tensor:
        """``x - ref`` over the bucket's whole block (padding stays zero)."""
        dev = self._scratch(bucket)
        if bucket.flat is not None:
            torch.sub(bucket.flat, ref, out=dev)
        else:
            for p, o in zip(bucket.params, bucket.offsets):
                n = p.numel()
                torch.sub(p.data.reshape(-1), ref[o : o + n], out=dev[o : o + n])
        return dev

    def launch(self, bucket: Any, round_index: int, k: int, group: Any, for_step: int) -> Any:
        """Compress this bucket's deviation and start the exchange; returns the work handle."""
        name = self.spec.name
        dev = self._deviation(bucket, self._ref(round_index, bucket))
        if name == "randk":
            seed = randk_seed(self.spec.seed, for_step, bucket.index)
            idx = randk_indices(bucket.numel, self.spec.ratio, seed, bucket.device)
            own = dev.index_select(0, idx)
            recv = own.clone()
            self.inflight[bucket.index] = _InFlight(round_index, k, own, recv, idx)
            return dist.all_reduce(recv, group=group, async_op=True)
        encode, _ = _ENCODE[name]
        size = self.nbytes(bucket)
        own = encode(dev, torch.empty(size, dtype=torch.uint8, device=bucket.device))
        recv = torch.empty(k * size, dtype=torch.uint8, device=bucket.device)
        self.inflight[bucket.index] = _InFlight(round_index, k, own, recv)
        return _all_gather(recv, own, group=group, async_op=True)

    def nbytes(self, bucket: Any) -> int:
        """The payload this bucket sends per exchange (for the network emulation)."""
        return payload_nbytes(
            self.spec.name, bucket.numel, bucket.comm.element_size(), self.spec.ratio
        )

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
        rows = fl.recv.view(fl.k, -1)
        comm.copy_(decode(rows[0], n, dtype))
        for j in range(1, fl.k):  # a fixed order: every member sums the same way
            comm.add_(decode(rows[j], n, dtype))
        ref.add_(comm, alpha=1.0 / fl.k)
        comm.mul_(peer_w).add_(decode(fl.own, n, dtype), alpha=self_w - peer_w - 1.0)

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
    """Bytes this rank sends per step, averaged over the period (see the module docstring).

    Args:
        spec: The compressor (``none`` is the all-reduce of the whole block).
        edges: This rank's edge in each round.
        numels: The element count of each bucket (padding included).
        element_size: Bytes per element of the buckets.
    """
    total = 0.0
    for edge in edges:
        k = len(edge.ranks)
        for n in numels:
            total += collective_bytes(
                spec.name, payload_nbytes(spec.name, n, element_size, spec.ratio), k
            )
    return total / max(1, len(edges))
