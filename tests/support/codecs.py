"""Reference compressors, re-derived from the format :mod:`decent_dp.compression.codecs` documents.

The distributed replays decode compressed values with these, never with the
library's encoders, so that a defect in an encoder shows up as a difference
between a real run and its replay (and in the byte-for-byte payload tests).
Each is written differently from the library's: chunk by chunk, rounding
half to even by hand, bfloat16 rounding on the float32 bit pattern, and the
``randk`` strata in Python integers.

The documented format:

* ``int8``: chunks of 1024 elements; per chunk ``scale = max(max|v| / 127,
  tiny)`` as float32 (``tiny`` the smallest normal float32), ``round(v /
  scale)`` half to even, clamped to ``[-127, 127]``, computed in float32
  (float64 for float64 values). The payload is the float32 scales, then one
  int8 per element, zero-padded to a multiple of 4 bytes.
* ``bf16``: each value rounded to bfloat16, to nearest even, 2 bytes each.
  torch converts float64 to bfloat16 through float32 (two roundings), and so
  does the library; :func:`bf16_bits` follows it.
* ``randk:<ratio>``: ``K = max(1, min(n, ceil(ratio n)))`` coordinates, one
  per stratum ``[floor(j n / K), floor((j+1) n / K))``, at ``floor(u_j
  size_j)`` (at most ``size_j - 1``) with ``u = torch.rand(K, float64)``
  from a generator seeded with ``((base * 1000003 + step) * 1000003 +
  bucket) mod (2^63 - 1)``.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "CHUNK",
    "bf16_bits",
    "bf16_payload",
    "bf16_value",
    "compressed",
    "int8_parts",
    "int8_payload",
    "int8_value",
    "randk_ids",
    "randk_seed_of",
]

CHUNK = 1024
_TINY = torch.finfo(torch.float32).tiny


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _round_half_even(y: torch.Tensor) -> torch.Tensor:
    """Round to the nearest integer, ties to the even one, without ``torch.round``."""
    low = torch.floor(y)
    frac = y - low
    odd = torch.remainder(low, 2) != 0
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return low + up.to(y.dtype)


def int8_parts(v: torch.Tensor) -> tuple[list[float], list[torch.Tensor]]:
    """The float32 scale and the int8 values of each chunk of ``v`` (flat, floating)."""
    cdt = _compute_dtype(v.dtype)
    scales, values = [], []
    for start in range(0, v.numel(), CHUNK):
        x = v[start : start + CHUNK].to(cdt)
        top = x.abs().max()
        # max|v| / 127 in the compute dtype, then stored as float32, at least tiny
        raw = float(top) / 127.0 if cdt == torch.float64 else float(top / 127.0)
        scale = max(float(torch.tensor(raw, dtype=torch.float32)), _TINY)
        q = _round_half_even(x / torch.tensor(scale, dtype=cdt))
        values.append(torch.clamp(q, -127, 127).to(torch.int8))
        scales.append(scale)
    return scales, values


def int8_payload(v: torch.Tensor) -> torch.Tensor:
    """The bytes of ``v``'s int8 payload: the scales, the values, zero padding to 4 bytes."""
    scales, values = int8_parts(v)
    head = torch.tensor(scales, dtype=torch.float32).view(torch.uint8)
    body = torch.cat(values).view(torch.uint8)
    pad = torch.zeros(-body.numel() % 4, dtype=torch.uint8)
    return torch.cat([head, body, pad])


def int8_value(v: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """What ``v``'s int8 payload decodes to in ``dtype`` (``v``'s by default)."""
    dtype = dtype or v.dtype
    cdt = _compute_dtype(dtype)
    scales, values = int8_parts(v)
    parts = [q.to(cdt) * torch.tensor(s, dtype=cdt) for s, q in zip(scales, values)]
    return torch.cat(parts).to(dtype)


def bf16_bits(v: torch.Tensor) -> torch.Tensor:
    """The bfloat16 bit patterns (int64 in ``[0, 65536)``) of ``v`` rounded to nearest even."""
    bits = v.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    lsb = (bits >> 16) & 1  # a tie goes to the pattern whose last kept bit is 0
    return ((bits + 0x7FFF + lsb) >> 16) & 0xFFFF


def bf16_payload(v: torch.Tensor) -> torch.Tensor:
    """The bytes of ``v``'s bf16 payload (little-endian 16-bit patterns)."""
    bits = bf16_bits(v)
    return torch.stack([bits & 0xFF, bits >> 8], dim=1).reshape(-1).to(torch.uint8)


def bf16_value(v: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """What ``v``'s bf16 payload decodes to in ``dtype`` (``v``'s by default)."""
    as_int32 = (bf16_bits(v) << 16).to(torch.int64)
    as_int32 = torch.where(as_int32 >= 2**31, as_int32 - 2**32, as_int32).to(torch.int32)
    return as_int32.view(torch.float32).to(dtype or v.dtype)


def randk_seed_of(base: int, for_step: int, bucket: int) -> int:
    """The documented index seed of one exchange."""
    return ((base * 1_000_003 + for_step) * 1_000_003 + bucket) % (2**63 - 1)


def randk_ids(numel: int, ratio: float, seed: int) -> list[int]:
    """The coordinates ``randk`` sends: one per stratum, drawn from the seed."""
    k = max(1, min(numel, math.ceil(ratio * numel)))
    u = torch.rand(k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ids = []
    for j in range(k):
        lo, hi = j * numel // k, (j + 1) * numel // k
        ids.append(lo + min(int(float(u[j]) * (hi - lo)), hi - lo - 1))
    return ids


def compressed(name: str, v: torch.Tensor, for_step: int = 0, bucket: int = 0) -> torch.Tensor:
    """The value a payload of ``v`` stands for (``name`` as in ``compression=``), in ``v``'s dtype."""
    if name == "bf16":
        return bf16_value(v)
    if name == "int8":
        return int8_value(v)
    kind, _, arg = name.partition(":")
    assert kind == "randk", name
    ratio = float(arg) if arg else 0.1
    out = torch.zeros_like(v)
    ids = torch.tensor(randk_ids(v.numel(), ratio, randk_seed_of(0, for_step, bucket)))
    out[ids] = v[ids]
    return out
