"""Kernels that run as plain Python on small inputs and numba-compiled on big ones.

Importing numba and loading even cached machine code costs about 0.8 s of process time on
a 2-core machine (numba's import, its target context, and the scipy BLAS probe its array
maths runs), more than a small collective takes in interpreted Python. So a kernel is
written once, as numba-compatible Python (numpy arrays, scalars, loops), and registered
with :func:`kernel`; it runs interpreted until some caller with enough work calls
:func:`compile_kernels`, which swaps every registered kernel in its module for a
``numba.njit(cache=True)`` dispatcher of the same function. Kernels call each other
through module globals, so after the swap the compiled ones call compiled ones.

The compiled code is cached on disk by numba: next to the source (``__pycache__``) when
that is writable, else in ``NUMBA_CACHE_DIR`` or numba's per-user cache directory
(numba's ``_UserWideCacheLocator``), so a read-only installation still caches.

``QSGD_EMU_JIT`` overrides the choice: ``always`` compiles at the first call of any
kernel user, ``never`` keeps the interpreter (for debugging), ``auto`` (default) decides by
the size of the work.
"""
from __future__ import annotations

import os
import sys

from .errors import ConfigError

__all__ = ["kernel", "compile_kernels", "use_compiled", "compiled"]

#: Work (loop iterations, roughly) above which compiling pays: interpreted kernels cost
#: ~1-3 us per iteration, loading the compiled ones ~0.8 s once per process.
THRESHOLD = 50_000

_REGISTRY: list[tuple[str, str]] = []   # (module, function name) of every kernel
_state = {"compiled": False}
_OPTIONS = dict(cache=True, nogil=True)


def _mode() -> str:
    mode = os.environ.get("QSGD_EMU_JIT", "auto")
    if mode not in ("auto", "always", "never"):
        raise ConfigError(f"QSGD_EMU_JIT={mode!r} must be one of 'auto', 'always', 'never'")
    return mode


def kernel(fn):
    """Register ``fn`` (a module-level function) as a kernel; returns it unchanged, or its
    compiled dispatcher when kernels were already compiled in this process.

    Examples
    --------
    In a module of kernels (a function defined at a prompt has no module to be swapped in)::

        @kernel
        def _total(x):
            s = 0.0
            for v in x:
                s += v
            return s

    >>> kernel.__name__
    'kernel'
    """
    _REGISTRY.append((fn.__module__, fn.__name__))
    if _state["compiled"]:
        import numba

        return numba.njit(**_OPTIONS)(fn)
    return fn


def compiled() -> bool:
    """Whether the kernels are compiled in this process.

    Examples
    --------
    >>> isinstance(compiled(), bool)
    True
    """
    return _state["compiled"]


def compile_kernels() -> None:
    """Swap every registered kernel for its numba dispatcher (once per process; never with
    ``QSGD_EMU_JIT=never``)."""
    if _state["compiled"] or _mode() == "never":
        return
    import numba

    swapped = {}
    for module, name in _REGISTRY:
        fn = sys.modules[module].__dict__[name]
        swapped[fn] = numba.njit(**_OPTIONS)(fn)
    # Kernels imported by name into another kernel module (``from .maxmin import change``)
    # are swapped there too.
    for module in {m for m, _ in _REGISTRY}:
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
