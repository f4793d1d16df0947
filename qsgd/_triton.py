"""Fused packed-codec kernels for CUDA, in Triton: one program per bucket quantizes and packs,
or unpacks, checks and dequantizes, in one pass over the data.

A third kernel runs the CRC-32 register over chunks of a payload, a chunk per lane
(:mod:`qsgd.crc` joins the chunks). The torch path of :mod:`qsgd.packed` runs a chain of elementwise kernels (the hash alone is a
dozen) and was measured at 200-250x a device-to-device copy of its input on an H200
(``benchmarks/RESULTS.md``); these kernels read the input once and write the payload once.

They compute the bits of the numba kernels and of the torch reference exactly:

- the uniform of element ``i`` is :mod:`qsgd.rng`'s (uint32 arithmetic wraps in Triton as in
  numba);
- ``s / scale`` and ``scale / s`` are correctly rounded divisions (``div_rn``: Triton's plain
  float32 division is an approximation on CUDA);
- ``|x| * inv`` and ``a - floor(a)`` are two rounded operations, never one fused
  multiply-add: the kernels are compiled with ``enable_fp_fusion=False``.

Covered: max-norm buckets, 2-, 4- and 8-bit codes (whole codes per byte), buckets holding a
whole number of bytes of codes, fewer than 2**28 elements. Anything else takes the torch path
(:func:`usable` says which). With ``TRITON_INTERPRET=1`` the kernels run on CPU tensors in
Triton's interpreter, which is how they are tested without a GPU.
"""
from __future__ import annotations

import os
import threading

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (the CPU wheels of torch do not bring it): torch ops instead
    triton = None

#: largest bucket a program holds (elements): beyond, the torch path.
MAX_BUCKET = 1 << 14
#: most elements per call: bit offsets (n b) stay int32.
MAX_NUMEL = 1 << 28


def usable(t: torch.Tensor, cfg) -> bool:
    """Whether the fused kernels can encode or decode ``t`` (or payloads on its device) with ``cfg``."""
    if triton is None:
        return False
    if not (t.is_cuda or (t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")):
        return False
    b = cfg.bits
    if not (cfg.norm == "max" and 8 % b == 0 and cfg.bucket_size % (8 // b) == 0
            and cfg.bucket_size <= MAX_BUCKET and t.numel() < MAX_NUMEL):
        return False
    return _works(t.device, "codec")


_WORKS: dict = {}


def _works(device: torch.device, what: str) -> bool:
    """Once per device and kernel family (``"codec"``, ``"crc"``): do the kernels build there
    and give the torch path's bytes? A Triton too old or too new for them then costs speed,
    with a warning, not a wrong payload."""
    key = (device, what)
    if key not in _WORKS:
        _WORKS[key] = True             # the check itself runs the kernels
        try:
            _WORKS[key] = _SELF_CHECKS[what](device)
            reason = "their bytes differ from the torch path's"
        except Exception as exc:       # a compile or launch error of this Triton
            _WORKS[key] = False
            reason = f"{type(exc).__name__}: {exc}"
        if not _WORKS[key]:
            import warnings

            warnings.warn(f"qsgd: the fused Triton {what} kernels are off on {device} ({reason}); "
                          "torch ops do their work instead", RuntimeWarning, stacklevel=3)
    return _WORKS[key]


def _check_crc(device: torch.device) -> bool:
    import zlib

    from qsgd.crc import CHUNK, _on

    data = torch.randint(0, 256, (5 * CHUNK,), generator=torch.Generator().manual_seed(1),
                         dtype=torch.uint8)
    regs = crc_chunks(data.to(device), CHUNK, _on(device, "table")).cpu().tolist()
    # L of a chunk is zlib's CRC of it with the preset and the final inversion taken out,
    # i.e. crc32(chunk) xor crc32(zeros) (qsgd.crc's affine identity)
    zeros = zlib.crc32(bytes(CHUNK))
    want = [zlib.crc32(data[c * CHUNK:(c + 1) * CHUNK].numpy().tobytes()) ^ zeros for c in range(5)]
    return regs == want


def _check_codec(device: torch.device) -> bool:
    from qsgd import packed
    from qsgd.config import QSGDConfig
    from qsgd.quantizer import dequantize_flat

    cfg = QSGDConfig.from_bits(4, bucket_size=64)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(device)
    nb = -(-x.numel() // cfg.bucket_size)
    body = torch.empty(packed.body_nbytes(x.numel(), cfg), dtype=torch.uint8, device=device)
    encode_into(x, cfg, (12345, 3_000_000_000), body[: 4 * nb].view(torch.float32), body[4 * nb:])
    if not torch.equal(body, packed.encode_torch_body(x, cfg, (12345, 3_000_000_000))):
        return False
    values, ok = decode(body[4 * nb:], body[: 4 * nb].clone(), x.numel(), cfg)
    levels, scales, _ = packed.unpack_checked_torch(body, x.numel(), cfg)
    return bool(ok) and torch.equal(values, dequantize_flat(levels, scales, cfg))


_SELF_CHECKS = {"codec": _check_codec, "crc": _check_crc}


# The hook launches from two threads (backward's encodes, the callback thread's decodes).
# Triton's interpreter swaps module state during a launch and fails when two overlap; on CUDA
# the lock only orders two asynchronous launches.
_LAUNCH = threading.Lock()


def _signed32(k: int) -> int:
    # keys go in as int32 so that every key compiles to the same kernel signature
    return k - (1 << 32) if k >= (1 << 31) else k


if triton is not None:
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


def usable_for_crc(data: torch.Tensor) -> bool:
    """Whether :func:`crc_chunks` runs where ``data`` is."""
    if triton is None:
        return False
    if not (data.is_cuda or (data.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")):
        return False
    return _works(data.device, "crc")


def crc_chunks(data: torch.Tensor, chunk: int, table: torch.Tensor) -> torch.Tensor:
    """int64 ``L`` (the CRC register from 0, not inverted) of each ``chunk``-byte run of
    ``data`` (a whole number of them); ``table`` the 256 register-update words as int32."""
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
    """Quantize and pack ``flat`` (float32) into ``scales`` (float32, one per bucket) and
    ``codes`` (uint8, ``ceil(n b / 8)``): the body of :mod:`qsgd.wire`, bit for bit."""
    n = flat.numel()
    nb = scales.numel()
    if n == 0:
        return
    with _LAUNCH:
        _encode_kernel[(nb,)](flat, scales, codes, n, _signed32(key[0]), _signed32(key[1]),
                              D=cfg.bucket_size, S=cfg.levels, B=cfg.bits, BLOCK=_block(cfg),
                              enable_fp_fusion=False)


def decode(codes: torch.Tensor, scale_bytes: torch.Tensor, numel: int, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 values, 0-d bool ok) of a packed body's code bytes and its scales' bytes
    (``4 nb`` uint8, 4-aligned); ok is False for an invalid scale, a code above ``2 s`` or a
    zero scale with nonzero levels."""
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
