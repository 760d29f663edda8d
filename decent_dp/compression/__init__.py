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
    CompressionSpec,
    bf16_decode,
    bf16_encode,
    chunk_len,
    int8_decode,
    int8_encode,
    parse_compression,
)
from .cost import bytes_per_step, exchange_bytes, inflight_bytes

# the option, the compressors and their cost; the payload geometry is the codecs module's
__all__ = [
    "COMPRESSIONS",
    "CompressionSpec",
    "parse_compression",
    "bf16_encode",
    "bf16_decode",
    "int8_encode",
    "int8_decode",
    "chunk_len",
    "bytes_per_step",
    "exchange_bytes",
    "inflight_bytes",
]
