"""Keep freed memory in the process for the next simulation, instead of handing it back.

A 1024-GPU schedule's arrays are tens of MB each, and glibc's malloc serves blocks that large
with fresh ``mmap`` pages, returned to the kernel on ``free``; every simulation then pays the
kernel's page faults (and zeroing) for each array again. A worker that runs dozens of such
simulations in a row gains by keeping them: with the mmap threshold above the largest array
and trimming off, freed blocks stay in malloc's heap and the next simulation's arrays reuse
pages already mapped. Measured (benchmarks/RESULTS.md): three 1024-GPU all-gathers in one
process, 44.9 -> 40.4 s wall, 6.5 -> 2.4 s of system time. The cost is that a process's
memory stays at its peak until it exits, which suits worker processes (a study's, a
prefetch's), not a long-lived server.

:func:`prepare_worker` is a worker's start: this, and the cyclic collector's thresholds of
the process that started it (``qsgd-emu`` raises them: its big simulations keep millions of
objects alive, which the collector otherwise traverses again and again).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["keep_freed_memory", "prepare_worker"]

#: mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Blocks up to this many bytes come from the heap (mallopt takes an int).
MMAP_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to serve blocks up to :data:`MMAP_THRESHOLD` bytes from its heap
    and never trim it; returns whether it took both settings (False on another C library,
    where nothing changes).

    Examples
    --------
    >>> isinstance(keep_freed_memory(), bool)
    True
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def prepare_worker(gc_thresholds: tuple) -> None:
    """A worker process's start (a study's, a prefetch's): :func:`keep_freed_memory`, and the
    collector's thresholds ``gc_thresholds`` (its parent's, :func:`gc.get_threshold`).

    Examples
    --------
    >>> before = gc.get_threshold()
    >>> prepare_worker(before); gc.get_threshold() == before
    True
    """
    keep_freed_memory()
    gc.set_threshold(*gc_thresholds)
