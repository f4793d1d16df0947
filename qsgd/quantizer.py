"""The QSGD quantizer Q_s (Alistarh et al. 2017, Section 3.1), per bucket, with unbiased
stochastic rounding driven by counter-based randomness (:mod:`qsgd.rng`).

For a bucket ``v`` of ``d`` consecutive coordinates of the flattened tensor with scale
``S = max|v_i|`` or ``S = ||v||_2``: ``a_i = |v_i| * (s / S)`` (float32), ``l = floor(a_i)``,
level ``l + 1`` when ``u_i < a_i - l`` else ``l`` (``u_i`` the element's uniform), capped at
``s``, signed like ``v_i``. Dequantization is ``level * (S / s)`` in float32, cast back to the
input's dtype. ``E[Q(v)] = v`` (up to the 2**-24 resolution of ``u``).

Two implementations compute the same bits: numba kernels for CPU tensors (fast, parallel) and
device-agnostic torch integer/float32 ops for any other device (the reference). A bucket whose
scale is zero, or so small (below ``s / FLT_MAX``, about 1e-34) that ``s / S`` overflows
float32, is all zeros. The l2 norm is summed in float64; numba sums in index order, torch in its
own order, so an l2 scale can in rare cases differ in the last float32 bit between the paths;
max-norm scales and, given equal scales, levels are always identical.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from qsgd import rng
from qsgd.config import QSGDConfig
from qsgd.errors import ConfigError

#: input dtypes accepted by quantize/encode.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: elements per piece of the torch path (bounds its int64 temporaries to ~100 MB).
_TORCH_PIECE = 1 << 22


def level_dtype(cfg: QSGDConfig) -> torch.dtype:
    """int8 levels for s <= 127, int16 up to 32767."""
    return torch.int8 if cfg.levels <= 127 else torch.int16


@dataclass(frozen=True)
class Quantized:
    """A quantized tensor.

    Attributes
    ----------
    levels : Tensor
        Flat signed levels in ``[-s, s]`` (int8 when ``s <= 127``, else int16), ``numel`` long,
        on the input's device.
    scales : Tensor
        Float32 scale of each bucket, ``ceil(numel / d)`` long.
    shape : torch.Size
        Shape of the original tensor.
    dtype : torch.dtype
        Dtype of the original tensor (what :func:`dequantize` returns).
    cfg : QSGDConfig
    """

    levels: torch.Tensor
    scales: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    cfg: QSGDConfig

    def __post_init__(self) -> None:
        numel = math.prod(self.shape)
        if self.levels.dim() != 1 or self.levels.numel() != numel:
            raise ValueError(f"levels must be flat with {numel} elements, got shape {tuple(self.levels.shape)}")
        nb = -(-numel // self.cfg.bucket_size)
        if self.scales.dim() != 1 or self.scales.numel() != nb or self.scales.dtype != torch.float32:
            raise ValueError(f"scales must be {nb} float32 values, got {self.scales.dtype} "
                             f"shape {tuple(self.scales.shape)}")

    @property
    def numel(self) -> int:
        return self.levels.numel()


def check_input(x, cfg) -> None:
    """Type checks shared by quantize and encode (ValueError/ConfigError naming the field)."""
    if not isinstance(cfg, QSGDConfig):
        raise ConfigError(f"cfg must be a QSGDConfig, got {type(cfg).__name__}")
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise ValueError(f"x.dtype must be one of float32, float16, bfloat16, got {x.dtype}")


def raise_nonfinite(flat: torch.Tensor) -> None:
    """Raise the ValueError that says how many NaN/Inf ``flat`` holds and where the first is."""
    bad = ~torch.isfinite(flat)
    count = int(bad.sum())
    first = int(bad.nonzero()[0, 0])
    raise ValueError(f"x holds {count} NaN or Inf value(s); the first at flat index {first} "
                     f"({float(flat[first])})")


def flat_float32(x: torch.Tensor) -> torch.Tensor:
    """x flattened as float32 (a view when x is contiguous float32)."""
    return x.detach().reshape(-1).to(torch.float32)


# ---------------------------------------------------------------------------------------------
# torch reference (any device)

def _scales_torch(v: torch.Tensor, cfg: QSGDConfig) -> torch.Tensor:
    """Scales of the rows of v (nb, d) zero-padded, float32."""
    if cfg.norm == "l2":
        return v.double().square().sum(1).sqrt().float()
    return v.abs().amax(1)


def _inverse_torch(scale: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = torch.full_like(scale, float(s)) / scale
    ok = (scale > 0) & (inv <= torch.finfo(torch.float32).max)
    zero = torch.zeros_like(scale)
    return torch.where(ok, inv, zero), torch.where(ok, scale, zero)


def _levels_torch(v: torch.Tensor, inv: torch.Tensor, s: int, first: int,
                  key: tuple[int, int]) -> torch.Tensor:
    """int32 signed levels of the flat piece v (elements first.. of the tensor); inv per element."""
    a = v.abs() * inv
    lv = a.to(torch.int32)
    frac = a - lv.to(torch.float32)
    index = torch.arange(first, first + v.numel(), device=v.device, dtype=torch.int64)
    u = rng.uniforms(index, key, below=first + v.numel())
    lv = (lv + (u < frac).to(torch.int32)).clamp_(max=s)
    return torch.where(v < 0, -lv, lv)


def quantize_torch(flat: torch.Tensor, cfg: QSGDConfig, key: tuple[int, int]):
    """(levels, scales) of a flat float32 tensor with torch ops on its own device."""
    n, d, s = flat.numel(), cfg.bucket_size, cfg.levels
    nb = -(-n // d)
    levels = torch.empty(n, dtype=level_dtype(cfg), device=flat.device)
    scales = torch.empty(nb, dtype=torch.float32, device=flat.device)
    per = max(1, _TORCH_PIECE // d)  # buckets per piece
    for b0 in range(0, nb, per):
        b1 = min(nb, b0 + per)
        i0, i1 = b0 * d, min(n, b1 * d)
        piece = flat[i0:i1]
        padded = piece
        if (i1 - i0) != (b1 - b0) * d:
            padded = torch.zeros((b1 - b0) * d, dtype=torch.float32, device=flat.device)
            padded[: i1 - i0] = piece
        inv, scale = _inverse_torch(_scales_torch(padded.view(b1 - b0, d), cfg), s)
        scales[b0:b1] = scale
        inv_el = inv.repeat_interleave(d)[: i1 - i0]
        levels[i0:i1] = _levels_torch(piece, inv_el, s, i0, key).to(levels.dtype)
    return levels, scales


def dequantize_flat(levels: torch.Tensor, scales: torch.Tensor, cfg: QSGDConfig) -> torch.Tensor:
    """Flat float32 ``level * (scale / s)`` (torch, any device; decoders match it bit for bit)."""
    n, d = levels.numel(), cfg.bucket_size
    # a tensor divisor: CUDA divides by a Python scalar as a multiplication by its reciprocal,
    # which differs from the numba decoders' true division in the last bit
    step = scales / torch.full_like(scales, float(cfg.levels))
    out = levels.to(torch.float32)
    full = n // d
    if full:
        out[: full * d].view(full, d).mul_(step[:full, None])
    if full * d < n:
        out[full * d:].mul_(step[full])
    return out


# ---------------------------------------------------------------------------------------------
# numba (CPU)

def quantize_numba(flat: torch.Tensor, cfg: QSGDConfig, key: tuple[int, int]):
    """(levels, scales) of a flat float32 CPU tensor with the numba kernel."""
    from qsgd import _kernels

    n, d = flat.numel(), cfg.bucket_size
    nb = -(-n // d)
    x = flat.numpy()
    levels = np.empty(n, dtype=np.int8 if cfg.levels <= 127 else np.int16)
    scales = np.empty(nb, dtype=np.float32)
    bad = np.zeros(nb, dtype=np.uint8)
    if n:
        kernel = _kernels.quantize_levels if n >= _kernels.PARALLEL_MIN else _kernels.quantize_levels_serial
        kernel(x, x.view(np.uint32), d, cfg.levels, cfg.norm == "l2", np.uint32(key[0]),
               np.uint32(key[1]), scales, scales.view(np.uint32), levels, bad)
        if bad.any():
            raise_nonfinite(flat)
    return torch.from_numpy(levels), torch.from_numpy(scales)


#: implementations of the quantizer: name -> function(flat fp32, cfg, key) -> (levels, scales)
BACKENDS = {"numba": quantize_numba, "torch": quantize_torch}


def pick_backend(flat: torch.Tensor, backend: str | None) -> str:
    if backend is None:
        return "numba" if flat.device.type == "cpu" else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)} or None, got {backend!r}")
    if backend == "numba" and flat.device.type != "cpu":
        raise ValueError(f"backend 'numba' needs a CPU tensor, got device {flat.device}")
    return backend


def prepare(x: torch.Tensor, cfg: QSGDConfig, seed: int, rank: int, step: int, bucket: int,
            backend: str | None) -> tuple[torch.Tensor, object, str]:
    """What quantizing and encoding start from: ``(flat float32 x, stream key, backend name)``.

    Checks the input (dtype, config, NaN/Inf) once; the numba kernels check finiteness in
    their own pass, the torch path here.
    """
    check_input(x, cfg)
    key = rng.stream_key(seed, rank, step, bucket)
    flat = flat_float32(x)
    name = pick_backend(flat, backend)
    if name == "torch" and flat.numel() and not bool(torch.isfinite(flat).all()):
        raise_nonfinite(flat)
    return flat, key, name


def quantize(x: torch.Tensor, cfg: QSGDConfig, seed: int = 0, *, rank: int = 0, step: int = 0,
             bucket: int = 0, backend: str | None = None) -> Quantized:
    """Quantize ``x`` (any shape; float32, float16 or bfloat16) with QSGD.

    Parameters
    ----------
    x : Tensor
    cfg : QSGDConfig
    seed, rank, step, bucket : int
        Select the random stream (see :mod:`qsgd.rng`); each in ``[0, 2**64)``.
    backend : {None, "numba", "torch"}
        None picks numba for CPU tensors and torch ops elsewhere; both give the same levels.

    Raises
    ------
    ValueError
        If ``x`` holds NaN or Inf (the message gives their count and the first flat index).

    Examples
    --------
    Levels are integers in [-s, s]; each bucket of d coordinates keeps one scale, and the same
    (seed, rank, step, bucket) always gives the same levels.

    >>> import torch, qsgd
    >>> cfg = qsgd.QSGDConfig.from_bits(4, bucket_size=4)           # s = 7
    >>> q = qsgd.quantize(torch.tensor([0.5, -1.0, 0.25, 0.0, 2.0, 0.0]), cfg, seed=1)
    >>> q.scales.tolist()                                           # max |v| per bucket
    [1.0, 2.0]
    >>> bool((q.levels.abs() <= 7).all()), q.levels[3].item(), q.levels[4].item()
    (True, 0, 7)
    """
    flat, key, name = prepare(x, cfg, seed, rank, step, bucket, backend)
    levels, scales = BACKENDS[name](flat, cfg, key)
    return Quantized(levels=levels, scales=scales, shape=x.shape, dtype=x.dtype, cfg=cfg)


def dequantize(q: Quantized) -> torch.Tensor:
    """The tensor that ``q`` stands for: shape and dtype of the original, on the levels' device.

    Examples
    --------
    Unbiased: the mean of many independent quantizations approaches the input (Lemma 3.1).

    >>> import torch, qsgd
    >>> cfg = qsgd.QSGDConfig.from_bits(2, bucket_size=8)           # s = 1: levels -1, 0, 1
    >>> x = torch.linspace(-1, 1, 8)
    >>> mean = sum(qsgd.dequantize(qsgd.quantize(x, cfg, seed=0, step=k)) for k in range(2000)) / 2000
    >>> float((mean - x).abs().max()) < 0.05
    True
    """
    if not isinstance(q, Quantized):
        raise ValueError(f"q must be a Quantized, got {type(q).__name__}")
    out = dequantize_flat(q.levels, q.scales, q.cfg)
    return out.to(q.dtype).reshape(q.shape)
