"""Size sweeps of one collective, row for row as NVIDIA nccl-tests prints them.

nccl-tests (``all_reduce_perf -b 8 -e 4G -f 2``) times one collective at sizes
``min, min*f, min*f**2, ...`` up to ``max`` and prints, per size, the bytes, the element
count, the type, the reduction, the time and two bandwidths (NVIDIA/nccl-tests,
doc/PERFORMANCE.md and src/common.cu ``setupArgs``). :func:`size_sweep` predicts the same
table with :func:`emulator.simulate`, so a prediction can be held next to a real log:

- ``count = size // itemsize`` elements; ops that split the buffer over ranks (allgather,
  reduce-scatter, all-to-all) keep ``count // p`` elements per rank, print that per-rank
  ``count`` and the whole ``size = (count // p) * p * itemsize``, exactly as the
  ``*GetCollByteCount`` functions of nccl-tests round them;
- ``algbw = size / time`` and ``busbw = algbw * factor`` with the op's factor
  (:func:`emulator.busbw_factor`: 2(p-1)/p for allreduce, (p-1)/p for allgather,
  reduce-scatter and all-to-all, 1 for broadcast).

Units: bytes, seconds, bytes/s. Sizes that round to zero bytes (fewer elements than ranks)
are left out: nccl-tests prints them with the time of an empty launch, which the emulator
does not model.
"""
from __future__ import annotations

import math
import numbers

from .errors import ConfigError
from ._checks import is_int, is_number

__all__ = ["size_sweep", "sweep_sizes", "nccl_size", "dtype_info", "DTYPES", "REDOPS", "MAX_ROWS"]

#: dtype -> (bytes per element, the name nccl-tests prints; src/common.cu test_typenames)
DTYPES: dict[str, tuple[int, str]] = {
    "int8": (1, "int8"), "uint8": (1, "uint8"),
    "int32": (4, "int32"), "uint32": (4, "uint32"),
    "int64": (8, "int64"), "uint64": (8, "uint64"),
    "float16": (2, "half"), "bfloat16": (2, "bfloat16"),
    "float32": (4, "float"), "float64": (8, "double"),
    "float8_e4m3fn": (1, "f8e4m3"), "float8_e5m2": (1, "f8e5m2"),
}
# nccl-tests' own names ("float", "half", ...) are accepted as well.
_DTYPE_ALIASES = {nccl: name for name, (_, nccl) in DTYPES.items()}

#: op -> (redop column of nccl-tests, True when ``count`` is elements per rank)
REDOPS: dict[str, tuple[str, bool]] = {
    "allreduce": ("sum", False),
    "broadcast": ("none", False),
    "reduce_scatter": ("sum", True),
    "allgather": ("none", True),
    "alltoall": ("none", True),
}

#: Most sizes one sweep may have (each is a simulation); guards against factors near 1.
MAX_ROWS = 1000


def _int_field(name: str, value, minimum: int) -> int:
    if not is_int(value) or value < minimum:
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}")
    return int(value)


def dtype_info(dtype) -> tuple[int, str]:
    """``(bytes per element, nccl-tests type name)`` of a :data:`DTYPES` key or nccl-tests name."""
    name = _DTYPE_ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise ConfigError(f"dtype={dtype!r} is not known; known: {sorted(DTYPES)} "
                          f"(or nccl-tests names {sorted(_DTYPE_ALIASES)})") from None


def sweep_sizes(min_bytes: int, max_bytes: int, factor: float = 2) -> list[int]:
    """Sizes ``min_bytes * factor**i`` (bytes) up to ``max_bytes``, as nccl-tests' ``-b -e -f``.

    Parameters
    ----------
    min_bytes, max_bytes : int
        First and largest size in bytes; ``0 < min_bytes <= max_bytes``.
    factor : int or float
        Ratio between successive sizes, > 1. A fractional product is rounded down, and every
        size is at least one byte larger than the one before.

    Returns
    -------
    list of int

    Raises
    ------
    ConfigError
        Naming the field and its value; also when there would be more than
        :data:`MAX_ROWS` sizes.

    Examples
    --------
    >>> from emulator import sweep_sizes
    >>> sweep_sizes(1 << 20, 16 << 20, 2) == [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20]
    True
    >>> sweep_sizes(1000, 4000, 1.5)
    [1000, 1500, 2250, 3375]
    """
    lo = _int_field("min_bytes", min_bytes, 1)
    hi = _int_field("max_bytes", max_bytes, 1)
    if hi < lo:
        raise ConfigError(f"max_bytes={max_bytes!r} must be >= min_bytes={min_bytes!r}")
    if (not is_number(factor)
            or not math.isfinite(factor) or factor <= 1):
        raise ConfigError(f"factor={factor!r} must be a finite number > 1")
    out, size = [], lo
    while size <= hi:
        out.append(size)
        if len(out) > MAX_ROWS:
            raise ConfigError(f"factor={factor!r} gives more than {MAX_ROWS} sizes between "
                              f"min_bytes={lo} and max_bytes={hi}; use a larger factor")
        # Integer factors stay exact (int * int); nccl-tests' stepfactor is an integer too.
        grown = size * factor if isinstance(factor, numbers.Integral) else math.floor(size * factor)
        size = max(size + 1, int(grown))
    return out


def nccl_size(nbytes: int, op: str, p: int, itemsize: int) -> tuple[int, int]:
    """``(size, count)`` nccl-tests prints for a requested ``nbytes`` (bytes, elements).

    Whole elements only: ``count = nbytes // itemsize``; for ops that split the buffer over
    ``p`` ranks the count is per rank (``count // p``) and ``size`` the whole buffer.
    """
    try:
        _, per_rank = REDOPS[op]
    except KeyError:
        raise ConfigError(f"op={op!r} has no nccl-tests row convention; known: "
                          f"{sorted(REDOPS)}") from None
    count = nbytes // itemsize
    if per_rank:
        count //= p
        return count * p * itemsize, count
    return count * itemsize, count


def _resolve_ranks(G, ranks) -> tuple:
    import topologies

    from .collectives._schedule import check_ranks

    out = check_ranks(len(topologies.gpus(G)) if ranks is None else ranks)
    if len(out) < 2:
        raise ConfigError(f"ranks={ranks!r}: a collective needs at least 2 ranks to move bytes")
    return out


def size_sweep(G, op: str, algorithm: str, *, min_bytes: int, max_bytes: int, factor=2,
               ranks=None, chunks: int = 1, dtype: str = "float32", faults=(), protocol=None,
               channels=None, exact: bool = True, tolerance=None) -> list[dict]:
    """Simulate ``op`` by ``algorithm`` at every size of a nccl-tests sweep.

    Parameters
    ----------
    G : networkx.Graph
        The topology.
    op, algorithm : str
        A key of :data:`emulator.ALGORITHMS`, e.g. ``("allreduce", "ring")``.
    min_bytes, max_bytes : int
        First and largest requested size in bytes (nccl-tests ``-b``/``-e``).
    factor : int or float
        Ratio between sizes (nccl-tests ``-f``), > 1.
    ranks : int or sequence of int, optional
        Participating ranks (default every GPU of ``G``); at least 2.
    chunks : int
        Pipelining chunks per message (see :func:`emulator.build_schedule`).
    dtype : str
        Element type: a key of :data:`DTYPES` or a nccl-tests name (``"float"``).
    faults : sequence of Fault
        What-ifs applied to every size (:func:`emulator.simulate`).
    protocol, channels : optional
        NCCL algorithms only (see :func:`emulator.build_schedule`).
    exact, tolerance
        The engine's mode (:func:`emulator.simulate`): exact by default.

    Returns
    -------
    list of dict
        One row per size, in increasing order, with ``op``, ``algorithm``, ``nranks``,
        ``size`` (bytes), ``count`` (elements), ``type``, ``redop``, ``time_s``, ``time_us``,
        ``algbw`` and ``busbw`` (bytes/s), ``flows``, ``events`` and ``peak_utilization``;
        NCCL algorithms add ``nccl``: the algorithm, protocol and channels chosen.

    Raises
    ------
    ConfigError
        A field is not valid; the message names it and its value.

    Examples
    --------
    On a ring of 10 GB/s links the busbw of a large allreduce approaches the link bandwidth:

    >>> import emulator, topologies
    >>> G = topologies.from_spec("ring:8,bw=10GB/s,lat=1us")
    >>> rows = emulator.size_sweep(G, "allreduce", "ring", min_bytes=1 << 20, max_bytes=1 << 26,
    ...                            factor=8)
    >>> [r["size"] for r in rows]
    [1048576, 8388608, 67108864]
    >>> [round(r["busbw"] / 1e9, 2) for r in rows]
    [9.29, 9.91, 9.99]
    """
    from .collectives import ALGORITHMS, busbw_factor, build_schedule
    from .engine import simulate

    if (op, algorithm) not in ALGORITHMS:
        known = sorted(f"{o}/{a}" for o, a in ALGORITHMS)
        raise ConfigError(f"op={op!r}, algorithm={algorithm!r} is not a known collective; "
                          f"known: {known}")
    if op not in REDOPS:
        raise ConfigError(f"op={op!r} has no nccl-tests row convention; known: {sorted(REDOPS)}")
    itemsize, type_name = dtype_info(dtype)
    chunks = _int_field("chunks", chunks, 1)
    sizes = sweep_sizes(min_bytes, max_bytes, factor)
    order = _resolve_ranks(G, ranks)
    p = len(order)
    redop = REDOPS[op][0]
    bus = busbw_factor(op, p)
    rows = []
    for requested in sizes:
        size, count = nccl_size(requested, op, p, itemsize)
        if size == 0:
            continue
        sched = build_schedule(op, algorithm, order, size, chunks=chunks, graph=G,
                               protocol=protocol, channels=channels)
        res = simulate(G, sched, faults=faults, exact=exact, tolerance=tolerance)
        t = res.time_s
        algbw = size / t if t > 0 else math.inf
        rows.append({"op": op, "algorithm": algorithm, "nranks": p, "size": size,
                     "count": count, "type": type_name, "redop": redop, "time_s": t,
                     "time_us": t * 1e6, "algbw": algbw, "busbw": algbw * bus,
                     "flows": res.flows, "events": res.events,
                     "peak_utilization": res.peak_utilization})
        if "nccl" in sched.detail:
            d = sched.detail["nccl"]
            rows[-1]["nccl"] = {k: d[k] for k in ("algorithm", "protocol", "channels")}
    if not rows:
        raise ConfigError(f"max_bytes={max_bytes!r} is too small: no size of the sweep holds one "
                          f"{type_name} element ({itemsize} B) per rank on {p} ranks")
    return rows
