"""Parse human unit strings ("256MB", "100Gbit", "2us") into SI numbers at the edges.

Inside the package everything is bytes, bytes/s and seconds. Prefixes follow the usual
conventions: k, M, G, T, P are decimal (1e3 ...), Ki, Mi, Gi, Ti, Pi are binary (2**10 ...).
A size with a bare prefix and no ``B`` (``4G``, ``64M``, ``1K``) follows nccl-tests, whose
``-b``/``-e`` options read K, M and G as 1024, 1024**2 and 1024**3: ``4G`` is 4 GiB while
``4GB`` is 4e9 bytes.
For bandwidths a capital ``B`` means bytes and ``b``/``bit`` means bits (``100Gbit`` =
``100Gb/s`` = ``100Gbps`` = 12.5e9 bytes/s), as on NIC datasheets.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal

from .errors import SpecError

_NUMBER = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$")

# Decimal arithmetic: "5us" gives exactly the float nearest to 5e-6, as the literal would.
_D = Decimal
_DECIMAL = {"": _D(1), "k": _D("1e3"), "K": _D("1e3"), "M": _D("1e6"), "G": _D("1e9"),
            "T": _D("1e12"), "P": _D("1e15")}
_BINARY = {"Ki": _D(2**10), "Mi": _D(2**20), "Gi": _D(2**30), "Ti": _D(2**40), "Pi": _D(2**50)}
_PREFIXES = {**_DECIMAL, **_BINARY, "KI": _D(2**10), "ki": _D(2**10)}

#: nccl-tests' size suffixes (src/common.cu, parsesize): binary, and written without a B.
_NCCL_TESTS = {"K": _D(2**10), "k": _D(2**10), "M": _D(2**20), "G": _D(2**30), "T": _D(2**40)}

_BYTES_UNIT = re.compile(r"^(|k|K|M|G|T|P|Ki|KI|ki|Mi|Gi|Ti|Pi)(B|bytes?)?$")
_BW_UNIT = re.compile(r"^(|k|K|M|G|T|P|Ki|Mi|Gi|Ti|Pi)(B|bit|b)?(/s|ps)?$")
_TIME_UNITS = {"": _D(1), "s": _D(1), "sec": _D(1), "ms": _D("1e-3"), "us": _D("1e-6"),
               "\u00b5s": _D("1e-6"), "\u03bcs": _D("1e-6"), "ns": _D("1e-9"),
               "ps": _D("1e-12"), "min": _D(60)}


def _split(text, what: str):
    if isinstance(text, bool):
        raise SpecError(f"{what} {text!r} not understood: expected a number or a string such as "
                        f"{_EXAMPLE[what]}")
    if isinstance(text, (int, float)):
        if not math.isfinite(text):
            raise SpecError(f"{what} {text!r} is not finite")
        return Decimal(text), None
    if not isinstance(text, str):
        raise SpecError(f"{what} {text!r} not understood: expected a number or a string such as "
                        f"{_EXAMPLE[what]}")
    m = _NUMBER.match(text)
    if not m:
        raise SpecError(f"{what} {text!r} not understood: no leading number (e.g. {_EXAMPLE[what]})")
    return Decimal(m.group(1)), m.group(2)


_EXAMPLE = {"size": "'256MB' or '4KiB'", "bandwidth": "'100Gbit' or '25GB/s'",
            "time": "'2us' or '1.5ms'"}


def _finite(value: Decimal, text, what: str) -> float:
    if value < 0:
        raise SpecError(f"{what} {text!r} is negative")
    out = float(value)
    if not math.isfinite(out):
        raise SpecError(f"{what} {text!r} is not finite")
    return out


def parse_bytes(text) -> int:
    """Parse a size such as ``"256MB"``, ``"4KiB"``, ``"1e6"`` or ``1024`` into bytes.

    Parameters
    ----------
    text : str or int or float
        A number of bytes, optionally with a decimal (kB, MB, GB, TB) or binary (KiB, MiB,
        GiB, TiB) prefix and a ``B``; a bare prefix (``4G``) is binary, as nccl-tests reads it.

    Returns
    -------
    int
        The size in bytes (must be a whole number of bytes, >= 0).

    Raises
    ------
    SpecError
        When the number or the unit is not understood, or the size is negative or fractional.
    """
    value, unit = _split(text, "size")
    scale = _D(1)
    if unit:
        m = _BYTES_UNIT.match(unit)
        if not m:
            raise SpecError(f"size {text!r} not understood: unit {unit!r} "
                            f"(expected B, kB, MB, GB, TB or KiB, MiB, GiB, TiB; or nccl-tests' "
                            f"K, M, G = KiB, MiB, GiB)")
        prefix = m.group(1)
        if m.group(2) is None and prefix in _NCCL_TESTS:
            scale = _NCCL_TESTS[prefix]
        else:
            scale = _PREFIXES[prefix]
    exact = value * scale
    _finite(exact, text, "size")
    if exact != exact.to_integral_value():
        raise SpecError(f"size {text!r} is not a whole number of bytes ({float(exact)!r})")
    return int(exact)


def parse_bandwidth(text) -> float:
    """Parse a bandwidth such as ``"100Gbit"``, ``"25GB/s"``, ``"10Gbps"`` into bytes/s.

    A bare number is bytes/s. ``B`` means bytes, ``b`` or ``bit`` means bits; ``/s`` or
    ``ps`` may follow. ``"100Gbit"`` gives 1.25e10.

    Raises
    ------
    SpecError
        When the number or unit is not understood, or the bandwidth is not positive and finite.
    """
    value, unit = _split(text, "bandwidth")
    scale = _D(1)
    if unit:
        m = _BW_UNIT.match(unit)
        if not m or (m.group(2) is None and m.group(1) != ""):
            raise SpecError(f"bandwidth {text!r} not understood: unit {unit!r} "
                            f"(expected e.g. Gbit, Gb/s, Gbps, GB/s, MiB/s)")
        scale = _PREFIXES[m.group(1)] / (8 if m.group(2) in ("b", "bit") else 1)
    value = _finite(value * scale, text, "bandwidth")
    if value == 0:
        raise SpecError(f"bandwidth {text!r} must be positive")
    return value


def parse_time(text) -> float:
    """Parse a duration such as ``"2us"``, ``"1.5ms"``, ``"5ns"`` or ``1e-6`` into seconds.

    Raises
    ------
    SpecError
        When the number or unit is not understood, or the time is negative or not finite.
    """
    value, unit = _split(text, "time")
    scale = _D(1)
    if unit:
        if unit not in _TIME_UNITS:
            raise SpecError(f"time {text!r} not understood: unit {unit!r} "
                            f"(expected s, ms, us, ns or ps)")
        scale = _TIME_UNITS[unit]
    return _finite(value * scale, text, "time")
