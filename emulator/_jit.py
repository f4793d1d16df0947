"""Kernels that run as plain Python on small inputs and numba-compiled on big ones.

Importing numba and loading even cached machine code costs about 0.8 s of process time on
a 2-core machine (numba's import, its target context, and the scipy BLAS probe its array
maths runs), more than a small collective takes in interpreted Python. So a kernel is
written once, as numba-compatible Python (numpy arrays, scalars, loops), and registered
with :func:`kernel`; it runs interpreted until some caller with enough work calls
:func:`compile_kernels`, which swaps every registered kernel in its module for a
``numba.njit(cache=True)`` dispatcher of the same function. Kernels call each other
through module globals, so after the swap the compiled ones call compiled ones.

The compiled code is cached on disk by numba, in a per-user folder named by a hash of the
kernels' sources (:func:`cache_dir`): writable however the package is installed, and never
stale when one kernel's callee in another file changes.

A kernel that creates no arrays is registered with ``allocates=False`` and compiled without
numba's reference counting (its runtime, NRT): with it, every call of one kernel from
another and every read of an array field of a NamedTuple argument costs an atomic
increment and decrement of that array's count, and the event loop's kernels pass tuples of
up to 27 arrays in their inner loops (half the event loop's time, measured with ``perf`` on
a 512-GPU all-gather). Such a kernel may only call kernels registered the same way.

``QSGD_EMU_JIT`` overrides the choice: ``always`` compiles at the first call of any
kernel user, ``never`` keeps the interpreter (for debugging), ``auto`` (default) decides by
the size of the work.
"""
from __future__ import annotations

import hashlib
import os
import sys

from .errors import ConfigError

__all__ = ["kernel", "compile_kernels", "use_compiled", "compiled", "cache_dir"]

#: Work (loop iterations, roughly) above which compiling pays: interpreted kernels cost
#: ~1-3 us per iteration, loading the compiled ones ~0.8 s once per process.
THRESHOLD = 50_000

_REGISTRY: list[tuple[str, str, bool]] = []   # (module, function name, allocates) of every kernel
_state = {"compiled": False}
_OPTIONS = dict(cache=True, nogil=True)
#: numba's option for compiling without its runtime's reference counting.
_NO_REFCOUNT = dict(_nrt=False)


def _mode() -> str:
    mode = os.environ.get("QSGD_EMU_JIT", "auto")
    if mode not in ("auto", "always", "never"):
        raise ConfigError(f"QSGD_EMU_JIT={mode!r} must be one of 'auto', 'always', 'never'")
    return mode


def kernel(fn=None, *, allocates: bool = True):
    """Register ``fn`` (a module-level function) as a kernel; returns it unchanged (every
    kernel module is imported with :mod:`emulator`, before anything compiles).

    Parameters
    ----------
    fn : callable
        The kernel (``@kernel``), or None to take options (``@kernel(allocates=False)``).
    allocates : bool
        False: ``fn`` creates no arrays (and calls only kernels that create none either); it
        is compiled without reference counting (module docstring).

    Examples
    --------
    In a module of kernels (a function defined at a prompt has no module to be swapped in)::

        @kernel(allocates=False)
        def _total(x):
            s = 0.0
            for v in x:
                s += v
            return s

    >>> kernel.__name__
    'kernel'
    """
    if fn is None:
        return lambda f: kernel(f, allocates=allocates)
    _REGISTRY.append((fn.__module__, fn.__name__, bool(allocates)))
    if _state["compiled"]:
        raise RuntimeError(f"kernel {fn.__module__}.{fn.__name__} registered after the kernels "
                           f"were compiled: import it with the others")
    return fn


def compiled() -> bool:
    """Whether the kernels are compiled in this process.

    Examples
    --------
    >>> isinstance(compiled(), bool)
    True
    """
    return _state["compiled"]


def cache_dir() -> str:
    """Where the compiled kernels are cached: a folder per version of the kernels' sources.

    numba keys its cache of a function by that function's file alone, so a kernel whose
    callee in another file changed would load stale machine code. The folder's name is a
    hash of every kernel module's source, so any change compiles afresh. The base is
    ``NUMBA_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/qsgd-emu/numba`` (``~/.cache``):
    writable however the package is installed.

    Examples
    --------
    >>> os.path.basename(os.path.dirname(cache_dir()))
    'numba'
    """
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "qsgd-emu", "numba")
    digest = hashlib.sha256()
    for module in sorted({m for m, _, _ in _REGISTRY}):
        with open(sys.modules[module].__file__, "rb") as f:
            digest.update(f.read())
    digest.update(repr((sorted(_OPTIONS.items()), _NO_REFCOUNT)).encode())
    return os.path.join(base, digest.hexdigest()[:16])


def compile_kernels() -> None:
    """Swap every registered kernel for its numba dispatcher (once per process; never with
    ``QSGD_EMU_JIT=never``), cached in :func:`cache_dir`."""
    if _state["compiled"] or _mode() == "never":
        return
    import numba

    # The cache folder is bound when a dispatcher is made: set it for ours only.
    before = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = cache_dir()
    try:
        swapped = {}
        from numba.core.cpu import CPUTargetOptions

        # a private option of numba's CPU target: without it, every kernel counts references
        lean = _NO_REFCOUNT if all(hasattr(CPUTargetOptions, k) for k in _NO_REFCOUNT) else {}
        for module, name, allocates in _REGISTRY:
            fn = sys.modules[module].__dict__[name]
            swapped[fn] = numba.njit(**_OPTIONS, **({} if allocates else lean))(fn)
    finally:
        numba.config.CACHE_DIR = before
    # Kernels imported by name into another kernel module (``from .maxmin import change``)
    # are swapped there too.
    for module in {m for m, _, _ in _REGISTRY}:
        namespace = sys.modules[module].__dict__
        for name, value in list(namespace.items()):
            if callable(value) and value in swapped:
                namespace[name] = swapped[value]
    _state["compiled"] = True


def use_compiled(work: int) -> bool:
    """Compile the kernels if ``work`` (iterations) makes it pay; True when they are compiled.

    Once compiled, kernels stay compiled for the rest of the process, whatever the work.

    Examples
    --------
    >>> use_compiled(0) == compiled()      # no work: no compiling
    True
    """
    mode = _mode()
    if mode == "always" or (mode == "auto" and work >= THRESHOLD):
        compile_kernels()
    return _state["compiled"]
