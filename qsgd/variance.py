"""Quantization variance of real gradients: measured ratios and the Lemma 3.1 bound.

QSGD is unbiased; what it costs convergence is the added variance (Alistarh et al. 2017,
Theorem 3.2: the iterations needed grow with the second-moment bound of the quantized gradient).
Lemma 3.1 bounds it per scale bucket of ``d`` coordinates and ``s`` levels:
``E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2``. The proof goes through for the max
norm too: a coordinate's variance is ``(S/s)^2 p (1-p)`` with ``S`` the scale and ``p`` the
rounding probability, ``<= (S/s)^2 / 4`` and ``<= (S/s) |v_i|``, and ``S = max|v_i| <= ||v||``.

:func:`variance_ratios` samples ``E||Q(v) - v||^2 / ||v||^2`` for candidate bit widths with
fixed seeds (streams ``(seed, rank=0, step, bucket=sample)``, the hook's keys reused) and
splits the error over the parameters a bucket holds.

Example
-------
>>> import torch, qsgd
>>> v = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
>>> cfg = qsgd.QSGDConfig.from_bits(4, bucket_size=512)
>>> got = qsgd.variance_ratios(v, cfg, bits=(2, 4), samples=2, seed=0)
>>> got[2].ratio > got[4].ratio, got[4].ratio <= qsgd.lemma31_bound(10_000, cfg.bucket_size, 7)
(True, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from qsgd.config import QSGDConfig
from qsgd.errors import ConfigError
from qsgd.quantizer import dequantize, quantize
from ._checks import is_int

#: bit widths measured by default (what the recommender may choose from)
DEFAULT_BITS = (2, 3, 4, 5, 6, 8)


def lemma31_bound(numel: int, bucket_size: int, levels: int) -> float:
    """The Lemma 3.1 bound ``min(d / s^2, sqrt(d) / s)`` on ``E||Q(v)-v||^2 / ||v||^2``.

    ``d`` is the scale-bucket size, capped at ``numel`` (a shorter vector is one bucket); a
    vector split into several buckets obeys the bound of its largest bucket.

    Examples
    --------
    >>> lemma31_bound(1_000_000, 512, 7)       # min(512/49, sqrt(512)/7)
    3.23...
    """
    for name, v in (("numel", numel), ("bucket_size", bucket_size), ("levels", levels)):
        if not is_int(v) or v < 1:
            raise ConfigError(f"{name}: expected an int >= 1, got {v!r}")
    d = min(bucket_size, numel)
    return min(d / levels ** 2, math.sqrt(d) / levels)


@dataclass(frozen=True)
class Ratio:
    """A measured variance ratio at one bit width.

    Attributes
    ----------
    ratio : float
        Mean over samples of ``||Q(v) - v||^2 / ||v||^2`` (0 for a zero vector).
    bound : float
        :func:`lemma31_bound` for the vector's length and the width's levels.
    segments : tuple of float
        Mean over samples of each segment's ``||Q(v)_j - v_j||^2`` (squared gradient units).
    """

    ratio: float
    bound: float
    segments: tuple[float, ...]


def variance_ratios(v: torch.Tensor, cfg: QSGDConfig, bits: Sequence[int] = DEFAULT_BITS, *,
                    samples: int = 2, seed: int = 0, step: int = 0,
                    segments: Sequence[int] | None = None) -> dict[int, Ratio]:
    """Measured ``E||Q_b(v) - v||^2 / ||v||^2`` of ``v`` for each bit width ``b`` in ``bits``.

    Parameters
    ----------
    v : Tensor
        The flat gradient (a bucket's compressed elements).
    cfg : QSGDConfig
        Its bucket size and norm are kept; ``levels`` is set from each width
        (:meth:`QSGDConfig.from_bits`).
    bits : sequence of int
        Widths, each in 2..16.
    samples : int
        Independent quantizations averaged per width (streams ``bucket = sample``).
    seed, step : int
        Stream keys.
    segments : sequence of int, optional
        Lengths splitting ``v`` (summing to its length): the error is also reported per segment.

    Returns
    -------
    dict
        Width -> :class:`Ratio`.

    Examples
    --------
    >>> import torch, qsgd
    >>> v = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    >>> r = variance_ratios(v, qsgd.QSGDConfig.from_bits(4), bits=(8,), segments=[1024, 3072])[8]
    >>> 0 < r.ratio < r.bound, len(r.segments)
    (True, 2)
    """
    if not is_int(samples) or samples < 1:
        raise ConfigError(f"samples: expected an int >= 1, got {samples!r}")
    flat = v.detach().reshape(-1).float()
    n = flat.numel()
    if n == 0:
        raise ConfigError("v: expected at least one element, got an empty tensor")
    segments = [n] if segments is None else list(segments)
    if sum(segments) != n or any(not is_int(s) or s < 1 for s in segments):
        raise ConfigError(f"segments: expected lengths >= 1 summing to {n}, got {segments!r}")
    norm_sq = float(flat.double().square().sum())
    out = {}
    for b in bits:
        c = QSGDConfig.from_bits(b, bucket_size=cfg.bucket_size, norm=cfg.norm, codec="packed")
        seg = torch.zeros(len(segments), dtype=torch.float64)
        for k in range(samples):
            err = dequantize(quantize(flat, c, seed, step=step, bucket=k)).double() - flat.double()
            seg += torch.stack([e.square().sum() for e in torch.split(err, segments)])
        seg /= samples
        total = float(seg.sum())
        out[b] = Ratio(total / norm_sq if norm_sq > 0 else 0.0,
                       lemma31_bound(n, cfg.bucket_size, c.levels), tuple(float(x) for x in seg))
    return out
