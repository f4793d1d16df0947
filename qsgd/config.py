"""The QSGD configuration: levels, bucket size, norm and codec (Alistarh et al. 2017, Section 3).

A coordinate is quantized to a signed level in ``[-s, s]`` of its bucket's scale; a level needs
``b = ceil(log2(2 s + 1))`` bits. :meth:`QSGDConfig.from_bits` inverts that with
``s = 2**(b-1) - 1`` (b = 2 gives the ternary ``s = 1``; b = 4 gives ``s = 7``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from qsgd.errors import ConfigError
from ._checks import is_int

#: norms a bucket can be scaled by -> wire code. ``"l2"`` is the paper's theory (Lemma 3.1);
#: ``"max"`` is the variant of its experiments (later called QSGDinf), no sparsity guarantee.
NORMS: dict[str, int] = {"max": 0, "l2": 1}

#: codecs -> wire code. ``"packed"``: b bits per coordinate; ``"elias"``: the paper's
#: Elias-omega coding of the gaps between nonzeros (Section 3.2).
CODECS: dict[str, int] = {"packed": 0, "elias": 1}

#: the largest number of levels: a level with its sign must fit in 16 bits.
MAX_LEVELS = 32767
#: the largest bucket: the wire format stores the bucket size as a 32-bit unsigned integer.
MAX_BUCKET_SIZE = 2**31 - 1


def _check_int(name: str, value, low: int, high: int) -> None:
    # bool is an int subclass; True levels is a bug, not 1.
    if not is_int(value):
        raise ConfigError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class QSGDConfig:
    """How a gradient is quantized and encoded.

    Parameters
    ----------
    levels : int
        ``s``, the number of positive quantization levels (1 <= s <= 32767). A coordinate
        becomes ``sign * (l / s) * scale`` with ``l`` in ``0..s``.
    bucket_size : int
        ``d``, the number of consecutive coordinates (of the flattened tensor) that share one
        fp32 scale (4 bytes of payload per bucket).
    norm : {"max", "l2"}
        The bucket's scale: its largest absolute value, or its Euclidean norm.
    codec : {"packed", "elias"}
        The wire coding of the levels.

    Examples
    --------
    >>> import qsgd
    >>> cfg = qsgd.QSGDConfig.from_bits(4, bucket_size=512)
    >>> cfg.levels, cfg.bits, cfg.norm, cfg.codec
    (7, 4, 'max', 'packed')
    >>> qsgd.QSGDConfig(levels=0)
    Traceback (most recent call last):
    ...
    qsgd.errors.ConfigError: levels must be in [1, 32767], got 0
    """

    levels: int = 7
    bucket_size: int = 512
    norm: str = "max"
    codec: str = "packed"

    def __post_init__(self) -> None:
        _check_int("levels", self.levels, 1, MAX_LEVELS)
        _check_int("bucket_size", self.bucket_size, 1, MAX_BUCKET_SIZE)
        if self.norm not in NORMS:
            raise ConfigError(f"norm must be one of {sorted(NORMS)}, got {self.norm!r}")
        if self.codec not in CODECS:
            raise ConfigError(f"codec must be one of {sorted(CODECS)}, got {self.codec!r}")

    @property
    def bits(self) -> int:
        """Bits per packed coordinate: ``ceil(log2(2 s + 1))`` (2..16)."""
        return math.ceil(math.log2(2 * self.levels + 1))

    @classmethod
    def from_bits(cls, bits: int, **kwargs) -> "QSGDConfig":
        """The configuration with ``s = 2**(bits-1) - 1`` levels, for ``bits`` in 2..16.

        Other fields (``bucket_size``, ``norm``, ``codec``) are passed through ``kwargs``.
        """
        _check_int("bits", bits, 2, 16)
        if "levels" in kwargs:
            raise ConfigError(f"from_bits sets levels from bits; got levels={kwargs['levels']!r} too")
        return cls(levels=2 ** (bits - 1) - 1, **kwargs)

    def to_dict(self) -> dict:
        """The fields plus ``bits``, as written in a PayloadTrace's ``config``."""
        return {"levels": self.levels, "bucket_size": self.bucket_size, "norm": self.norm,
                "codec": self.codec, "bits": self.bits}
