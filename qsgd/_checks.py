"""Type guards shared by qsgd's modules (``True`` is an ``int`` to Python, never to a user)."""
from __future__ import annotations

import numbers


def is_int(value) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number that is not a bool (finite or not: callers check what they need)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
