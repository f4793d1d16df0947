"""Transfers and schedules: the data every collective algorithm produces (no SimPy here).

A transfer goes from its source GPU to its destination GPU along the topology's
shortest-latency route, unless it names a :class:`Route`: waypoints to pass through (a
channel's NIC, say, as NCCL's rail-aligned rings do) and an ECMP flow label.

A schedule can hold millions of transfers (a 1024-rank ring allreduce has 2 093 056), so it
keeps them as numpy arrays (struct of arrays) and builds :class:`Transfer` objects only when
someone asks for :attr:`Schedule.transfers`. Dependencies are stored in CSR form
(``dep_ptr``, ``dep_idx``) over transfer *indices*; a transfer may only depend on transfers
listed before it, which makes every schedule acyclic by construction and gives the engine a
topological order for free.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ConfigError, ScheduleError
from .._checks import is_int, is_number


@dataclass(frozen=True)
class Route:
    """How a transfer crosses the network: through ``via`` nodes, hashed by ``flow`` on ECMP.

    The path is src -> via[0] -> ... -> via[-1] -> dst, each leg the router's shortest-latency
    route with ``flow`` as its ECMP label (:meth:`topologies.Router.path`). ``Route()`` is the
    default: the shortest route with flow label 0.

    Parameters
    ----------
    via : tuple of str
        Node ids of the topology to pass through, in order.
    flow : int
        ECMP flow label (>= 0): flows with different labels may take different equal-cost paths.

    Examples
    --------
    >>> Route(via=("n0.nic3", "n1.nic3"), flow=3)
    Route(via=('n0.nic3', 'n1.nic3'), flow=3)
    """

    via: tuple = ()
    flow: int = 0

    def __post_init__(self):
        via, f = self.via, self.flow
        if type(via) is tuple and type(f) is int and f >= 0 and all(
                type(node) is str and node for node in via):
            return              # already as kept (builders make 143,000 on 8,192 GPUs)
        via = tuple(self.via) if not isinstance(self.via, str) else (self.via,)
        for node in via:
            if not isinstance(node, str) or not node:
                raise ScheduleError(f"Route: via node {node!r} must be a non-empty node id string")
        object.__setattr__(self, "via", via)
        f = self.flow
        if not is_int(f) or f < 0:
            raise ScheduleError(f"Route: flow={f!r} must be an integer >= 0")
        object.__setattr__(self, "flow", int(f))


DEFAULT_ROUTE = Route()


@dataclass(frozen=True)
class Transfer:
    """One message of a collective.

    Parameters
    ----------
    id : int
        Unique id within its schedule.
    src, dst : int
        Sending and receiving rank. ``src == dst`` is a local step (a reduction, a decode):
        no network, it only takes ``compute_s``; it must then carry 0 bytes.
    nbytes : int
        Bytes sent (>= 0; a 0-byte message still pays the path latency).
    deps : tuple of int
        Ids of transfers that must have finished (arrived) before this one starts.
    tag : str
        Phase label ("reduce_scatter", "allgather", ...), used by results and figures.
    compute_s : float
        Seconds of local work at ``src`` after the deps and before sending (reduction,
        encode, decode), >= 0.
    route : int
        Index into the schedule's ``routes`` (0: the default shortest route).
    after : int, optional
        Id of the transfer whose last byte must have left its source before this one's first
        byte does: the previous message of the same connection, whose bytes go first on the
        wire (a connection is a FIFO; NCCL sends a channel's slots in order). It need not have
        arrived (the path latency overlaps the next message), and this one's ``compute_s``
        runs meanwhile (it follows the deps only).
    """

    id: int
    src: int
    dst: int
    nbytes: int
    deps: tuple = ()
    tag: str = ""
    compute_s: float = 0.0
    route: int = 0
    after: int | None = None

    def __post_init__(self):
        for name in ("id", "src", "dst", "nbytes", "route"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ScheduleError(f"Transfer: {name}={value!r} must be a non-negative integer")
        if self.src == self.dst and self.nbytes:
            raise ScheduleError(f"Transfer {self.id}: a local step (src == dst == {self.src}) "
                                f"must carry 0 bytes, not nbytes={self.nbytes}")
        deps = tuple(self.deps)
        for d in deps:
            if not is_int(d):
                raise ScheduleError(f"Transfer {self.id}: dependency {d!r} must be an int id")
        object.__setattr__(self, "deps", tuple(int(d) for d in deps))
        if self.after is not None and not is_int(self.after):
            raise ScheduleError(f"Transfer {self.id}: after={self.after!r} must be an int id or None")
        if not isinstance(self.tag, str):
            raise ScheduleError(f"Transfer {self.id}: tag={self.tag!r} must be a string")
        c = self.compute_s
        if not is_number(c) or not np.isfinite(c) or c < 0:
            raise ScheduleError(f"Transfer {self.id}: compute_s={c!r} must be a finite number "
                                f"of seconds >= 0")


class Schedule:
    """An immutable, validated schedule of transfers.

    Parameters
    ----------
    transfers : sequence of Transfer
        In an order where every dependency comes before its dependant.
    ranks : sequence of int
        The participating ranks.
    op, algorithm : str
        What the schedule implements, e.g. ("allreduce", "ring").
    nbytes : int
        The collective's message size in bytes (nccl-tests convention, see
        :func:`emulator.collectives.build_schedule`).
    chunks : int
        Pipelining chunks the schedule was built with.
    routes : sequence of Route
        The routes transfers refer to by index; ``routes[0]`` is the default
        ``Route()`` (prepended when missing).

    Attributes
    ----------
    src, dst, size, compute_s, dep_ptr, dep_idx, tag_code, ids, route, after : numpy.ndarray
        Read-only struct-of-arrays view; ``tags[tag_code[i]]`` is transfer ``i``'s tag,
        ``routes[route[i]]`` its route and ``after[i]`` the index of the transfer that must
        have left before it starts (-1: none; :attr:`Transfer.after`).
    detail : dict
        What the builder chose (NCCL algorithms: algorithm, protocol, channels, payload
        bytes); empty for the textbook algorithms.
    structure : object
        Identity of everything but the bytes: shared by the schedules :meth:`resized` makes
        from one another, so the engine may key what it derives from the rest on it.
    """

    __slots__ = ("src", "dst", "size", "compute_s", "dep_ptr", "dep_idx", "tag_code", "tags",
                 "ids", "route", "after", "routes", "ranks", "op", "algorithm", "nbytes", "chunks",
                 "detail", "structure", "_transfers")

    def __init__(self, transfers: Sequence[Transfer], ranks, op: str, algorithm: str,
                 nbytes: int, *, chunks: int = 1, routes: Sequence[Route] = (DEFAULT_ROUTE,)):
        transfers = list(transfers)
        for t in transfers:
            if not isinstance(t, Transfer):
                raise ScheduleError(f"Schedule: {t!r} is not a Transfer")
        pos = {}
        for i, t in enumerate(transfers):
            if t.id in pos:
                raise ScheduleError(f"Schedule: transfer id {t.id} appears twice")
            pos[t.id] = i
        dep_idx, counts = [], []
        for i, t in enumerate(transfers):
            for d in t.deps:
                j = pos.get(d)
                if j is None:
                    raise ScheduleError(f"Schedule: transfer {t.id} depends on unknown id {d}")
                if j >= i:
                    raise ScheduleError(f"Schedule: transfer {t.id} depends on {d}, which is not "
                                        f"listed before it (a cycle or a bad order)")
                dep_idx.append(j)
            counts.append(len(t.deps))
            if t.after is not None:
                j = pos.get(t.after)
                if j is None or j >= i:
                    raise ScheduleError(f"Schedule: transfer {t.id} comes after {t.after}, which is "
                                        f"not a transfer listed before it")
        tags = sorted({t.tag for t in transfers})
        code = {tag: k for k, tag in enumerate(tags)}
        self._init(
            src=np.array([t.src for t in transfers], dtype=np.int64),
            dst=np.array([t.dst for t in transfers], dtype=np.int64),
            size=np.array([t.nbytes for t in transfers], dtype=np.int64),
            compute_s=np.array([t.compute_s for t in transfers], dtype=np.float64),
            dep_ptr=np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64),
            dep_idx=np.array(dep_idx, dtype=np.int64),
            tag_code=np.array([code[t.tag] for t in transfers], dtype=np.int32),
            tags=tuple(tags), ids=np.array([t.id for t in transfers], dtype=np.int64),
            route=np.array([t.route for t in transfers], dtype=np.int64), routes=routes,
            after=np.array([-1 if t.after is None else pos[t.after] for t in transfers],
                           dtype=np.int64),
            ranks=ranks, op=op, algorithm=algorithm, nbytes=nbytes, chunks=chunks)
        object.__setattr__(self, "_transfers", tuple(transfers))

    @classmethod
    def from_arrays(cls, *, src, dst, size, compute_s, dep_ptr, dep_idx, tag_code, tags,
                    ranks, op, algorithm, nbytes, chunks=1, ids=None, route=None,
                    routes=(DEFAULT_ROUTE,), after=None) -> "Schedule":
        """Build from struct-of-arrays data (what the algorithm builders do); validated."""
        self = object.__new__(cls)
        src = np.asarray(src, dtype=np.int64)
        self._init(src=src, dst=np.asarray(dst, dtype=np.int64),
                   size=np.asarray(size, dtype=np.int64),
                   compute_s=np.asarray(compute_s, dtype=np.float64),
                   dep_ptr=np.asarray(dep_ptr, dtype=np.int64),
                   dep_idx=np.asarray(dep_idx, dtype=np.int64),
                   tag_code=np.asarray(tag_code, dtype=np.int32), tags=tuple(tags),
                   ids=np.arange(len(src), dtype=np.int64) if ids is None else np.asarray(ids),
                   route=(np.zeros(len(src), dtype=np.int64) if route is None
                          else np.asarray(route, dtype=np.int64)), routes=routes,
                   after=(np.full(len(src), -1, dtype=np.int64) if after is None
                          else np.asarray(after, dtype=np.int64)),
                   ranks=ranks, op=op, algorithm=algorithm, nbytes=nbytes, chunks=chunks)
        object.__setattr__(self, "_transfers", None)
        return self

    def _init(self, *, src, dst, size, compute_s, dep_ptr, dep_idx, tag_code, tags, ids, route,
              after, routes, ranks, op, algorithm, nbytes, chunks):
        n = len(src)
        routes = tuple(routes)
        for r in routes:
            if not isinstance(r, Route):
                raise ScheduleError(f"Schedule: routes entry {r!r} is not a Route")
        if not routes or routes[0] != DEFAULT_ROUTE:
            routes = (DEFAULT_ROUTE,) + routes
            route = route + 1
        ranks = tuple(int(r) for r in ranks)
        if len(set(ranks)) != len(ranks):
            raise ScheduleError(f"Schedule: ranks {list(ranks)} contain duplicates")
        for name, arr in (("dst", dst), ("size", size), ("compute_s", compute_s),
                          ("tag_code", tag_code), ("ids", ids), ("route", route),
                          ("after", after)):
            if len(arr) != n:
                raise ScheduleError(f"Schedule: {name} has {len(arr)} entries, src has {n}")
        if len(dep_ptr) != n + 1 or (n and (dep_ptr[0] != 0 or dep_ptr[-1] != len(dep_idx))):
            raise ScheduleError("Schedule: dep_ptr is not a CSR pointer over dep_idx")
        if n:
            # Whole-array reductions first; the offending entry is looked for only on failure
            # (each elementwise temporary of a 2-million-transfer schedule is 16 MB to fault in).
            _check_bytes(size, src, dst, ids, "Schedule")
            low = compute_s.min()
            if not np.isfinite(low) or low < 0 or not np.isfinite(compute_s.max()):
                raise ScheduleError("Schedule: compute_s must be finite and >= 0")
            # A lookup table of the ranks: one gather per array (np.isin sorts 2 million ids).
            top = max(ranks, default=-1)
            member = np.zeros(top + 2, dtype=bool)
            member[list(ranks)] = True
            for name, arr in (("src", src), ("dst", dst)):
                if member[:-1].all() and arr.min() >= 0 and arr.max() <= top:
                    continue                    # ranks 0..top, and every id in that range
                bad = ~member[np.where((arr < 0) | (arr > top), top + 1, arr)]
                if bad.any():
                    i = int(np.argmax(bad))
                    raise ScheduleError(f"Schedule: transfer {int(ids[i])}: {name}={int(arr[i])} "
                                        f"is not one of the ranks")
            if len(dep_idx):
                # Each transfer's latest dependency must come before it; the first (in index
                # order) that breaks this is named.
                latest = latest_dependency(dep_ptr, dep_idx)
                if (latest >= np.arange(n)).any() or dep_idx.min() < 0:
                    waits = np.flatnonzero(dep_ptr[1:] > dep_ptr[:-1])
                    early = np.minimum.reduceat(dep_idx, dep_ptr[waits]) < 0
                    i = int(waits[np.argmax((latest[waits] >= waits) | early)])
                    row = dep_idx[dep_ptr[i]:dep_ptr[i + 1]]
                    k = int(row[np.argmax((row < 0) | (row >= i))])
                    raise ScheduleError(f"Schedule: transfer {int(ids[i])} depends on index "
                                        f"{k}, not an earlier transfer (unknown "
                                        f"dependency or a cycle)")
            queued = np.flatnonzero(after != -1)
            bad = (after[queued] < -1) | (after[queued] >= queued)
            if bad.any():
                i = int(queued[np.argmax(bad)])
                raise ScheduleError(f"Schedule: transfer {int(ids[i])}: after={int(after[i])} is not "
                                    f"-1 or the index of an earlier transfer")
            if len(tags) and (tag_code.min() < 0 or tag_code.max() >= len(tags)):
                raise ScheduleError("Schedule: tag_code out of range of tags")
            if route.min() < 0 or route.max() >= len(routes):
                i = int(np.argmax((route < 0) | (route >= len(routes))))
                raise ScheduleError(f"Schedule: transfer {int(ids[i])}: route={int(route[i])} is "
                                    f"not an index of the {len(routes)} routes")
        for arr in (src, dst, size, compute_s, dep_ptr, dep_idx, tag_code, ids, route, after):
            arr.flags.writeable = False
        for name, value in (("src", src), ("dst", dst), ("size", size), ("compute_s", compute_s),
                            ("dep_ptr", dep_ptr), ("dep_idx", dep_idx), ("tag_code", tag_code),
                            ("tags", tags), ("ids", ids), ("route", route), ("after", after),
                            ("routes", routes),
                            ("ranks", ranks), ("op", str(op)), ("detail", {}),
                            ("algorithm", str(algorithm)), ("nbytes", int(nbytes)),
                            ("chunks", int(chunks))):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "structure", _Structure())

    def resized(self, size, nbytes: int, compute_s=None) -> "Schedule":
        """The same transfers carrying ``size`` bytes each: the schedule of the same shape for a
        message of ``nbytes`` (an NCCL ring at another size changes nothing but the bytes and,
        given ``compute_s``, the seconds each transfer waits: its steps' handshakes).

        Shares every other array with this schedule, and its :attr:`structure`, so that the
        engine reuses what it derived from them (routes, dependants) instead of deriving it
        again: at a million transfers that is seconds per size.

        Raises
        ------
        ScheduleError
            If ``size`` has the wrong length, a negative entry or bytes on a local step.

        Examples
        --------
        >>> s = Schedule([Transfer(0, 0, 1, 10), Transfer(1, 1, 0, 10, deps=(0,))], (0, 1),
        ...              "test", "x", 10)
        >>> t = s.resized([30, 20], 30)
        >>> t.size.tolist(), t.deps_of(1).tolist(), t.structure is s.structure
        ([30, 20], [0], True)
        """
        size = np.array(size, dtype=np.int64)
        n = len(self)
        if size.shape != (n,):
            raise ScheduleError(f"Schedule.resized: size has shape {size.shape}, the schedule "
                                f"{n} transfers")
        if n:
            _check_bytes(size, self.src, self.dst, self.ids, "Schedule.resized")
        if not is_int(nbytes) or nbytes < 0:
            raise ScheduleError(f"Schedule.resized: nbytes={nbytes!r} must be an int >= 0")
        slots = {**self._slots(), "size": size, "nbytes": int(nbytes), "detail": {}}
        if compute_s is not None:
            compute_s = np.array(compute_s, dtype=np.float64)
            if compute_s.shape != (n,):
                raise ScheduleError(f"Schedule.resized: compute_s has shape {compute_s.shape}, "
                                    f"the schedule {n} transfers")
            if n and (not np.isfinite(compute_s).all() or compute_s.min() < 0):
                raise ScheduleError("Schedule.resized: compute_s must be finite and >= 0")
            slots["compute_s"] = compute_s
        return _from_slots(slots)

    def _slots(self) -> dict:
        """Every slot but the Transfer objects (built again on demand)."""
        return {k: getattr(self, k) for k in self.__slots__ if k != "_transfers"}

    def __setattr__(self, name, value):
        raise AttributeError(f"Schedule is immutable (cannot set {name!r})")

    def __reduce__(self):
        # Unpickling a slotted class sets its slots through __setattr__, which a Schedule
        # forbids: it is rebuilt from its slots instead (to a Dask worker, say). Schedules
        # pickled together keep sharing a structure (pickle keeps one copy of the token).
        return _from_slots, (self._slots(),)

    def annotate(self, **detail) -> "Schedule":
        """Record what the builder chose in :attr:`detail` (builders only); returns self."""
        object.__setattr__(self, "detail", {**self.detail, **detail})
        return self

    def __len__(self) -> int:
        return len(self.src)

    def __repr__(self) -> str:
        return (f"Schedule(op={self.op!r}, algorithm={self.algorithm!r}, ranks={len(self.ranks)}, "
                f"nbytes={self.nbytes}, chunks={self.chunks}, transfers={len(self)})")

    @property
    def transfers(self) -> tuple:
        """The transfers as :class:`Transfer` objects (built on first use; slow for millions)."""
        if self._transfers is None:
            ptr, idx, ids = self.dep_ptr, self.dep_idx, self.ids
            out = tuple(
                Transfer(int(ids[i]), int(self.src[i]), int(self.dst[i]), int(self.size[i]),
                         tuple(int(ids[j]) for j in idx[ptr[i]:ptr[i + 1]]),
                         self.tags[self.tag_code[i]], float(self.compute_s[i]),
                         int(self.route[i]),
                         None if self.after[i] < 0 else int(ids[self.after[i]]))
                for i in range(len(self)))
            object.__setattr__(self, "_transfers", out)
        return self._transfers

    @property
    def total_bytes(self) -> int:
        """Bytes sent over the network by all transfers together."""
        return int(self.size.sum())

    def deps_of(self, i: int) -> np.ndarray:
        """Indices of the transfers that transfer index ``i`` waits for."""
        return self.dep_idx[self.dep_ptr[i]:self.dep_ptr[i + 1]]


def _check_bytes(size, src, dst, ids, who: str) -> None:
    """Every transfer carries >= 0 bytes and a local step none (the first offender named)."""
    if size.min() < 0:
        i = int(np.argmax(size < 0))
        raise ScheduleError(f"{who}: transfer {int(ids[i])}: nbytes={int(size[i])} < 0")
    local = src == dst
    if local.any() and np.any(local & (size != 0)):
        i = int(np.argmax(local & (size != 0)))
        raise ScheduleError(f"{who}: local step {int(ids[i])} carries {int(size[i])} bytes")


def _from_slots(slots: dict) -> Schedule:
    """A :class:`Schedule` from its slots (:meth:`Schedule.resized`, unpickling), with its
    arrays read-only."""
    out = object.__new__(Schedule)
    for name, value in slots.items():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
        object.__setattr__(out, name, value)
    object.__setattr__(out, "_transfers", None)
    return out


class _Structure:
    """Identity of a schedule's transfers apart from their bytes (:meth:`Schedule.resized`)."""

    __slots__ = ("__weakref__",)


def latest_dependency(dep_ptr, dep_idx) -> np.ndarray:
    """Per transfer, the largest index it depends on (-1 for none), from a dependency CSR.

    Examples
    --------
    >>> latest_dependency(np.array([0, 0, 2, 3]), np.array([0, 1, 0])).tolist()
    [-1, 1, 0]
    """
    latest = np.full(len(dep_ptr) - 1, -1, dtype=np.int64)
    waits = np.flatnonzero(dep_ptr[1:] > dep_ptr[:-1])
    if len(waits):
        latest[waits] = np.maximum.reduceat(dep_idx, dep_ptr[waits])
    return latest


def split(nbytes: int, parts: int) -> np.ndarray:
    """``nbytes`` split into ``parts`` integers as evenly as possible (the first get the extra)."""
    return split_each([int(nbytes)], parts)[:, 0]


def split_each(nbytes, parts: int) -> np.ndarray:
    """:func:`split` of every entry of ``nbytes``, as columns: ``(parts, len(nbytes))``.

    Examples
    --------
    >>> split_each([7, 2], 3).tolist()
    [[3, 1], [2, 1], [2, 0]]
    """
    if int(parts) < 1:
        raise ScheduleError(f"split: parts={parts!r} must be >= 1")
    q, r = np.divmod(np.asarray(nbytes, dtype=np.int64), int(parts))
    return q[None, :] + (np.arange(int(parts))[:, None] < r[None, :])


def check_ranks(ranks) -> tuple:
    """``ranks`` as a tuple: an int ``p`` means ranks 0..p-1; else distinct ints >= 0."""
    if isinstance(ranks, numbers.Integral) and not isinstance(ranks, bool):
        if ranks < 1:
            raise ConfigError(f"ranks={ranks!r} must be >= 1")
        return tuple(range(int(ranks)))
    try:
        out = tuple(ranks)
    except TypeError:
        raise ConfigError(f"ranks={ranks!r} must be an int or a sequence of ints") from None
    if not out:
        raise ConfigError("ranks=[] must name at least one rank")
    for r in out:
        if not is_int(r) or r < 0:
            raise ConfigError(f"ranks: {r!r} must be a non-negative integer")
    if len(set(out)) != len(out):
        raise ConfigError(f"ranks={list(out)} contains duplicates")
    return tuple(int(r) for r in out)
