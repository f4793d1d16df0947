"""The ``elias`` codec: the paper's coding of sparse levels (Alistarh et al. 2017, Section 3.2).

Per bucket: the scale as 32 bits, the count of nonzeros, then for each nonzero the Elias omega
code of the gap to it, a sign bit and the omega code of its level (layout in :mod:`qsgd.wire`).
Elias omega (Elias 1975, "Universal codeword sets and representations of the integers"):
to code k >= 1 write "0"; while k > 1, prepend the binary form of k and set k to its number
of bits minus one. Length ``log k + log log k + ... + 1`` bits.

Encoding runs in three parallel numba passes on CPU (quantize to levels, count each bucket's
bits, write each chunk of buckets at its prefix-sum offset); decoding is one sequential,
bounds-checked pass. Tensors on other devices are quantized there and coded on the CPU.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from qsgd import _kernels, wire
from qsgd.config import QSGDConfig
from qsgd.errors import PayloadError
from qsgd.quantizer import quantize_numba, quantize_torch
from ._checks import is_int

#: buckets written per parallel chunk (each bucket is >= 33 bits, so chunks never share a byte
#: with anything but their two neighbours' edge bytes).
CHUNK_BUCKETS = 64


def omega_bits(k: int) -> str:
    """The Elias omega code of ``k >= 1`` as a string of '0'/'1' (the reference)."""
    if not is_int(k) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    code = "0"
    while k > 1:
        group = format(k, "b")
        code = group + code
        k = len(group) - 1
    return code


def omega_length(k: int) -> int:
    """Bits of the Elias omega code of ``k >= 1``."""
    return len(omega_bits(k))


def theorem_3_2_bits(s: int, n: int) -> float:
    """Theorem 3.2's expected bits for one bucket of ``n`` coordinates at ``s`` levels, with the
    o(1) term dropped: ``(3 + 1.5 log2(2 (s^2 + n) / (s (s + sqrt n)))) s (s + sqrt n) + 32``."""
    k = s * (s + math.sqrt(n))
    return (3 + 1.5 * math.log2(2 * (s * s + n) / k)) * k + 32


_TABLES = None


def _tables():
    global _TABLES
    if _TABLES is None:
        _TABLES = _kernels.omega_tables()
    return _TABLES


def bucket_bits(levels: np.ndarray, d: int, nnzs: np.ndarray | None = None) -> np.ndarray:
    """Bits of each bucket's Elias coding (int64 array) for flat signed levels; the nonzeros
    per bucket go into ``nnzs`` when given."""
    nb = -(-levels.shape[0] // d)
    bits = np.empty(nb, dtype=np.int64)
    if nnzs is None:
        nnzs = np.empty(nb, dtype=np.int64)
    if nb:
        big = levels.shape[0] >= _kernels.PARALLEL_MIN
        kernel = _kernels.elias_bucket_bits if big else _kernels.elias_bucket_bits_serial
        kernel(levels, d, _tables()[1], bits, nnzs)
    return bits


def _encode_levels(levels: np.ndarray, scales: np.ndarray, cfg: QSGDConfig, dtype, shape):
    """A sealed payload of the Elias coding of flat levels and their float32 scales."""
    d = cfg.bucket_size
    nb = -(-levels.shape[0] // d)
    nnzs = np.empty(nb, dtype=np.int64)
    bits = bucket_bits(levels, d, nnzs)
    offsets = np.zeros(nb + 1, dtype=np.int64)
    np.cumsum(bits, out=offsets[1:])
    nbytes = int(-(-int(offsets[-1]) // 8))
    buf = wire.new_payload(cfg, dtype, shape, nbytes)
    body = wire.body_view(buf, len(shape))
    if nb:
        nchunks = -(-nb // CHUNK_BUCKETS)
        head = np.zeros(nchunks, dtype=np.uint8)
        tail = np.zeros(nchunks, dtype=np.uint8)
        starts = offsets[0:nb:CHUNK_BUCKETS]
        stops = offsets[np.minimum(np.arange(1, nchunks + 1) * CHUNK_BUCKETS, nb)]
        # every byte is written once, except the edge bytes of chunks, ORed in below
        body[starts // 8] = 0
        body[(stops - 1) // 8] = 0
        big = levels.shape[0] >= _kernels.PARALLEL_MIN
        kernel = _kernels.elias_write if big else _kernels.elias_write_serial
        codes, lengths = _tables()
        kernel(levels, np.ascontiguousarray(scales).view(np.uint32), nnzs, d, offsets,
               CHUNK_BUCKETS, codes, lengths, body, head, tail)
        # each chunk spans >= 33 bits, so its first and last bytes differ
        body[(stops - 1) // 8] |= tail
        body[starts // 8] |= head
    return wire.seal(buf)


def encode(flat: torch.Tensor, cfg: QSGDConfig, key, backend: str, dtype, shape) -> np.ndarray:
    """A sealed Elias payload of a flat float32 tensor."""
    if backend == "numba":
        levels, scales = quantize_numba(flat, cfg, key)
    else:
        levels, scales = quantize_torch(flat, cfg, key)
        levels, scales = levels.cpu(), scales.cpu()
    return _encode_levels(levels.numpy(), scales.numpy(), cfg, dtype, shape)


_ERRORS = {
    _kernels.E_TRUNCATED: "the bit stream ends inside bucket {bucket} (bit {pos})",
    _kernels.E_OMEGA_TOO_LONG: "an Elias code in bucket {bucket} at bit {pos} is longer than any "
                               "valid count, gap or level",
    _kernels.E_NNZ: "bucket {bucket} claims more nonzeros than elements (bit {pos})",
    _kernels.E_GAP: "a gap in bucket {bucket} at bit {pos} runs past the bucket's end",
    _kernels.E_LEVEL: "a level in bucket {bucket} at bit {pos} exceeds levels={levels}",
    _kernels.E_SCALE: "bucket {bucket} has a negative, Inf or NaN scale (bit {pos})",
    _kernels.E_ZERO_SCALE: "bucket {bucket} has scale 0 but nonzero levels (bit {pos})",
    _kernels.E_TRAILING: "the body has bytes left after the last bucket (bit {pos})",
    _kernels.E_PADDING: "nonzero padding bits after the last bucket (bit {pos})",
}


def decode(body: np.ndarray, numel: int, cfg: QSGDConfig) -> torch.Tensor:
    """Flat float32 CPU tensor of an Elias body; PayloadError when the body is inconsistent."""
    if numel == 0:
        if body.shape[0]:
            raise PayloadError(f"elias body of an empty tensor must be empty, got {body.shape[0]} bytes")
        return torch.zeros(0, dtype=torch.float32)
    nb = -(-numel // cfg.bucket_size)
    if nb * 33 > body.shape[0] * 8:
        raise PayloadError(f"elias body of {body.shape[0]} bytes cannot hold {nb} buckets "
                           f"(at least 33 bits each) of a {numel}-element tensor")
    out = np.zeros(numel, dtype=np.float32)
    err, bucket, pos = _kernels.elias_decode(body, numel, cfg.bucket_size, cfg.levels, out)
    if err != _kernels.OK:
        msg = _ERRORS[int(err)].format(bucket=int(bucket), pos=int(pos), levels=cfg.levels)
        raise PayloadError(f"corrupt elias body: {msg}")
    return torch.from_numpy(out)
