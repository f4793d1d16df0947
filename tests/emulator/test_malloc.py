"""Worker processes keep freed memory (emulator._malloc): a big array, once freed, stays in
the process for the next one instead of going back to the kernel (which would fault fresh
pages in again for the next simulation)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from emulator.study import _Local

BIG = 8_400_000          # int64 entries: 67 MB, one array of a 1024-GPU schedule


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def kept_after_free() -> int:
    """Bytes still resident after a 67 MB array was written and freed."""
    before = _resident_bytes()
    a = np.empty(BIG, dtype=np.int64)
    a[:] = 1
    del a
    return _resident_bytes() - before


def _in_fresh_process(keep: bool) -> tuple[bool, int]:
    """(whether glibc took the settings, :func:`kept_after_free`) in a new interpreter."""
    code = ("from tests.emulator.test_malloc import kept_after_free as f\n"
            "from emulator._malloc import keep_freed_memory as k\n"
            f"print({keep} and k(), f())")
    took, kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split()
    return took == "True", int(kept)


def test_freed_memory_stays_only_when_kept():
    (_, plain), (took, kept) = _in_fresh_process(False), _in_fresh_process(True)
    assert took is True                      # glibc takes both settings
    assert plain < 8 << 20, plain            # handed back to the kernel at once
    assert kept > 50 << 20, kept             # kept for the next array


def test_a_studys_workers_keep_freed_memory():
    with _Local(1, None) as local:
        kept = local.executor().submit(kept_after_free).result(timeout=120)
    assert kept > 50 << 20, kept


def test_a_studys_workers_collect_as_their_parent_does():
    import gc

    before = gc.get_threshold()
    try:
        gc.set_threshold(12_345, 17, 99)
        with _Local(1, None) as local:
            seen = local.executor().submit(gc.get_threshold).result(timeout=120)
    finally:
        gc.set_threshold(*before)
    assert seen == (12_345, 17, 99)
