"""Kernels interpreted for small work, compiled (and cached on disk) for big work."""
import os
import subprocess
import sys

import pytest

from emulator import ConfigError, _jit

SCRIPT = """
import emulator, topologies
G = topologies.switch(4)
r = emulator.simulate(G, emulator.build_schedule("alltoall", "direct", 4, 4000))
from emulator import _jit
print(_jit.compiled(), r.time_s)
"""


def _run(env):
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_small_work_stays_interpreted_and_never_imports_numba():
    env = dict(os.environ, QSGD_EMU_JIT="auto")
    code = SCRIPT + "import sys; print('numba' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    compiled, _, numba_loaded = proc.stdout.split()
    assert (compiled, numba_loaded) == ("False", "False")


@pytest.mark.slow
def test_compiled_kernels_are_cached_in_numba_cache_dir(tmp_path):
    # NUMBA_CACHE_DIR (what a read-only installation uses; numba falls back to a per-user
    # directory by itself when the package's __pycache__ is not writable) receives the
    # compiled kernels, and a second process loads them with the same result.
    env = dict(os.environ, QSGD_EMU_JIT="always", NUMBA_CACHE_DIR=str(tmp_path))
    first = _run(env)
    cached = [f for _, _, files in os.walk(tmp_path) for f in files]
    assert any(f.startswith("events.run") and f.endswith(".nbi") for f in cached), cached
    assert any(f.startswith("maxmin.solve") for f in cached)
    assert _run(env) == first and first[0] == "True"


def test_bad_mode(monkeypatch):
    monkeypatch.setenv("QSGD_EMU_JIT", "sometimes")
    with pytest.raises(ConfigError, match="QSGD_EMU_JIT='sometimes' must be one of"):
        _jit.use_compiled(1)


LEAN = """
from emulator import _jit, events, critical_path
_jit.compile_kernels()
print(events.run.targetoptions.get("_nrt", True), critical_path._times.targetoptions.get("_nrt", True))
"""


def test_event_loop_kernels_compile_without_reference_counting(tmp_path):
    # the loop's kernels allocate nothing and are compiled without numba's runtime; a kernel
    # that allocates (the contention-free pass's) keeps it, or it would not compile
    env = dict(os.environ, QSGD_EMU_JIT="always", NUMBA_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", LEAN], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]
    registered = {(m.rsplit(".", 1)[-1], a) for m, _, a in _jit._REGISTRY}
    assert ("events", False) in registered and ("critical_path", True) in registered
