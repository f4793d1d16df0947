"""The ``packed`` codec: each coordinate's code ``level + s`` in ``b`` bits, LSB-first, after one
float32 scale per bucket (body layout in :mod:`qsgd.wire`).

On CPU the numba kernel quantizes and packs in one fused pass; elsewhere torch ops pack the
levels of :func:`qsgd.quantizer.quantize_torch` on the tensor's device (the same bits).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from qsgd import _kernels
from qsgd.config import QSGDConfig
from qsgd.errors import PayloadError
from qsgd.quantizer import dequantize_flat, quantize_torch, raise_nonfinite


def body_nbytes(numel: int, cfg: QSGDConfig) -> int:
    """Exact body bytes: ``4 * ceil(n / d) + ceil(n * b / 8)``."""
    return 4 * -(-numel // cfg.bucket_size) + -(-numel * cfg.bits // 8)


def chunk_buckets(cfg: QSGDConfig, target_elements: int = 1 << 16) -> int:
    """Buckets per parallel chunk: a multiple of ``8 / gcd(d b, 8)`` (byte-aligned chunk starts)
    holding about ``target_elements`` elements."""
    d, b = cfg.bucket_size, cfg.bits
    g = 8 // math.gcd(d * b, 8)
    return g * max(1, target_elements // (g * d))


def _scratch(workers: int) -> np.ndarray:
    return np.empty((workers, _kernels.BLOCK), dtype=np.uint16)


def _workers(n: int) -> int:
    import numba

    return numba.get_num_threads() if n >= _kernels.PARALLEL_MIN else 1


def encode_numba_into(flat: torch.Tensor, cfg: QSGDConfig, key: tuple[int, int],
                      body: np.ndarray) -> None:
    """Quantize and pack a flat float32 CPU tensor into ``body`` (``body_nbytes`` bytes)."""
    n, d = flat.numel(), cfg.bucket_size
    if n == 0:
        return
    nb = -(-n // d)
    x = flat.numpy()
    scales = body[: 4 * nb].view(np.float32)
    codes = body[4 * nb:]
    bad = np.zeros(nb, dtype=np.uint8)
    kernel = _kernels.encode_packed if n >= _kernels.PARALLEL_MIN else _kernels.encode_packed_serial
    kernel(x, x.view(np.uint32), d, cfg.levels, cfg.bits, cfg.norm == "l2", np.uint32(key[0]),
           np.uint32(key[1]), chunk_buckets(cfg), scales, scales.view(np.uint32), codes,
           _scratch(_workers(n)), bad)
    if bad.any():
        raise_nonfinite(flat)


def pack_torch(codes: torch.Tensor, b: int) -> torch.Tensor:
    """Pack non-negative int codes (< 2**b) LSB-first into ``ceil(n b / 8)`` uint8 (any device).

    Eight codes make ``b`` bytes; byte ``k`` of a group ORs the parts of the codes overlapping
    its bits ``[8k, 8k + 8)``.
    """
    n = codes.numel()
    if 8 % b == 0:
        # whole codes per byte: uint8 shifts, no int64 temporaries (8 B/element on a GPU)
        per = 8 // b
        c = torch.zeros(-(-n // per) * per, dtype=torch.uint8, device=codes.device)
        c[:n] = codes
        c = c.view(-1, per)
        out = c[:, 0].clone()
        for j in range(1, per):
            out |= c[:, j] << (j * b)
        return out
    groups = -(-n // 8)
    c = torch.zeros(groups * 8, dtype=torch.int64, device=codes.device)
    c[:n] = codes
    c = c.view(groups, 8)
    out = torch.zeros(groups, b, dtype=torch.int64, device=codes.device)
    for k in range(b):
        for j in range(8):
            shift = j * b - 8 * k
            if shift >= 8 or shift + b <= 0:
                continue  # code j does not touch byte k
            part = c[:, j] << shift if shift >= 0 else c[:, j] >> -shift
            out[:, k] |= part & 0xFF
    return out.to(torch.uint8).reshape(-1)[: -(-n * b // 8)]


def unpack_torch(data: torch.Tensor, n: int, b: int) -> torch.Tensor:
    """Inverse of :func:`pack_torch`: ``n`` codes of ``b`` bits (int32 where ``b`` divides 8,
    else int64; any device)."""
    if 8 % b == 0:
        per = 8 // b
        mask = (1 << b) - 1
        out = torch.empty(data.numel(), per, dtype=torch.uint8, device=data.device)
        for j in range(per):
            out[:, j] = (data >> (j * b)) & mask
        return out.view(-1)[:n].to(torch.int32)
    groups = -(-n // 8)
    raw = torch.zeros(groups * b, dtype=torch.int64, device=data.device)
    raw[: data.numel()] = data
    raw = raw.view(groups, b)
    out = torch.zeros(groups, 8, dtype=torch.int64, device=data.device)
    mask = (1 << b) - 1
    for j in range(8):
        for k in range(b):
            shift = 8 * k - j * b
            if shift >= b or shift + 8 <= 0:
                continue
            part = raw[:, k] << shift if shift >= 0 else raw[:, k] >> -shift
            out[:, j] |= part & mask
    return out.reshape(-1)[:n]


def encode_torch_body(flat: torch.Tensor, cfg: QSGDConfig, key: tuple[int, int]) -> torch.Tensor:
    """The packed body (uint8) of a flat float32 tensor, built with torch ops on its device."""
    levels, scales = quantize_torch(flat, cfg, key)
    codes = pack_torch(levels.to(torch.int32) + cfg.levels, cfg.bits)
    return torch.cat([scales.view(torch.uint8), codes]) if levels.numel() else codes


def check_body(body: np.ndarray, numel: int, cfg: QSGDConfig) -> np.ndarray:
    """Validate a packed body's length, scales and padding; returns the scales (float32 view)."""
    want = body_nbytes(numel, cfg)
    if body.shape[0] != want:
        raise PayloadError(f"packed body is {body.shape[0]} bytes, expected {want} for {numel} "
                           f"elements at {cfg.bits} bits and bucket_size {cfg.bucket_size}")
    nb = -(-numel // cfg.bucket_size)
    raw = np.ascontiguousarray(body[: 4 * nb])
    bits = raw.view(np.uint32)
    bad = np.flatnonzero(bits >= 0x7F800000)  # negative, Inf or NaN: no encoder writes one
    if bad.size:
        i = int(bad[0])
        raise PayloadError(f"bucket {i} has an invalid scale {float(raw.view(np.float32)[i])!r} "
                           f"(bits 0x{int(bits[i]):08x})")
    used = numel * cfg.bits % 8
    if used and int(body[-1]) >> used:
        raise PayloadError(f"nonzero padding bits in the last byte 0x{int(body[-1]):02x} of the body")
    return raw.view(np.float32)


_ERRORS = {
    _kernels.E_CODE: "a code above 2*levels (= {top}) in bucket {bucket}",
    _kernels.E_ZERO_SCALE: "bucket {bucket} has scale 0 but nonzero levels",
}


def decode_numba(body: np.ndarray, numel: int, cfg: QSGDConfig) -> torch.Tensor:
    """Flat float32 CPU tensor of a packed body (validated by :func:`check_body` first)."""
    scales = check_body(body, numel, cfg)
    out = np.empty(numel, dtype=np.float32)
    if numel == 0:
        return torch.from_numpy(out)
    nb = scales.shape[0]
    cb = chunk_buckets(cfg)
    nchunks = -(-nb // cb)
    kind = np.zeros(nchunks, dtype=np.int32)
    where = np.zeros(nchunks, dtype=np.int64)
    kernel = _kernels.decode_packed if numel >= _kernels.PARALLEL_MIN else _kernels.decode_packed_serial
    kernel(body[4 * nb:], scales, numel, cfg.bucket_size, cfg.levels, cfg.bits, cb, out,
           _scratch(_workers(numel)), kind, where)
    failed = np.flatnonzero(kind)
    if failed.size:
        c = int(failed[0])
        msg = _ERRORS[int(kind[c])].format(top=2 * cfg.levels, bucket=int(where[c]))
        raise PayloadError(f"corrupt packed body: {msg}")
    return torch.from_numpy(out)


def unpack_checked_torch(body: torch.Tensor, numel: int, cfg: QSGDConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(levels int32, scales float32, ok 0-d bool) of a packed body of the right length.

    The checks of :func:`check_body` and :func:`decode_numba`, as device ops: ``ok`` is False
    where they would raise, and nothing is read on the host.
    """
    nb = -(-numel // cfg.bucket_size)
    raw = body[: 4 * nb].clone()                         # aligned for the int32 / float32 views
    bits = raw.view(torch.int32)
    # as uint32: >= 0x7F800000 is negative, Inf or NaN (no encoder writes one)
    ok = ((bits >= 0) & (bits < 0x7F800000)).all()
    scales = raw.view(torch.float32)
    codes = unpack_torch(body[4 * nb:], numel, cfg.bits)
    used = numel * cfg.bits % 8
    if used:
        ok = ok & ((body[-1] >> used) == 0)
    if numel:
        ok = ok & (codes.max() <= 2 * cfg.levels)
        levels = codes - cfg.levels
        zero = (scales == 0).repeat_interleave(cfg.bucket_size)[:numel]
        ok = ok & ~(zero & (levels != 0)).any()
    else:
        levels = codes
    return levels.to(torch.int32), scales, ok


def decode_torch(body: np.ndarray, numel: int, cfg: QSGDConfig, device) -> torch.Tensor:
    """Flat float32 tensor of a packed body, unpacked with torch ops on ``device``."""
    check_body(body, numel, cfg)
    levels, scales, ok = unpack_checked_torch(torch.from_numpy(body.copy()).to(device), numel, cfg)
    if not bool(ok):
        decode_numba(body, numel, cfg)       # raises the PayloadError that says where
        raise PayloadError("corrupt packed body")
    return dequantize_flat(levels, scales, cfg)
