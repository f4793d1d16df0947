"""Guards shared by the emulator's modules: typed checks, JSON field readers, atomic saves.

A JSON reader names the field's path (``collectives[3].time_s``) and the value in its error,
so a malformed file is rejected with a message, never read into garbage.
"""
from __future__ import annotations

import json
import math
import numbers
import os

from .errors import TraceError


def is_int(value) -> bool:
    """An integer that is not a bool (``True`` is an ``int`` to Python, never to a user)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number that is not a bool (finite or not: callers check what they need)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# -- JSON fields: each error names the field's path -------------------------------------------
def required(d: dict, key: str, path: str):
    """``d[key]``; a missing key is a :class:`TraceError` naming ``path + key``."""
    if key not in d:
        raise TraceError(f"{path}{key}: missing")
    return d[key]


def number(value, path: str, *, positive: bool = False, nonneg: bool = False) -> float:
    """A finite number (> 0 with ``positive``, >= 0 with ``nonneg``) as a float."""
    if not is_number(value) or not math.isfinite(value):
        raise TraceError(f"{path}: {value!r} is not a finite number")
    if positive and not value > 0:
        raise TraceError(f"{path}: {value!r} must be > 0")
    if nonneg and value < 0:
        raise TraceError(f"{path}: {value!r} must be >= 0")
    return float(value)


def integer(value, path: str, *, minimum: int | None = None) -> int:
    """An integer (>= ``minimum`` when given)."""
    if not is_int(value):
        raise TraceError(f"{path}: {value!r} is not an integer")
    if minimum is not None and value < minimum:
        raise TraceError(f"{path}: {value!r} must be >= {minimum}")
    return int(value)


def text(value, path: str, choices=None) -> str:
    """A non-empty string (one of ``choices`` when given)."""
    if not isinstance(value, str) or not value:
        raise TraceError(f"{path}: {value!r} is not a non-empty string")
    if choices is not None and value not in choices:
        raise TraceError(f"{path}: {value!r} not one of {', '.join(choices)}")
    return value


def seconds_list(value, path: str) -> list[float]:
    """A list of non-negative seconds."""
    if not isinstance(value, list):
        raise TraceError(f"{path}: {value!r} is not a list of seconds")
    return [number(v, f"{path}[{i}]", nonneg=True) for i, v in enumerate(value)]


# -- files -------------------------------------------------------------------------------------
def save_json(doc, path) -> None:
    """Write ``doc`` as JSON through a temporary file renamed into place: a reader never sees
    half a file, and a failed write leaves nothing behind. Missing folders are made."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
