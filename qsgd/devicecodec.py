"""The packed codec on the tensor's own device, with its checks left on the device.

:func:`qsgd.encode` and :func:`qsgd.decode` raise at once on bad input, which on CUDA means
reading a flag on the host, a synchronisation per check. The hook cannot afford that inside
backward: here a payload of a known layout (every rank computes its size and header from the
config, :func:`qsgd.payload_nbytes`) is built and checked entirely with device ops, and each
call returns, beside its tensor, a 0-d bool tensor that is True when all is well. The caller
reads those flags once, where it waits anyway (the hook: at the end of backward), and on a
False one asks :func:`qsgd.decode` on the host for the exact :class:`qsgd.PayloadError`.

The bytes are those of :mod:`qsgd.wire` and :mod:`qsgd.packed`, bit for bit: the header is
built by :func:`qsgd.wire.new_payload`, the body by :func:`qsgd.packed.encode_torch_body`, the
CRC by :func:`qsgd.crc.crc32_tensor`; a body is unpacked and checked by
:func:`qsgd.packed.unpack_checked_torch`, the checks of the host decoders.
"""
from __future__ import annotations

import functools

import torch

from qsgd import _triton, packed, wire
from qsgd.config import QSGDConfig
from qsgd.crc import crc32_tensor
from qsgd.errors import PayloadError
from qsgd.quantizer import dequantize_flat


@functools.lru_cache(maxsize=512)
def _header(device: torch.device, cfg: QSGDConfig, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """The header bytes of a packed payload (on ``device``; cached, so copied there once)."""
    numel = 1
    for v in shape:
        numel *= v
    buf = wire.new_payload(cfg, dtype, shape, packed.body_nbytes(numel, cfg))
    return torch.from_numpy(buf[: wire.header_nbytes(len(shape))].copy()).to(device)


def payload_layout(numel: int, cfg: QSGDConfig, ndim: int = 1) -> tuple[int, int]:
    """(header bytes, body bytes) of a packed payload of ``numel`` elements."""
    return wire.header_nbytes(ndim), packed.body_nbytes(numel, cfg)


def encode(flat: torch.Tensor, cfg: QSGDConfig, key: tuple[int, int],
           dtype: torch.dtype = torch.float32, shape: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A 1-D packed payload of ``flat`` built on its device, and whether ``flat`` was finite.

    Parameters
    ----------
    flat : Tensor
        1-D float32, any device.
    cfg : QSGDConfig
        ``codec="packed"``.
    key : (int, int)
        The stream key (:func:`qsgd.rng.stream_key`).
    dtype : torch.dtype
        The dtype the payload says to decode to.
    shape : tuple of int, optional
        The shape it says to decode to (default ``(flat.numel(),)``).

    Returns
    -------
    (Tensor, Tensor)
        The ``torch.uint8`` payload (``qsgd.payload_nbytes(flat.numel(), cfg)`` bytes) and a
        0-d bool tensor, False when ``flat`` holds NaN or Inf; the payload's scales are then
        all NaN, so that every decoder rejects it.

    Examples
    --------
    >>> import torch, qsgd
    >>> from qsgd import devicecodec, rng
    >>> cfg = qsgd.QSGDConfig.from_bits(4, bucket_size=512)
    >>> x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    >>> payload, finite = devicecodec.encode(x, cfg, rng.stream_key(7))
    >>> bool(finite), torch.equal(payload, qsgd.encode(x, cfg, seed=7))
    (True, True)
    """
    if cfg.codec != "packed":
        raise PayloadError(f"the device codec is the packed one, got codec={cfg.codec!r}")
    n = flat.numel()
    shape = (n,) if shape is None else tuple(shape)
    hdr, body_n = payload_layout(n, cfg, len(shape))
    out = torch.empty(hdr + body_n + wire.TRAILER_NBYTES, dtype=torch.uint8, device=flat.device)
    out[:hdr] = _header(flat.device, cfg, dtype, shape)
    nb = -(-n // cfg.bucket_size)
    if n and _triton.usable(flat, cfg):
        _triton.encode_into(flat.contiguous(), cfg, key, out[hdr: hdr + 4 * nb].view(torch.float32),
                            out[hdr + 4 * nb: hdr + body_n])
    elif n:
        out[hdr: hdr + body_n] = packed.encode_torch_body(flat, cfg, key)
    finite = torch.isfinite(flat).all()
    if n:
        # A NaN or Inf gradient quantizes to a zero bucket, a valid payload; every scale is
        # made NaN instead, so that every rank that decodes it rejects it, in the same step
        scales = out[hdr: hdr + 4 * nb].view(torch.float32)
        scales.copy_(torch.where(finite, scales, torch.full_like(scales, float("nan"))))
    out[-wire.TRAILER_NBYTES:] = crc32_tensor(out[: -wire.TRAILER_NBYTES])
    return out, finite


def decode(payload: torch.Tensor, numel: int, cfg: QSGDConfig,
           dtype: torch.dtype = torch.float32, shape: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat float32 tensor of a packed payload of known layout, and whether it checks out.

    Parameters
    ----------
    payload : Tensor
        1-D ``torch.uint8`` on any device, expected to be a payload of ``numel`` elements
        encoded with ``cfg`` for ``dtype`` (as :func:`encode` makes).
    numel : int
    cfg : QSGDConfig
    dtype : torch.dtype
    shape : tuple of int, optional
        The shape the header must say (default ``(numel,)``).

    Returns
    -------
    (Tensor, Tensor)
        Float32 values (meaningless unless the flag is True) and a 0-d bool tensor, True when
        the header, the CRC and the body all check out.

    Raises
    ------
    PayloadError
        At once, if the payload's length is not the layout's (known on the host).

    Examples
    --------
    >>> import torch, qsgd
    >>> from qsgd import devicecodec
    >>> cfg = qsgd.QSGDConfig.from_bits(4)
    >>> payload = qsgd.encode(torch.ones(1000), cfg)
    >>> x, ok = devicecodec.decode(payload, 1000, cfg)
    >>> bool(ok), torch.equal(x, qsgd.decode(payload))
    (True, True)
    >>> payload[40] ^= 1
    >>> bool(devicecodec.decode(payload, 1000, cfg)[1])
    False
    """
    shape = (numel,) if shape is None else tuple(shape)
    hdr, body_n = payload_layout(numel, cfg, len(shape))
    want = hdr + body_n + wire.TRAILER_NBYTES
    if payload.dim() != 1 or payload.dtype != torch.uint8 or payload.numel() != want:
        raise PayloadError(f"a packed payload of {numel} elements at {cfg.bits} bits is {want} "
                           f"uint8 bytes, got {payload.numel()} {payload.dtype}")
    head_ok = (payload[:hdr] == _header(payload.device, cfg, dtype, shape)).all()
    crc_ok = (payload[-wire.TRAILER_NBYTES:] == crc32_tensor(payload[: -wire.TRAILER_NBYTES])).all()
    body = payload[hdr: hdr + body_n]
    if _triton.usable(payload, cfg) and numel:
        nb = -(-numel // cfg.bucket_size)
        values, body_good = _triton.decode(body[4 * nb:], body[: 4 * nb].clone(), numel, cfg)
        used = numel * cfg.bits % 8
        if used:
            body_good = body_good & ((body[-1] >> used) == 0)
        return values, head_ok & crc_ok & body_good
    levels, scales, body_good = packed.unpack_checked_torch(body, numel, cfg)
    return dequantize_flat(levels, scales, cfg), head_ok & crc_ok & body_good


__all__ = ["encode", "decode", "payload_layout"]
