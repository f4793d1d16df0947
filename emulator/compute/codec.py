"""QSGD's packed codec on a target GPU: the bytes its kernels move, at the GPU's bandwidth.

The codec is memory-bound: it streams the gradient in and the payload out, and checks the
payload with a CRC-32. Its one measurement on a GPU (``benchmarks/RESULTS.md``, "The codec
and the hook on a CUDA device", fused kernels, 2**26 float32 elements on an H200) gives how
many bytes per element its kernels move as they are today, as multiples of a float32 element's
read and write (8 bytes): far more than the 4.5 bytes of quantizing and packing alone, since
the CRC expands each payload bit to a float32 and multiplies matrices. On another GPU the
same traffic takes ``effective bytes / bandwidth``, plus the kernels' launches
(:data:`CALL_KERNELS` x ``KERNEL_S``). Widths between the measured ones are interpolated
linearly in bits (wider: extrapolated from 4 and 8 bits), and decoding scales with encoding's
traffic from the one measured decode width.

:data:`CODECS` names the codec a prediction assumes: ``"today"`` (the measurement above, the
default) or ``"fused"``, the single-pass codec the GPU-codec issue sets as its target (encode
and decode each at half a device-to-device copy's bandwidth: two float32 copies' traffic per
element, CRC included), a what-if of what QSGD would buy once that kernel exists.
"""
from __future__ import annotations

from .devices import DEVICES, Device
from .rules import KERNEL_S

#: Seconds per call on an H200, 2**26 float32 elements, packed codec, fused Triton kernels
#: (benchmarks/RESULTS.md, table "fused" column: encode at 2, 4, 8 bits; decode at 4 bits).
H200_SECONDS = {"encode": {2: 6.6e-3, 4: 8.2e-3, 8: 19.5e-3}, "decode": {4: 6.8e-3}}
H200_ELEMENTS = 2**26
#: Kernels one call launches on the hook's path (qsgd/devicecodec.py): encode = finiteness
#: and norm passes, the fused quantize-and-pack, the CRC's chunk pass and three tree levels,
#: the header's copy; decode = the CRC's four, the fused unpack-check-dequantize, its flag.
CALL_KERNELS = {"encode": 8, "decode": 6}


def _element_bytes(kind: str, bits: int) -> float:
    """Effective bytes per element the codec's kernels move (H200 measurement / bandwidth)."""
    h200 = DEVICES["H200"]

    def at(b: int, table: dict) -> float:
        secs = table[b] - CALL_KERNELS[kind] * KERNEL_S
        return secs * h200.mem_bandwidth / H200_ELEMENTS

    enc = H200_SECONDS["encode"]
    pts = sorted(enc)
    if bits <= pts[0]:
        e = at(pts[0], enc)
    elif bits >= pts[-1]:
        lo, hi = pts[-2], pts[-1]
        e = at(hi, enc) + (bits - hi) * (at(hi, enc) - at(lo, enc)) / (hi - lo)
    else:
        lo = max(p for p in pts if p <= bits)
        hi = min(p for p in pts if p >= bits)
        e = at(lo, enc) if lo == hi else \
            at(lo, enc) + (bits - lo) * (at(hi, enc) - at(lo, enc)) / (hi - lo)
    if kind == "encode":
        return e
    return e * at(4, H200_SECONDS["decode"]) / at(4, enc)


def _fused_bytes(kind: str, bits: int) -> float:
    """Bytes per element of the target codec: twice a float32 element's read and write."""
    del kind, bits
    return 2 * 8.0


#: codec name -> effective bytes per element, function of (kind, bits) (module docstring)
CODECS = {"today": _element_bytes, "fused": _fused_bytes}


def codec_seconds(kind: str, numel: int, bits: int, device: Device, codec: str = "today") -> float:
    """Seconds to ``kind`` ("encode" or "decode") a bucket of ``numel`` elements at ``bits``
    bits on ``device`` (0 for an empty bucket).

    Examples
    --------
    The measurement it comes from is reproduced on its own device:

    >>> from emulator.compute.devices import device
    >>> round(codec_seconds("encode", 2**26, 4, device("H200")) * 1e3, 2)
    8.2
    >>> codec_seconds("encode", 2**26, 4, device("A100")) > codec_seconds("encode", 2**26, 4, device("H200"))
    True
    >>> round(codec_seconds("encode", 2**26, 4, device("H200"), "fused") * 1e3, 2)   # the target
    0.25
    """
    if numel <= 0:
        return 0.0
    if kind not in CALL_KERNELS:
        raise ValueError(f"kind must be 'encode' or 'decode', got {kind!r}")
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {list(CODECS)}, got {codec!r}")
    return (CODECS[codec](kind, bits) * numel / device.mem_bandwidth
            + CALL_KERNELS[kind] * KERNEL_S)
