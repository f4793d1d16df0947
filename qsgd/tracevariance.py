"""The per-bucket variance record of a PayloadTrace (version 2): measured ratios per bit width.

``buckets[i].variance`` (optional; written by :func:`qsgd.measure`, see ``docs/formats.md``)::

    {"bits": [2, 3, 4], "samples": 2, "norm_sq": 1.3e-3, "raw_norm_sq": 2.0e-6,
     "ratio": [3.1, 0.61, 0.12], "bound": [22.6, 5.6, 3.2],
     "params": [{"name": "fc.weight", "norm_sq": 1.1e-3, "ratio": [3.0, 0.6, 0.1]}, ...]}

``norm_sq`` is the mean over iterations of the squared l2 norm of the bucket's compressed
elements, ``raw_norm_sq`` the same of its uncompressed ones (squared gradient units);
``ratio[j]`` the measured ``E||Q(v)-v||^2 / ||v||^2`` at ``bits[j]`` (mean over iterations and
samples, :func:`qsgd.variance_ratios`), ``bound[j]`` its Lemma 3.1 bound; ``params`` splits
both over the compressed parameters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from qsgd.errors import TraceError
from ._checks import is_int, is_number


def _nonneg(v, path: str) -> float:
    if not is_number(v) or not math.isfinite(v) or v < 0:
        raise TraceError(f"{path} must be a finite number >= 0, got {v!r}")
    return float(v)


def _floats(d: Mapping, key: str, path: str, n: int) -> tuple[float, ...]:
    v = d.get(key)
    if not isinstance(v, list) or len(v) != n:
        raise TraceError(f"{path}.{key} must be a list of {n} numbers (one per bits), got {v!r}")
    return tuple(_nonneg(x, f"{path}.{key}[{j}]") for j, x in enumerate(v))


@dataclass(frozen=True)
class ParamVariance:
    """One compressed parameter: its squared norm and its share of the error per width."""

    name: str
    norm_sq: float
    ratio: tuple[float, ...]

    def to_dict(self) -> dict:
        return {"name": self.name, "norm_sq": self.norm_sq, "ratio": list(self.ratio)}


@dataclass(frozen=True)
class BucketVariance:
    """Measured quantization variance of one bucket (see the module docstring)."""

    bits: tuple[int, ...]
    samples: int
    norm_sq: float
    raw_norm_sq: float
    ratio: tuple[float, ...]
    bound: tuple[float, ...]
    params: tuple[ParamVariance, ...] = ()

    def ratio_at(self, bits: int) -> float:
        """The measured ratio at ``bits``; :class:`TraceError` when it was not measured."""
        if bits not in self.bits:
            raise TraceError(f"bits={bits!r} was not measured; the trace has bits {list(self.bits)}")
        return self.ratio[self.bits.index(bits)]

    def error_sq(self, bits: int) -> float:
        """``E||Q(v)-v||^2`` of the bucket at ``bits`` (squared gradient units)."""
        return self.ratio_at(bits) * self.norm_sq

    def to_dict(self) -> dict:
        return {"bits": list(self.bits), "samples": self.samples, "norm_sq": self.norm_sq,
                "raw_norm_sq": self.raw_norm_sq, "ratio": list(self.ratio), "bound": list(self.bound),
                "params": [p.to_dict() for p in self.params]}

    @classmethod
    def from_dict(cls, d, path: str) -> "BucketVariance":
        if not isinstance(d, Mapping):
            raise TraceError(f"{path} must be an object, got {d!r}")
        bits = d.get("bits")
        if not isinstance(bits, list) or not bits or any(not is_int(b) or not 2 <= b <= 16 for b in bits) \
                or len(set(bits)) != len(bits):
            raise TraceError(f"{path}.bits must be a non-empty list of distinct ints in [2, 16], got {bits!r}")
        samples = d.get("samples")
        if not is_int(samples) or samples < 1:
            raise TraceError(f"{path}.samples must be an int >= 1, got {samples!r}")
        n = len(bits)
        params = d.get("params", [])
        if not isinstance(params, list):
            raise TraceError(f"{path}.params must be a list, got {params!r}")
        plist = []
        for j, p in enumerate(params):
            pp = f"{path}.params[{j}]"
            if not isinstance(p, Mapping) or not isinstance(p.get("name"), str) or not p["name"]:
                raise TraceError(f"{pp}.name must be a non-empty string, got {p!r}")
            plist.append(ParamVariance(p["name"], _nonneg(p.get("norm_sq"), f"{pp}.norm_sq"),
                                       _floats(p, "ratio", pp, n)))
        return cls(tuple(bits), samples, _nonneg(d.get("norm_sq"), f"{path}.norm_sq"),
                   _nonneg(d.get("raw_norm_sq"), f"{path}.raw_norm_sq"), _floats(d, "ratio", path, n),
                   _floats(d, "bound", path, n), tuple(plist))
