"""Fused packed-codec kernels for CUDA, in Triton: one program per bucket quantizes and packs,
or unpacks, checks and dequantizes, in one pass over the data.

A third kernel runs the CRC-32 register over chunks of a payload, a chunk per lane
(:mod:`qsgd.crc` joins the chunks). The torch path of :mod:`qsgd.packed` runs a chain of
elementwise kernels (the hash alone is a dozen) and was measured at 200-250x a device-to-device
copy of its input on an H200 (``benchmarks/RESULTS.md``); these kernels read the input once and
write the payload once. This module decides where they run and checks them once per device;
:mod:`qsgd._triton_kernels` holds them and is imported only then.

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

import functools
import os

import torch

#: largest bucket a program holds (elements): beyond, the torch path.
MAX_BUCKET = 1 << 14
#: most elements per call: bit offsets (n b) stay int32.
MAX_NUMEL = 1 << 28


def _runs_on(t: torch.Tensor) -> bool:
    """Triton is installed and can run where ``t`` is (CUDA, or CPU in its interpreter)."""
    here = t.is_cuda or (t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")
    return here and _kernels() is not None


def usable(t: torch.Tensor, cfg) -> bool:
    """Whether the fused kernels can encode or decode ``t`` (or payloads on its device) with ``cfg``."""
    if not _runs_on(t):
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


@functools.lru_cache(maxsize=None)
def _kernels():
    """The kernels' module, or None where Triton is not installed (torch's CPU wheels do not
    bring it): then torch ops do the work."""
    try:
        from qsgd import _triton_kernels
    except ImportError:
        return None
    return _triton_kernels


def usable_for_crc(data: torch.Tensor) -> bool:
    """Whether :func:`crc_chunks` runs where ``data`` is."""
    return _runs_on(data) and _works(data.device, "crc")


def crc_chunks(data: torch.Tensor, chunk: int, table: torch.Tensor) -> torch.Tensor:
    """int64 ``L`` (the CRC register from 0, not inverted) of each ``chunk``-byte run of
    ``data`` (a whole number of them); ``table`` the 256 register-update words as int32."""
    return _kernels().crc_chunks(data, chunk, table)


def encode_into(flat: torch.Tensor, cfg, key: tuple[int, int], scales: torch.Tensor,
                codes: torch.Tensor) -> None:
    """Quantize and pack ``flat`` (float32) into ``scales`` (float32, one per bucket) and
    ``codes`` (uint8, ``ceil(n b / 8)``): the body of :mod:`qsgd.wire`, bit for bit."""
    _kernels().encode_into(flat, cfg, key, scales, codes)


def decode(codes: torch.Tensor, scale_bytes: torch.Tensor, numel: int, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 values, 0-d bool ok) of a packed body's code bytes and its scales' bytes
    (``4 nb`` uint8, 4-aligned); ok is False for an invalid scale, a code above ``2 s`` or a
    zero scale with nonzero levels."""
    return _kernels().decode(codes, scale_bytes, numel, cfg)
