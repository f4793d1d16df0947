"""``encode`` / ``decode``: QSGD payloads in the self-describing wire format of :mod:`qsgd.wire`.

``decode(encode(x, cfg, seed))`` equals ``dequantize(quantize(x, cfg, seed))`` bit for bit for
every codec; a truncated, extended or corrupted payload raises :class:`qsgd.PayloadError`.
"""
from __future__ import annotations

import numpy as np
import torch

from qsgd import devicecodec, elias, packed, wire
from qsgd.config import QSGDConfig
from qsgd.errors import ConfigError, PayloadError
from qsgd.quantizer import prepare
from ._checks import is_int


def _encode_packed(flat, cfg, key, backend, dtype, shape) -> np.ndarray:
    buf = wire.new_payload(cfg, dtype, shape, packed.body_nbytes(flat.numel(), cfg))
    body = wire.body_view(buf, len(shape))
    if backend == "numba":
        packed.encode_numba_into(flat, cfg, key, body)
    else:
        body[:] = packed.encode_torch_body(flat, cfg, key).cpu().numpy()
    return wire.seal(buf)


def _decode_packed(body, numel, cfg, device) -> torch.Tensor:
    if device.type == "cpu":
        return packed.decode_numba(body, numel, cfg)
    return packed.decode_torch(body, numel, cfg, device)


def _decode_elias(body, numel, cfg, device) -> torch.Tensor:
    return elias.decode(body, numel, cfg).to(device)


#: codec name -> (encode(flat, cfg, key, backend, dtype, shape) -> sealed numpy payload,
#:                decode(body, numel, cfg, device) -> flat float32 tensor)
CODECS = {
    "packed": (_encode_packed, _decode_packed),
    "elias": (elias.encode, _decode_elias),
}


def encode(x: torch.Tensor, cfg: QSGDConfig, seed: int = 0, *, rank: int = 0, step: int = 0,
           bucket: int = 0, backend: str | None = None) -> torch.Tensor:
    """Quantize ``x`` and encode it as a self-describing payload.

    Parameters
    ----------
    x : Tensor
        Any shape; float32, float16 or bfloat16; any device.
    cfg : QSGDConfig
    seed, rank, step, bucket : int
        The random stream, as in :func:`qsgd.quantize`.
    backend : {None, "numba", "torch"}
        None: numba on CPU, torch ops elsewhere.

    Returns
    -------
    Tensor
        1-D ``torch.uint8`` payload on ``x``'s device; its size in bytes is
        :func:`payload_nbytes` for the packed codec.

    Examples
    --------
    >>> import torch, qsgd
    >>> x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    >>> packed = qsgd.encode(x, qsgd.QSGDConfig.from_bits(4, bucket_size=512))
    >>> len(packed), 4 * x.numel()                # bytes on the wire against fp32
    (5116, 40000)
    >>> elias = qsgd.encode(x, qsgd.QSGDConfig(levels=1, bucket_size=512, norm="l2", codec="elias"))
    >>> len(elias) < len(packed)                  # Elias codes of sparse levels are smaller
    True
    """
    flat, key, name = prepare(x, cfg, seed, rank, step, bucket, backend)
    if cfg.codec == "packed" and flat.device.type != "cpu":
        # built where x is, CRC included: no round trip through the host
        return devicecodec.encode(flat, cfg, key, x.dtype, tuple(x.shape))[0]
    encode_fn, _ = CODECS[cfg.codec]
    buf = encode_fn(flat, cfg, key, name, x.dtype, tuple(x.shape))
    payload = torch.from_numpy(buf)
    return payload if x.device.type == "cpu" else payload.to(x.device)


def decode(payload, *, device=None) -> torch.Tensor:
    """The tensor a payload stands for (shape and dtype of the original).

    Parameters
    ----------
    payload : Tensor or bytes-like
        A 1-D ``torch.uint8`` tensor (any device), or bytes.
    device : torch.device or str, optional
        Where to put the result; default the payload's device (CPU for bytes).

    Raises
    ------
    PayloadError
        If the payload is truncated, extended, corrupted or inconsistent; the message says what.

    Examples
    --------
    >>> import torch, qsgd
    >>> cfg = qsgd.QSGDConfig.from_bits(8)
    >>> x = torch.arange(6.0).reshape(2, 3)
    >>> y = qsgd.decode(qsgd.encode(x, cfg, seed=3))
    >>> y.shape, y.dtype, torch.equal(y, qsgd.dequantize(qsgd.quantize(x, cfg, seed=3)))
    (torch.Size([2, 3]), torch.float32, True)
    >>> bad = qsgd.encode(x, cfg)
    >>> bad[-1] ^= 1
    >>> qsgd.decode(bad)
    Traceback (most recent call last):
    ...
    qsgd.errors.PayloadError: CRC-32 mismatch: ...
    """
    if device is None:
        device = payload.device if isinstance(payload, torch.Tensor) else torch.device("cpu")
    device = torch.device(device)
    if _on_device(payload) and device == payload.device:
        # the header's bytes come to the host, the body stays: checked with device ops, and
        # the flag read once; a payload that fails is parsed on the host, which says why
        size = payload.numel()
        header = wire.parse_header(payload[: min(size, wire.MAX_HEADER_NBYTES)].cpu().numpy(), size)
        if header.cfg.codec == "packed":
            flat, ok = devicecodec.decode(payload, header.numel, header.cfg, header.dtype, header.shape)
            if bool(ok):
                return flat.to(header.dtype).reshape(header.shape)
    header, body = wire.parse(wire.as_bytes(payload))
    _, decode_fn = CODECS[header.cfg.codec]
    flat = decode_fn(body, header.numel, header.cfg, device)
    return flat.to(header.dtype).reshape(header.shape)


def _on_device(payload) -> bool:
    return (isinstance(payload, torch.Tensor) and payload.device.type != "cpu"
            and payload.dtype == torch.uint8 and payload.dim() == 1)


def payload_nbytes(numel: int, cfg: QSGDConfig, *, ndim: int = 1) -> int:
    """Exact bytes of a packed payload of ``numel`` elements in ``ndim`` dimensions.

    ``ceil(n b / 8) + 4 ceil(n / d) + 28 + 8 ndim`` (header 24 + 8 ndim, CRC 4). The elias
    codec's size depends on the data; this raises ConfigError for it.

    Examples
    --------
    >>> import qsgd
    >>> qsgd.payload_nbytes(10_000, qsgd.QSGDConfig.from_bits(4, bucket_size=512))
    5116
    """
    if not isinstance(cfg, QSGDConfig):
        raise ConfigError(f"cfg must be a QSGDConfig, got {type(cfg).__name__}")
    if cfg.codec != "packed":
        raise ConfigError(f"payload_nbytes is exact only for codec='packed', got codec={cfg.codec!r}; "
                          "measure len(encode(x, cfg)) instead")
    if not is_int(numel) or numel < 0:
        raise ValueError(f"numel must be an int >= 0, got {numel!r}")
    if not is_int(ndim) or not 0 <= ndim <= wire.MAX_NDIM:
        raise ValueError(f"ndim must be an int in [0, {wire.MAX_NDIM}], got {ndim!r}")
    if ndim == 0 and numel != 1:
        raise ValueError(f"a 0-D tensor has 1 element, got numel={numel}")
    return packed.body_nbytes(numel, cfg) + wire.overhead_nbytes(ndim)


__all__ = ["encode", "decode", "payload_nbytes", "PayloadError"]
