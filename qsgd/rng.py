"""Counter-based randomness: the uniform of element ``i`` is a pure function of
``(seed, rank, step, bucket, i)``.

No generator state is kept anywhere, so any element of any stream can be recomputed on any
device, in any order, by any thread: the torch path (CPU or CUDA) and the numba kernels of
:mod:`qsgd._kernels` draw bit-identical numbers. Workers must never be seeded from a clock: two
ranks with equal noise correlate their quantization errors, which then fail to average out.

The recipe (every operation on unsigned 32-bit words unless said otherwise):

1. Stream key, 64 bits, computed once per call from Python integers with SplitMix64
   (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014)::

       k = sm64(seed); k = sm64(k ^ rank); k = sm64(k ^ step); k = sm64(k ^ bucket)
       k0 = k & 0xffffffff;  k1 = k >> 32

2. Element hash, with ``lo``/``hi`` the low and high 32 bits of the flat index ``i``::

       h = mix32(mix32(lo ^ k0) ^ k1 ^ mix32(hi))

   ``mix32`` is Wellons' "lowbias32" integer hash (xorshift-multiply, a bijection of 32-bit
   words; https://nullprogram.com/blog/2018/07/31/)::

       h ^= h >> 16; h *= 0x7feb352d; h ^= h >> 15; h *= 0x846ca68b; h ^= h >> 16

   ``mix32(0) == 0``, so tensors below 2**32 elements pay two rounds per element.
3. Uniform: ``u = (h >> 8) * 2**-24``, an exact float32 in ``[0, 1)``. Rounding up "with
   probability p" is ``u < p``, which happens with probability ``ceil(p * 2**24) / 2**24``:
   a bias below ``2**-24`` of one level, far under the quantization noise.
"""
from __future__ import annotations

import torch
from ._checks import is_int

MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF
#: lowbias32 multipliers (Wellons 2018).
MIX_C1 = 0x7FEB352D
MIX_C2 = 0x846CA68B
#: 2**-24: converts a 24-bit integer to a float32 uniform in [0, 1).
U24 = 1.0 / (1 << 24)


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _check_counter(name: str, value) -> int:
    if not is_int(value):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})") from None
    if not 0 <= value <= MASK64:
        raise ValueError(f"{name} must be in [0, 2**64), got {value!r}")
    return value


def stream_key(seed: int = 0, rank: int = 0, step: int = 0, bucket: int = 0) -> tuple[int, int]:
    """The 64-bit key of stream ``(seed, rank, step, bucket)`` as its (low, high) 32-bit words.

    Each argument must be an int in ``[0, 2**64)``; otherwise ``ValueError`` names it.
    """
    k = _splitmix64(_check_counter("seed", seed))
    for name, value in (("rank", rank), ("step", step), ("bucket", bucket)):
        k = _splitmix64(k ^ _check_counter(name, value))
    return k & MASK32, k >> 32


def mix32_int(h: int) -> int:
    """``mix32`` on a Python int (the specification the tensor versions are tested against)."""
    h &= MASK32
    h ^= h >> 16
    h = (h * MIX_C1) & MASK32
    h ^= h >> 15
    h = (h * MIX_C2) & MASK32
    h ^= h >> 16
    return h


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    # (h * c) mod 2**32 on int64 tensors without signed overflow: split c into 16-bit halves,
    # so that each partial product stays below 2**48.
    lo = h * (c & 0xFFFF)
    hi = ((h * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def mix32(h: torch.Tensor) -> torch.Tensor:
    """``mix32`` elementwise on an int64 tensor of values in ``[0, 2**32)`` (any device)."""
    h = h ^ (h >> 16)
    h = _mul32(h, MIX_C1)
    h = h ^ (h >> 15)
    h = _mul32(h, MIX_C2)
    return h ^ (h >> 16)


def hash_index(index: torch.Tensor, key: tuple[int, int], below: int | None = None) -> torch.Tensor:
    """The 32-bit hash ``h`` of each flat index (int64 tensor, >= 0) in stream ``key``.

    ``below``, when given, is an upper bound on the indices known to the caller: below 2**32
    the high-word round is skipped without looking at the tensor (which, on CUDA, would wait
    for the device).
    """
    k0, k1 = key
    lo = index & MASK32
    h = mix32(lo ^ k0)
    wide = below > (1 << 32) if below is not None else bool((index > MASK32).any())
    if wide:
        return mix32(h ^ k1 ^ mix32(index >> 32))
    return mix32(h ^ k1)


def uniforms(index: torch.Tensor, key: tuple[int, int], below: int | None = None) -> torch.Tensor:
    """Float32 uniforms in ``[0, 1)`` for each flat index (int64 tensor) in stream ``key``
    (``below``: as in :func:`hash_index`)."""
    return (hash_index(index, key, below) >> 8).to(torch.float32) * U24
