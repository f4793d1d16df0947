"""zlib's CRC-32 computed with torch ops on the tensor's own device, with no host round trip.

The payload trailer (:mod:`qsgd.wire`) is ``zlib.crc32``: the reflected CRC with polynomial
0xEDB88320, register preset to 0xFFFFFFFF and inverted at the end. That CRC is affine in the
message bits (see ``docs/qsgd.md``, "CRC-32 on the device"): for an ``N``-byte message ``M``,

    crc32(M) = L(M) xor crc32(N zero bytes)

where ``L`` is the same register update started from 0 and not inverted, which is linear over
GF(2) and ignores leading zero bytes. Cut ``M`` (zero-padded in front) into chunks of ``m``
bytes: a chunk's ``L`` is its bit vector times a fixed ``8m x 32`` GF(2) matrix, i.e. a float
matrix product followed by ``mod 2`` (exact: every sum is an integer below 2**24); a chunk
followed by ``k`` bytes moves to ``Z^k`` of it, ``Z`` the 32 x 32 matrix of one zero byte, so
runs of ``RADIX`` adjacent segments combine level by level, one matrix product per level,
until one value is left. The term of
the zeros depends only on ``N`` and is computed on the host (cached), since ``N`` is known there.

Everything runs as a fixed sequence of tensor operations whose shapes depend on ``N`` only,
so a CUDA caller never waits for the device.
"""
from __future__ import annotations

import functools
import zlib

import numpy as np
import torch

from qsgd import _triton

#: bytes per chunk of the first, matrix-product pass (its matrix is 8 * CHUNK x 32).
CHUNK = 256
#: bytes of the message handled per matrix product (bounds the float temporaries to 128 MiB).
PIECE = 1 << 22
#: segments joined per level of the combining tree (a message of N bytes takes
#: log_RADIX(N / CHUNK) levels, a matrix product each).
RADIX = 64
_POLY = 0xEDB88320


def _table() -> np.ndarray:
    t = np.zeros(256, dtype=np.uint64)
    for b in range(256):
        r = b
        for _ in range(8):
            r = (r >> 1) ^ (_POLY if r & 1 else 0)
        t[b] = r
    return t


def _zero_byte_matrix() -> np.ndarray:
    """``Z`` as a 32 x 32 0/1 matrix acting on column bit vectors (bit k = row k)."""
    table = _table()
    z = np.zeros((32, 32), dtype=np.int64)
    for k in range(32):
        r = 1 << k
        out = int(table[r & 0xFF]) ^ (r >> 8)
        for j in range(32):
            z[j, k] = (out >> j) & 1
    return z


def _gf2_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a @ b) & 1


def _gf2_power(z: np.ndarray, k: int) -> np.ndarray:
    out = np.eye(32, dtype=np.int64)
    base = z.copy()
    while k:
        if k & 1:
            out = _gf2_matmul(base, out)
        base = _gf2_matmul(base, base)
        k >>= 1
    return out


@functools.lru_cache(maxsize=None)
def _chunk_matrix() -> np.ndarray:
    """``(8 CHUNK, 32)`` float32: row ``8 i + k`` is ``L`` of a chunk holding only bit ``k`` of
    byte ``i`` (``Z^(CHUNK - 1 - i)`` applied to the table entry of ``1 << k``)."""
    table = _table()
    z = _zero_byte_matrix()
    w = np.zeros((8 * CHUNK, 32), dtype=np.float32)
    col = np.zeros((32, 8), dtype=np.int64)
    for k in range(8):
        v = int(table[1 << k])
        col[:, k] = [(v >> j) & 1 for j in range(32)]
    for i in range(CHUNK - 1, -1, -1):
        w[8 * i: 8 * i + 8] = col.T
        col = _gf2_matmul(z, col)
    return w


@functools.lru_cache(maxsize=64)
def _combine_matrix(span: int) -> np.ndarray:
    """``(RADIX 32, 32)`` float32: block ``r`` is ``Z^(span (RADIX - 1 - r))`` transposed, so
    that RADIX segments of ``span`` bytes, as one row, times it is their ``L`` joined."""
    z_span = _gf2_power(_zero_byte_matrix(), span)
    blocks = [np.eye(32, dtype=np.int64)]
    for _ in range(RADIX - 1):
        blocks.append(_gf2_matmul(z_span, blocks[-1]))
    return np.concatenate([b.T for b in reversed(blocks)]).astype(np.float32)


@functools.lru_cache(maxsize=256)
def _zeros_crc(nbytes: int) -> int:
    return zlib.crc32(bytes(nbytes))


# Constants live on the device once: copying a host tensor to CUDA waits for the copy.
@functools.lru_cache(maxsize=256)
def _on(device: torch.device, what: str, arg: int = 0) -> torch.Tensor:
    if what == "chunk":
        m = _chunk_matrix()
    elif what == "combine":
        m = _combine_matrix(arg)
    elif what == "bit":
        m = np.arange(8, dtype=np.uint8)
    elif what == "shift32":
        m = np.arange(32, dtype=np.int64)
    elif what == "table":                 # the register update's table, as int32 words
        m = _table().astype(np.uint32).view(np.int32)
    else:  # "zeros": the bits of crc32(arg zero bytes), the affine term
        zeros = _zeros_crc(arg)
        m = np.array([(zeros >> k) & 1 for k in range(32)], dtype=np.int64)
    return torch.from_numpy(m).to(device)


def _bits(data: torch.Tensor) -> torch.Tensor:
    """``(n, 8 CHUNK)`` float32 bits (LSB first per byte) of ``n`` whole chunks."""
    shifts = _on(data.device, "bit")
    return ((data.view(-1, CHUNK, 1) >> shifts) & 1).view(-1, 8 * CHUNK).to(torch.float32)


def _chunk_parts(padded: torch.Tensor, chunks: int) -> torch.Tensor:
    """``(chunks, 32)`` float 0/1: ``L`` of each ``CHUNK``-byte chunk of ``padded``."""
    dev = padded.device
    if _triton.usable_for_crc(padded):
        # the register updates byte by byte, a chunk per lane: no bit expansion
        regs = _triton.crc_chunks(padded, CHUNK, _on(dev, "table"))
        return ((regs[:, None] >> _on(dev, "shift32")) & 1).to(torch.float32)
    w = _on(dev, "chunk")
    per = max(1, PIECE // CHUNK)
    parts = [torch.remainder(_bits(padded[c * CHUNK:(c + per) * CHUNK]) @ w, 2.0)
             for c in range(0, chunks, per)]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _linear_part(data: torch.Tensor) -> torch.Tensor:
    """``L`` of a 1-D uint8 tensor as 32 float 0/1 values (bit k = element k)."""
    n = data.numel()
    dev = data.device
    chunks = -(-n // CHUNK)
    padded = torch.zeros(chunks * CHUNK, dtype=torch.uint8, device=dev)
    padded[chunks * CHUNK - n:] = data                      # leading zeros leave L unchanged
    v = _chunk_parts(padded, chunks)
    span = CHUNK
    while v.shape[0] > 1:
        # RADIX adjacent segments at once: one product with the stacked Z^(span (RADIX-1-r)),
        # after zero segments in front (which change nothing)
        rows = -(-v.shape[0] // RADIX) * RADIX
        if rows != v.shape[0]:
            v = torch.cat([torch.zeros(rows - v.shape[0], 32, dtype=v.dtype, device=dev), v])
        v = torch.remainder(v.view(-1, RADIX * 32) @ _on(dev, "combine", span), 2.0)
        span *= RADIX
    return v[0]


def crc32_tensor(data: torch.Tensor) -> torch.Tensor:
    """zlib's CRC-32 of a 1-D uint8 tensor, as its 4 little-endian bytes (uint8, same device).

    Parameters
    ----------
    data : Tensor
        1-D ``torch.uint8``, any device; its length is the only thing read on the host.

    Returns
    -------
    Tensor
        Four ``torch.uint8`` on ``data``'s device: ``zlib.crc32(data)`` in little-endian order,
        as the payload trailer stores it.

    Examples
    --------
    >>> import torch, zlib
    >>> msg = b"QSGD payload"
    >>> got = crc32_tensor(torch.frombuffer(bytearray(msg), dtype=torch.uint8))
    >>> int.from_bytes(bytes(got.tolist()), "little") == zlib.crc32(msg)
    True
    """
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError(f"data must be a 1-D torch.uint8 tensor, got {getattr(data, 'dtype', type(data))}")
    n = data.numel()
    dev = data.device
    bits = _on(dev, "zeros", n)                                  # L of an empty message is 0
    if n:
        bits = _linear_part(data).to(torch.int64) ^ bits
    return (bits.view(4, 8) << _on(dev, "bit").to(torch.int64)).sum(1).to(torch.uint8)


__all__ = ["crc32_tensor"]
