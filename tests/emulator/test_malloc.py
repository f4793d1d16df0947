"""Worker processes keep freed memory: big arrays allocated one after another reuse pages
instead of faulting fresh ones in (emulator._malloc)."""
from __future__ import annotations

import resource
import subprocess
import sys

import numpy as np

from emulator.study import _Local


def faults_of_big_arrays(count: int = 20) -> int:
    """Page faults of ``count`` 67 MB arrays allocated, written and freed in turn."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(count):
        a = np.empty(8_400_000, dtype=np.int64)
        a[:] = 1
        del a
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _in_fresh_process(keep: bool) -> tuple[bool, int]:
    """(whether glibc took the settings, the page faults) in a new interpreter."""
    code = ("from tests.emulator.test_malloc import faults_of_big_arrays as f\n"
            "from emulator._malloc import keep_freed_memory as k\n"
            f"print({keep} and k(), f())")
    took, faults = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  check=True).stdout.split()
    return took == "True", int(faults)


def test_kept_memory_spares_the_page_faults():
    (_, plain), (took, kept) = _in_fresh_process(False), _in_fresh_process(True)
    assert took is (sys.platform == "linux")        # glibc takes both settings
    # ~16,000 pages per array when each comes fresh from the kernel, far fewer when reused
    assert kept * 5 < plain, (kept, plain)


def test_a_studys_workers_keep_freed_memory():
    with _Local(1, None) as local:
        faults = local.executor().submit(faults_of_big_arrays).result(timeout=120)
    assert faults < 5000, faults
