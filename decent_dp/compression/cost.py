"""What compressed gossip costs: the bytes each rank sends and the memory an exchange holds.

Bytes sent (:func:`exchange_bytes`, the cost model of
``comm_bytes_per_step``): an all-reduce of ``N`` bytes over ``k`` ranks
sends ``2 (k-1) / k N`` per rank (ring reduce-scatter plus all-gather, the
bandwidth-optimal volume); a pair's all-gather one payload; the two phases
``2 (k-1) / k`` of the ``k`` chunk payloads. So compressed gossip costs the
compressor's ratio of exact gossip's bytes on every topology (0.5 for
``bf16``, about 0.251 for ``int8``).

Memory: one reference per bucket and per round of the period whose group has
more than one member, allocated on first use: ``ring`` 2 rounds (2 model
copies), ``one-peer-exp`` ``log2(n)`` copies, ``complete`` 1; plus one
scratch block of the largest bucket's size (per dtype and device, shared by
the buckets) and, per bucket, the buffers of its exchange in flight
(:func:`inflight_bytes`: three payloads for a pair; for a larger group
``(3k + 1) / k`` of one payload and the exact sum of the own chunk, ``1 / k``
of the bucket in its dtype, whatever ``k``).
"""

from __future__ import annotations

from typing import Any

from .codecs import (
    ENCODERS,
    CompressionSpec,
    chunk_len,
    payload_nbytes,
    randk_count,
    split_exchange,
)

__all__ = ["bytes_per_step", "exchange_bytes", "inflight_bytes"]


def exchange_bytes(spec: CompressionSpec, numel: int, element_size: int, k: int) -> float:
    """Bytes one rank sends for one bucket's exchange in a group of ``k``.

    An all-reduce of ``N`` bytes sends ``2 (k-1) / k N`` (exact gossip, and
    ``randk``'s selected values); a pair's all-gather one payload; the two
    phases of a larger group ``(k-1)`` chunk payloads each.

    Args:
        spec: The compressor (``none``: exact gossip).
        numel: The bucket's elements (padding included).
        element_size: Bytes per element of the bucket's dtype.
        k: The group's size (nothing is sent for ``k <= 1``).

    Returns:
        The bytes this rank sends.
    """
    if k <= 1 or numel == 0:  # an empty bucket is not exchanged (decent_dp._engine.gossip.launch)
        return 0.0
    name = spec.name
    if split_exchange(name, k):
        return 2.0 * (k - 1) * payload_nbytes(name, chunk_len(numel, k), element_size)
    if name in ENCODERS:  # a pair: the own payload to the peer
        return float((k - 1) * payload_nbytes(name, numel, element_size))
    return 2.0 * (k - 1) / k * payload_nbytes(name, numel, element_size, spec.ratio)


def inflight_bytes(spec: CompressionSpec, numel: int, element_size: int, k: int) -> int:
    """Bytes of the buffers one bucket's exchange holds between its launch and its step.

    The scratch block and the references are apart (one block of the largest
    bucket, and one reference per bucket and round). For a group of ``k > 2``
    this is about three payloads and ``1 / k`` of the bucket whatever ``k``.

    Args:
        spec: The compressor.
        numel: The bucket's elements (padding included).
        element_size: Bytes per element of the bucket's dtype.
        k: The group's size.

    Returns:
        The bytes of the exchange's buffers (0 for exact gossip, which reduces
        the bucket's own communication block, and for a group of one).
    """
    name = spec.name
    if k <= 1:
        return 0
    if split_exchange(name, k):
        # own chunks, received chunks, the gathered sums (k payloads each), the own sum's
        # payload, and that sum itself, exact, in the bucket's dtype
        m = chunk_len(numel, k)
        return (3 * k + 1) * payload_nbytes(name, m, element_size) + m * element_size
    if name in ENCODERS:
        return (1 + k) * payload_nbytes(name, numel, element_size)
    if name == "randk":
        return 2 * payload_nbytes(name, numel, element_size, spec.ratio) + 8 * randk_count(
            numel, spec.ratio
        )
    return 0  # exact gossip reduces the bucket's own communication block


def bytes_per_step(
    spec: CompressionSpec, edges: list[Any], numels: list[int], element_size: int
) -> float:
    """Bytes this rank sends per step, averaged over the period (see :func:`exchange_bytes`).

    Args:
        spec: The compressor (``none`` is the all-reduce of the whole block).
        edges: This rank's edge in each round.
        numels: The element count of each bucket (padding included).
        element_size: Bytes per element of the buckets.

    Returns:
        The mean over the rounds of the bytes sent for every bucket.
    """
    total = sum(
        exchange_bytes(spec, n, element_size, len(edge.ranks)) for edge in edges for n in numels
    )
    return total / max(1, len(edges))
