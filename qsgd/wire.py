"""The QSGD payload wire format (version 1): a self-describing header, a body, a CRC-32.

Layout (little-endian; offsets in bytes)::

    0   4  magic        b"QSGD"
    4   1  version      1
    5   1  codec        0 = packed, 1 = elias           (qsgd.config.CODECS)
    6   1  dtype        0 = float32, 1 = float16, 2 = bfloat16 (the decoded tensor's dtype)
    7   1  norm         0 = max, 1 = l2                  (qsgd.config.NORMS)
    8   2  levels       s, 1..32767 (uint16)
    10  1  ndim         0..64
    11  1  reserved     0
    12  4  bucket_size  d, 1..2**31-1 (uint32)
    16  8  body_length  bytes of the body (uint64)
    24  8*ndim shape    uint64 per dimension
    H   body_length     the codec's body (H = 24 + 8 * ndim)
    H+B 4  crc32        zlib CRC-32 of bytes [0, H+B) (uint32)

Bodies, with ``n`` elements and ``nb = ceil(n / d)`` buckets:

- packed: ``nb`` float32 scales (little-endian), then the codes ``level + s`` of the elements in
  ``b = ceil(log2(2 s + 1))`` bits each, packed LSB-first (element ``j`` holds bits
  ``[j b, (j + 1) b)`` of the code area, bit ``k`` of a byte being ``(byte >> k) & 1``); unused
  bits of the last byte are zero. Body length ``4 nb + ceil(n b / 8)``, exactly.
- elias: one MSB-first bit stream. Per bucket: the scale's 32 float32 bits, ``omega(nnz + 1)``,
  then for each nonzero in index order ``omega(gap)`` (the 1-based distance from the previous
  nonzero, or from one before the bucket's start), one sign bit (1 = negative) and
  ``omega(|level|)``, where ``omega`` is the Elias omega code (:mod:`qsgd.elias`). Zero bits pad
  the last byte. (The count ``nnz`` is the only addition to the paper's coding: it tells the
  decoder where a bucket ends.)

:func:`parse` checks every header field, the total length and the CRC before a codec looks at
the body, and raises :class:`qsgd.PayloadError` naming the first thing that is wrong.
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from qsgd.config import CODECS, MAX_BUCKET_SIZE, MAX_LEVELS, NORMS, QSGDConfig
from qsgd.errors import PayloadError

MAGIC = b"QSGD"
VERSION = 1
#: magic, version, codec, dtype, norm, levels, ndim, reserved, bucket_size, body_length
FIXED = struct.Struct("<4sBBBBHBBIQ")
FIXED_NBYTES = FIXED.size  # 24
TRAILER_NBYTES = 4
MAX_NDIM = 64
#: the longest header (64 dimensions): the bytes :func:`parse_header` may need.
MAX_HEADER_NBYTES = FIXED_NBYTES + 8 * MAX_NDIM
#: refuse headers claiming more elements than this (2**40): no real gradient is that large,
#: and a corrupt header must not make the decoder allocate terabytes.
MAX_NUMEL = 1 << 40

DTYPES: dict[torch.dtype, int] = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_DTYPE_OF = {code: dtype for dtype, code in DTYPES.items()}
_CODEC_OF = {code: name for name, code in CODECS.items()}
_NORM_OF = {code: name for name, code in NORMS.items()}


def header_nbytes(ndim: int) -> int:
    """Bytes of the header of a tensor with ``ndim`` dimensions (without the 4-byte CRC)."""
    return FIXED_NBYTES + 8 * ndim


def overhead_nbytes(ndim: int) -> int:
    """Bytes of a payload that are not body: header plus CRC trailer."""
    return header_nbytes(ndim) + TRAILER_NBYTES


@dataclass(frozen=True)
class Header:
    """The decoded header of a payload."""

    cfg: QSGDConfig
    dtype: torch.dtype
    shape: tuple[int, ...]
    body_nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return header_nbytes(len(self.shape))


def new_payload(cfg: QSGDConfig, dtype: torch.dtype, shape, body_nbytes: int) -> np.ndarray:
    """A payload buffer (uint8) with its header written; fill the body, then :func:`seal` it."""
    shape = tuple(int(v) for v in shape)
    if len(shape) > MAX_NDIM:
        raise PayloadError(f"ndim must be <= {MAX_NDIM}, got {len(shape)}")
    hdr = header_nbytes(len(shape))
    buf = np.empty(hdr + body_nbytes + TRAILER_NBYTES, dtype=np.uint8)
    FIXED.pack_into(buf, 0, MAGIC, VERSION, CODECS[cfg.codec], DTYPES[dtype], NORMS[cfg.norm],
                    cfg.levels, len(shape), 0, cfg.bucket_size, body_nbytes)
    if shape:
        struct.pack_into(f"<{len(shape)}Q", buf, FIXED_NBYTES, *shape)
    return buf


def body_view(buf: np.ndarray, ndim: int) -> np.ndarray:
    """The body bytes of a payload buffer made by :func:`new_payload` (a view)."""
    return buf[header_nbytes(ndim): buf.shape[0] - TRAILER_NBYTES]


def seal(buf: np.ndarray) -> np.ndarray:
    """Write the CRC-32 of everything before the trailer into the trailer; returns ``buf``."""
    crc = zlib.crc32(memoryview(buf[:-TRAILER_NBYTES]))
    struct.pack_into("<I", buf, buf.shape[0] - TRAILER_NBYTES, crc)
    return buf


def as_bytes(payload) -> np.ndarray:
    """The payload as a CPU uint8 numpy array (a view when possible)."""
    if isinstance(payload, torch.Tensor):
        if payload.dtype != torch.uint8:
            raise PayloadError(f"payload dtype must be torch.uint8, got {payload.dtype}")
        if payload.dim() != 1:
            raise PayloadError(f"payload must be 1-D, got shape {tuple(payload.shape)}")
        return payload.detach().cpu().contiguous().numpy()
    if isinstance(payload, np.ndarray):
        if payload.dtype != np.uint8 or payload.ndim != 1:
            raise PayloadError(f"payload array must be 1-D uint8, got {payload.dtype} ndim {payload.ndim}")
        return payload
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return np.frombuffer(payload, dtype=np.uint8)
    raise PayloadError(f"payload must be a uint8 tensor or bytes, got {type(payload).__name__}")


def parse_header(prefix: np.ndarray, size: int) -> Header:
    """Validate the header of a ``size``-byte payload from its first bytes (at least
    ``min(size, MAX_HEADER_NBYTES)``) and the total length; the CRC is not checked here."""
    if size < FIXED_NBYTES + TRAILER_NBYTES:
        raise PayloadError(f"payload truncated: {size} bytes, shorter than the "
                           f"{FIXED_NBYTES + TRAILER_NBYTES}-byte minimum (header and CRC)")
    magic, version, codec, dtype, norm, levels, ndim, reserved, d, body = FIXED.unpack_from(prefix, 0)
    if magic != MAGIC:
        raise PayloadError(f"bad magic {magic!r}, expected {MAGIC!r}: not a QSGD payload")
    if version != VERSION:
        raise PayloadError(f"unsupported format version {version}, this decoder reads {VERSION}")
    if codec not in _CODEC_OF:
        raise PayloadError(f"unknown codec code {codec} in header (known: {_CODEC_OF})")
    if dtype not in _DTYPE_OF:
        raise PayloadError(f"unknown dtype code {dtype} in header (known: 0 float32, 1 float16, 2 bfloat16)")
    if norm not in _NORM_OF:
        raise PayloadError(f"unknown norm code {norm} in header (known: {_NORM_OF})")
    if not 1 <= levels <= MAX_LEVELS:
        raise PayloadError(f"levels {levels} in header out of range [1, {MAX_LEVELS}]")
    if ndim > MAX_NDIM:
        raise PayloadError(f"ndim {ndim} in header exceeds {MAX_NDIM}")
    if reserved != 0:
        raise PayloadError(f"reserved header byte is {reserved}, expected 0")
    if not 1 <= d <= MAX_BUCKET_SIZE:
        raise PayloadError(f"bucket_size {d} in header out of range [1, {MAX_BUCKET_SIZE}]")
    hdr = header_nbytes(ndim)
    if size < hdr + TRAILER_NBYTES:
        raise PayloadError(f"payload truncated: {size} bytes, but its {ndim}-D header alone needs "
                           f"{hdr} bytes plus the 4-byte CRC")
    expected = hdr + body + TRAILER_NBYTES
    if size < expected:
        raise PayloadError(f"payload truncated: {size} bytes, header says {expected} "
                           f"(body_length {body}); or the body_length field is corrupt")
    if size > expected:
        raise PayloadError(f"payload extended: {size} bytes, header says {expected} "
                           f"({size - expected} extra bytes); or the body_length field is corrupt")
    shape = struct.unpack_from(f"<{ndim}Q", prefix, FIXED_NBYTES) if ndim else ()
    numel = 1
    for i, v in enumerate(shape):
        numel *= v
        if numel > MAX_NUMEL:
            raise PayloadError(f"shape {shape} in header has more than {MAX_NUMEL} elements "
                               f"(dimension {i})")
    cfg = QSGDConfig(levels=levels, bucket_size=d, norm=_NORM_OF[norm], codec=_CODEC_OF[codec])
    return Header(cfg=cfg, dtype=_DTYPE_OF[dtype], shape=tuple(shape), body_nbytes=body)


def parse(buf: np.ndarray) -> tuple[Header, np.ndarray]:
    """Validate a payload's header, length and CRC; return the header and a view of the body."""
    size = buf.shape[0]
    header = parse_header(buf, size)
    stored = struct.unpack_from("<I", buf, size - TRAILER_NBYTES)[0]
    computed = zlib.crc32(memoryview(buf[: size - TRAILER_NBYTES]))
    if stored != computed:
        raise PayloadError(f"CRC-32 mismatch: stored 0x{stored:08x}, computed 0x{computed:08x}: "
                           "the payload is corrupted")
    hdr = header.nbytes
    return header, buf[hdr: hdr + header.body_nbytes]
