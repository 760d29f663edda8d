"""The compressors of compressed gossip and the sizes of their payloads.

Compressors (``compression=`` of the wrapper; :func:`parse_compression`):

* ``bf16``: ``v`` rounded to bfloat16 (round to nearest even); 2 bytes per
  element. torch converts float64 through float32, so float64 values are
  rounded twice (to float32, then to bfloat16): within a half bfloat16 ulp
  times ``1 + 2**-16``, not always the nearest bfloat16.
* ``int8``: per chunk of :data:`INT8_CHUNK` elements, ``scale =
  max(max|v| / 127, tiny)`` as float32 and ``round(v / scale)`` (half to
  even) in ``[-127, 127]``, computed in float32 (float64 for float64 values);
  ``1 + 4 / INT8_CHUNK`` bytes per element (the element bytes padded to a
  multiple of 4). The decoding error is at most ``scale / 2`` per element
  in the arithmetic's dtype; decoded into a 16-bit dtype the value is
  rounded once more, to that dtype's precision.
* ``randk:<ratio>``: ``K = ceil(ratio * numel)`` coordinates, one drawn in
  each of ``K`` equal strata of the bucket, the same on every member of the
  group (the seed is a function of the step and the bucket); the selected
  values are all-reduced (the other coordinates of ``q`` are zero; indices
  are never sent). ``ratio`` of the bytes, ``O(K)`` work to draw.

Besides the encoders and decoders, this module holds the geometry of an
exchange: how many bytes one payload takes (:func:`payload_nbytes`), whether
a group exchanges in two phases (:func:`split_exchange`) and how it then cuts
a bucket into chunks (:func:`chunk_len`, :func:`exchange_len`). How the
payloads travel is :mod:`decent_dp._comm.compressed`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "COMPRESSIONS",
    "ENCODERS",
    "INT8_CHUNK",
    "CompressionSpec",
    "bf16_decode",
    "bf16_encode",
    "chunk_len",
    "exchange_len",
    "exchange_nbytes",
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
    """Parse the wrapper's ``compression=`` argument.

    Args:
        value: ``None``, ``"none"``, ``"bf16"``, ``"int8"``, ``"randk"`` or
            ``"randk:<ratio>"`` (default ratio 0.1), or a :class:`CompressionSpec`,
            which is returned as it is once checked.

    Returns:
        The spec (``name="none"`` for ``None``).

    Raises:
        ValueError: Another value, or a ratio outside ``(0, 1]``.

    Example::

        parse_compression("randk:0.05")  # CompressionSpec(name='randk', ratio=0.05, seed=0)
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
    """The values an :func:`int8_encode` payload stands for.

    Args:
        payload: The uint8 payload (the scales, then the int8 values).
        numel: The number of values it holds.
        dtype: The dtype to decode into.

    Returns:
        A flat tensor of ``numel`` values in ``dtype``.
    """
    c = _chunks(numel)
    cdt = _int8_dtype(dtype)
    scale = payload[: 4 * c].view(torch.float32).to(cdt)
    padded = torch.zeros(c * INT8_CHUNK, dtype=cdt, device=payload.device)
    padded[:numel] = payload[4 * c : 4 * c + numel].view(torch.int8)
    return (padded.view(c, INT8_CHUNK) * scale.unsqueeze(1)).view(-1)[:numel].to(dtype)


def bf16_encode(v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``v`` rounded to bfloat16 (round to nearest even), as bytes.

    Args:
        v: The flat tensor to compress.
        out: A uint8 buffer of ``2 numel`` bytes to write into, or ``None``.

    Returns:
        The uint8 payload of ``2 numel`` bytes.
    """
    q = v.to(torch.bfloat16)
    if out is None:
        return q.view(torch.uint8)
    out.copy_(q.view(torch.uint8))
    return out


def bf16_decode(payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The values a :func:`bf16_encode` payload stands for.

    Args:
        payload: The uint8 payload (at least ``2 numel`` bytes).
        numel: The number of values it holds.
        dtype: The dtype to decode into.

    Returns:
        A flat tensor of ``numel`` values in ``dtype``.
    """
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


Encoder = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
Decoder = Callable[[torch.Tensor, int, torch.dtype], torch.Tensor]

# the compressors whose payloads are exchanged whole (not all-reduced): name -> (encode, decode)
ENCODERS: dict[str, tuple[Encoder, Decoder]] = {
    "int8": (int8_encode, int8_decode),
    "bf16": (bf16_encode, bf16_decode),
}


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
    """Elements of each of the ``k`` chunks of a split (two-phase) exchange.

    Args:
        numel: Elements of the values exchanged.
        k: The group's size.

    Returns:
        ``ceil(numel / k)`` rounded up to a multiple of 4 (the chunks are zero-padded).
    """
    per = -(-numel // k)
    return -(-per // 4) * 4


def split_exchange(name: str, k: int) -> bool:
    """Whether a group of ``k`` exchanges ``name``'s payloads in two phases (see the module docstring)."""
    return name in ENCODERS and k > 2


def exchange_nbytes(spec: CompressionSpec, numel: int, element_size: int, k: int) -> int:
    """The payload of one exchange in a group of ``k``, as the network emulation counts it.

    The emulation times an all-reduce of this many bytes: for a pair that is
    one payload, for a split exchange the ``k`` chunk payloads.
    """
    name = spec.name
    if split_exchange(name, k):
        return k * payload_nbytes(name, chunk_len(numel, k), 0)
    return payload_nbytes(name, numel, element_size, spec.ratio)


def exchange_len(name: str, numel: int, k: int) -> int:
    """Elements of the (zero-padded) values an exchange compresses for a group of ``k``."""
    return k * chunk_len(numel, k) if split_exchange(name, k) else numel
