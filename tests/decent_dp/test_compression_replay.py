"""The compressors against a re-derivation of their documented format.

:mod:`tests.support.codecs` re-derives ``int8``, ``bf16`` and ``randk`` from
the format :mod:`decent_dp.compression.codecs` documents; here the library's
payloads are compared with it byte for byte and its decoding error is bounded
per chunk. Real compressed gossip on gloo is compared with a float64 replay
that compresses with the re-derivation in ``test_compression.py``
(:mod:`tests.support.compression_replay`).
"""

from __future__ import annotations

import pytest
import torch

from decent_dp.compression.codecs import (
    bf16_decode,
    bf16_encode,
    int8_decode,
    int8_encode,
    randk_indices,
    randk_seed,
)
from tests.support.codecs import (
    CHUNK,
    bf16_payload,
    bf16_value,
    int8_payload,
    int8_value,
    randk_ids,
    randk_seed_of,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TOL = 1e-12


def _sample(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Three chunks and a partial one: mixed magnitudes, a chunk of zeros, exact ties."""
    g = torch.Generator().manual_seed(seed)
    n = 3 * CHUNK + 37
    v = torch.randn(n, generator=g, dtype=torch.float64)
    v[:CHUNK] *= torch.logspace(-6, 1, CHUNK, dtype=torch.float64)  # one chunk, many scales
    v[CHUNK : 2 * CHUNK] = 0.0
    # a chunk whose scale is 1: ties k + 1/2 round to the even k, -127 .. 127 reached
    ties = torch.arange(-127, 127, dtype=torch.float64) + 0.5
    v[2 * CHUNK : 3 * CHUNK] = torch.cat([ties.repeat(4), ties[: CHUNK - 4 * ties.numel()]])
    v[2 * CHUNK] = 127.0
    v[3 * CHUNK :] *= 1e-4  # a partial chunk of small values
    return v.to(dtype)


# ------------------------------------------------------------------ payloads
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_payload_is_the_documented_format(dtype: torch.dtype) -> None:
    for seed in range(3):
        v = _sample(dtype, seed)
        payload = int8_encode(v)
        assert torch.equal(payload, int8_payload(v)), (dtype, seed)
        assert torch.equal(int8_decode(payload, v.numel(), dtype), int8_value(v)), (dtype, seed)


def test_int8_ties_round_to_even() -> None:
    v = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5], dtype=torch.float64)
    back = int8_decode(int8_encode(v), v.numel(), torch.float64)
    assert back.tolist() == [127.0, 0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 126.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bf16_payload_is_round_to_nearest_even(dtype: torch.dtype) -> None:
    for seed in range(3):
        v = _sample(dtype, seed)
        assert torch.equal(bf16_encode(v).clone(), bf16_payload(v)), (dtype, seed)
        back = bf16_decode(bf16_encode(v), v.numel(), dtype)
        assert torch.equal(back, bf16_value(v)), (dtype, seed)
    # ties between two bfloat16 neighbours (1 and 1 + 2^-7 apart by 2^-7) go to the even one
    v = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-8 + 2**-20])
    back = bf16_decode(bf16_encode(v), 4, torch.float32)
    assert back.tolist() == [1.0, 1 + 2**-6, -1.0, 1 + 2**-7]


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.3, 1.0])
def test_randk_indices_are_the_documented_draw(ratio: float) -> None:
    for numel in (1, 7, 100, 1003, 4096):
        for base, step, bucket in ((0, 1, 0), (0, 7, 3), (5, 12, 2)):
            got = randk_indices(numel, ratio, randk_seed(base, step, bucket))
            want = randk_ids(numel, ratio, randk_seed_of(base, step, bucket))
            assert got.tolist() == want, (numel, ratio, base, step, bucket)


# ------------------------------------------------------------------ decoding error
def _half_ulp_bf16(x: torch.Tensor) -> torch.Tensor:
    """Half the spacing of bfloat16 numbers (8 significant bits) around each ``|x|``."""
    _, e = torch.frexp(x.double().abs())  # |x| = m 2^e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), e - 9)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_error_is_half_a_step_per_chunk_in_every_dtype(dtype: torch.dtype) -> None:
    """Decoded in the compute dtype (float32, float64 for float64) each element is within
    half its chunk's stored scale, up to the compute dtype's rounding of ``v / scale`` and of
    ``q scale`` (each under 127.5 units of ``scale`` at its unit roundoff); decoded in the
    values' own dtype it is that value rounded once more (16-bit values: off by that too)."""
    g = torch.Generator().manual_seed(3)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    roundoff = 2.0**-53 if compute == torch.float64 else 2.0**-24
    for magnitude in (1.0, 1e-3, 1e-5):
        v = (torch.randn(2 * CHUNK + 5, generator=g) * magnitude).to(dtype)
        payload = int8_encode(v)
        chunks = -(-v.numel() // CHUNK)
        scales = payload[: 4 * chunks].view(torch.float32).double()
        exact = int8_decode(payload, v.numel(), compute).double()
        err = (exact - v.double()).abs()
        for c in range(chunks):
            part = slice(c * CHUNK, (c + 1) * CHUNK)
            step = float(v[part].double().abs().max()) / 127  # the scale, before float32
            assert abs(float(scales[c]) - step) <= step * 2**-23, (dtype, magnitude, c)
            bound = float(scales[c]) * (0.5 + 2 * 127.5 * roundoff)
            assert float(err[part].max()) <= bound, (dtype, magnitude, c)
        back = int8_decode(payload, v.numel(), dtype)
        assert back.dtype == dtype
        assert torch.equal(back, exact.to(compute).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bf16_error_is_half_an_ulp_in_every_dtype(dtype: torch.dtype) -> None:
    """Half a bfloat16 ulp; float64 values are rounded to float32 first (torch's conversion),
    which adds at most half a float32 ulp."""
    g = torch.Generator().manual_seed(3)
    for magnitude in (1.0, 1e-3, 1e-5):
        v = (torch.randn(2 * CHUNK + 5, generator=g) * magnitude).to(dtype)
        back = bf16_decode(bf16_encode(v), v.numel(), dtype)
        assert back.dtype == dtype
        x = v.double()
        bound = _half_ulp_bf16(x)
        if dtype == torch.float64:
            bound = bound * (1 + 2**-16)  # + half a float32 ulp: 2^-16 of bfloat16's
        assert bool(((back.double() - x).abs() <= bound).all()), (dtype, magnitude)
