"""Compressed gossip's compressors and what they cost, as pure functions.

The wrapper's ``compression=`` argument (``None``, ``"bf16"``, ``"int8"``,
``"randk:<ratio>"`` or a :class:`CompressionSpec`) is parsed by
:func:`parse_compression`. The package holds no process group and no
collective:

* :mod:`decent_dp.compression.codecs`: the compressors (encode, decode, the
  indices ``randk`` sends), :class:`CompressionSpec` and the geometry of an
  exchange (payload sizes, whether a group exchanges in two phases and the
  chunks it then cuts);
* :mod:`decent_dp.compression.cost`: the cost model, the bytes a rank sends
  per exchange and per step and the memory an exchange holds.

How the payloads travel, and the algorithm of compressed gossip, are the
wrapper's own (its communication code).

Example::

    spec = parse_compression("int8")
    bytes_per_step(spec, edges, [numel], 4)  # bytes this rank sends per step
"""

from __future__ import annotations

from .codecs import (
    COMPRESSIONS,
    ENCODERS,
    INT8_CHUNK,
    CompressionSpec,
    bf16_decode,
    bf16_encode,
    chunk_len,
    exchange_len,
    exchange_nbytes,
    int8_decode,
    int8_encode,
    int8_nbytes,
    parse_compression,
    payload_nbytes,
    randk_count,
    randk_indices,
    randk_seed,
    split_exchange,
)
from .cost import bytes_per_step, exchange_bytes, inflight_bytes

__all__ = [
    "COMPRESSIONS",
    "ENCODERS",
    "INT8_CHUNK",
    "CompressionSpec",
    "bf16_decode",
    "bf16_encode",
    "bytes_per_step",
    "chunk_len",
    "exchange_bytes",
    "exchange_len",
    "exchange_nbytes",
    "inflight_bytes",
    "int8_decode",
    "int8_encode",
    "int8_nbytes",
    "parse_compression",
    "payload_nbytes",
    "randk_count",
    "randk_indices",
    "randk_seed",
    "split_exchange",
]
