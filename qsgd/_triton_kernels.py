"""The Triton kernels of the fused packed codec and of the CRC's chunks, and their launches.

Imported only where they can run (:mod:`qsgd._triton` decides): importing Triton costs a
tenth of a second that a CPU-only process need not pay. What they compute, and why bit for bit,
is in :mod:`qsgd._triton`.
"""
from __future__ import annotations

import threading

import torch
import triton
import triton.language as tl

# The hook launches from two threads (backward's encodes, the callback thread's decodes).
# Triton's interpreter swaps module state during a launch and fails when two overlap; on CUDA
# the lock only orders two asynchronous launches.
_LAUNCH = threading.Lock()


def _signed32(k: int) -> int:
    # keys go in as int32 so that every key compiles to the same kernel signature
    return k - (1 << 32) if k >= (1 << 31) else k


@triton.jit
def _mix32(h):
    # Wellons' lowbias32 (qsgd.rng); products cast back to 32 bits (the constants are
    # wider than int32, which promotes the product)
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D).to(tl.uint32)
    h = h ^ (h >> 15)
    h = (h * 0x846CA68B).to(tl.uint32)
    return h ^ (h >> 16)

@triton.jit
def _encode_kernel(x_ptr, scales_ptr, codes_ptr, n, k0s, k1s,
                   D: tl.constexpr, S: tl.constexpr, B: tl.constexpr, BLOCK: tl.constexpr):
    PER: tl.constexpr = 8 // B
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    idx = pid * D + offs
    valid = (offs < D) & (idx < n)
    x = tl.load(x_ptr + idx, mask=valid, other=0.0)
    ax = tl.abs(x)
    scale = tl.max(ax, axis=0)
    inv = tl.math.div_rn(tl.zeros_like(scale) + S, scale)
    good = (scale > 0) & (inv <= 3.4028234663852886e38)
    inv = tl.where(good, inv, 0.0)
    scale = tl.where(good, scale, 0.0)
    tl.store(scales_ptr + pid, scale)
    a = ax * inv
    lv = a.to(tl.int32)
    frac = a - lv.to(tl.float32)
    k0 = k0s.to(tl.uint32)
    k1 = k1s.to(tl.uint32)
    h = _mix32(_mix32(idx.to(tl.uint32) ^ k0) ^ k1)
    u = (h >> 8).to(tl.float32) * (1.0 / 16777216.0)
    lv = tl.minimum(lv + (u < frac).to(tl.int32), S)
    lv = tl.where(x < 0, -lv, lv)
    code = tl.where(valid, lv + S, 0).to(tl.uint32)
    shifts = (tl.arange(0, PER) * B).to(tl.uint32)
    byte = tl.sum(tl.reshape(code, (BLOCK // PER, PER)) << shifts[None, :], axis=1)
    j = tl.arange(0, BLOCK // PER)
    first = pid * (D // PER)
    nbytes = (n * B + 7) // 8
    tl.store(codes_ptr + first + j, byte.to(tl.uint8),
             mask=(j < D // PER) & (first + j < nbytes))

@triton.jit
def _decode_kernel(codes_ptr, scales_ptr, bits_ptr, out_ptr, bad_ptr, n,
                   D: tl.constexpr, S: tl.constexpr, B: tl.constexpr, BLOCK: tl.constexpr):
    PER: tl.constexpr = 8 // B
    pid = tl.program_id(0)
    scale = tl.load(scales_ptr + pid)
    bits = tl.load(bits_ptr + pid)
    bad = (bits < 0) | (bits >= 0x7F800000)          # negative, Inf or NaN
    step = tl.math.div_rn(scale, tl.zeros_like(scale) + S)
    j = tl.arange(0, BLOCK // PER)
    first = pid * (D // PER)
    nbytes = (n * B + 7) // 8
    byte = tl.load(codes_ptr + first + j, mask=(j < D // PER) & (first + j < nbytes),
                   other=0).to(tl.int32)
    shifts = tl.arange(0, PER) * B
    code = tl.reshape((byte[:, None] >> shifts[None, :]) & ((1 << B) - 1), (BLOCK,))
    offs = tl.arange(0, BLOCK)
    idx = pid * D + offs
    valid = (offs < D) & (idx < n)
    lv = code - S
    bad = bad | (tl.max(tl.where(valid & (code > 2 * S), 1, 0), axis=0) > 0)
    nonzero = tl.max(tl.where(valid & (lv != 0), 1, 0), axis=0) > 0
    bad = bad | ((scale == 0) & nonzero)
    tl.store(out_ptr + idx, lv.to(tl.float32) * step, mask=valid)
    tl.store(bad_ptr + pid, bad.to(tl.int32))


@triton.jit
def _crc_kernel(data_ptr, out_ptr, table_ptr, chunks, CHUNK: tl.constexpr, LANES: tl.constexpr):
    # zlib's register update from 0, without the final inversion (qsgd.crc's L), one
    # chunk per lane, byte after byte
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    live = lane < chunks
    base = lane.to(tl.int64) * CHUNK
    r = tl.zeros((LANES,), dtype=tl.uint32)
    for j in range(CHUNK):
        byte = tl.load(data_ptr + base + j, mask=live, other=0).to(tl.uint32)
        t = tl.load(table_ptr + ((r ^ byte) & 0xFF), mask=live, other=0).to(tl.uint32)
        r = t ^ (r >> 8)
    tl.store(out_ptr + lane, r.to(tl.int32, bitcast=True), mask=live)


def crc_chunks(data: torch.Tensor, chunk: int, table: torch.Tensor) -> torch.Tensor:
    """:func:`qsgd._triton.crc_chunks`."""
    chunks = data.numel() // chunk
    out = torch.empty(chunks, dtype=torch.int32, device=data.device)
    lanes = 128
    with _LAUNCH:
        _crc_kernel[(triton.cdiv(chunks, lanes),)](data, out, table, chunks, CHUNK=chunk,
                                                    LANES=lanes)
    return out.to(torch.int64) & 0xFFFFFFFF


def _block(cfg) -> int:
    return triton.next_power_of_2(cfg.bucket_size)


def encode_into(flat: torch.Tensor, cfg, key: tuple[int, int], scales: torch.Tensor,
                codes: torch.Tensor) -> None:
    """:func:`qsgd._triton.encode_into`."""
    n = flat.numel()
    nb = scales.numel()
    if n == 0:
        return
    with _LAUNCH:
        _encode_kernel[(nb,)](flat, scales, codes, n, _signed32(key[0]), _signed32(key[1]),
                              D=cfg.bucket_size, S=cfg.levels, B=cfg.bits, BLOCK=_block(cfg),
                              enable_fp_fusion=False)


def decode(codes: torch.Tensor, scale_bytes: torch.Tensor, numel: int, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`qsgd._triton.decode`."""
    nb = scale_bytes.numel() // 4
    out = torch.empty(numel, dtype=torch.float32, device=codes.device)
    bad = torch.zeros(nb, dtype=torch.int32, device=codes.device)
    if numel:
        with _LAUNCH:
            _decode_kernel[(nb,)](codes, scale_bytes.view(torch.float32),
                                  scale_bytes.view(torch.int32), out, bad, numel,
                                  D=cfg.bucket_size, S=cfg.levels, B=cfg.bits, BLOCK=_block(cfg),
                                  enable_fp_fusion=False)
    return out, (bad == 0).all()
