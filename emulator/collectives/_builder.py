"""The schedule builder: algorithms add transfers in vectorised batches (or one by one, as
rows joined into arrays in bulk) and get a validated :class:`._schedule.Schedule`."""
from __future__ import annotations

import numpy as np

from ..errors import ScheduleError
from ._schedule import DEFAULT_ROUTE, Route, Schedule

__all__ = ["Builder"]


class Builder:
    """Accumulates transfers in vectorised batches and returns a :class:`Schedule`.

    Each :meth:`add` appends ``m`` transfers and returns their indices; ``deps`` is a list of
    integer arrays of length ``m`` (``-1`` = no dependency in that column), ``after`` the
    index each must leave after (:attr:`Transfer.after`; ``-1`` = none).
    """

    def __init__(self):
        self._parts = []
        self._rows = []       # single transfers not yet in _parts (see add)
        self._n = 0
        self._tags: dict[str, int] = {}
        self._routes: dict[Route, int] = {DEFAULT_ROUTE: 0}

    @property
    def count(self) -> int:
        return self._n

    def route(self, route: Route) -> int:
        """The index of ``route`` in the schedule being built (added on first use)."""
        if not isinstance(route, Route):
            raise ScheduleError(f"Builder.route: {route!r} is not a Route")
        return self._routes.setdefault(route, len(self._routes))

    def add(self, src, dst, nbytes, deps=(), tag: str = "", compute_s=0.0, route=0,
            after=-1) -> np.ndarray:
        one = self._row(src, dst, nbytes, deps, tag, compute_s, route, after)
        if one is not None:
            return np.array([one], dtype=np.int64)
        self._flush()
        # Scalars broadcast against the longest argument (one sender, c chunks, say).
        m = max(np.size(src), np.size(dst), np.size(nbytes), np.size(compute_s), np.size(route),
                np.size(after), *(np.size(d) for d in deps))
        src = np.broadcast_to(np.asarray(src, dtype=np.int64), (m,))
        dst = np.broadcast_to(np.asarray(dst, dtype=np.int64), (m,))
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=np.int64), (m,))
        compute = np.broadcast_to(np.asarray(compute_s, dtype=np.float64), (m,))
        routes = np.broadcast_to(np.asarray(route, dtype=np.int64), (m,))
        after = np.broadcast_to(np.asarray(after, dtype=np.int64), (m,))
        cols = [np.broadcast_to(np.asarray(d, dtype=np.int64), (m,)) for d in deps]
        depmat = np.stack(cols, axis=1) if cols else np.empty((m, 0), dtype=np.int64)
        code = self._tags.setdefault(tag, len(self._tags))
        ids = np.arange(self._n, self._n + m, dtype=np.int64)
        self._parts.append((src, dst, nbytes, compute, depmat, code, routes, after))
        self._n += m
        return ids

    def add_one(self, src: int, dst: int, nbytes: int, deps=(), tag: str = "", compute_s=0.0,
                route: int = 0, after: int = -1) -> int:
        """:meth:`add` of one transfer, its id as an int (an NVLS tree on 8,192 GPUs adds
        150,000 one at a time)."""
        one = self._row(src, dst, nbytes, deps, tag, compute_s, route, after)
        return one if one is not None else int(self.add(src, dst, nbytes, deps, tag, compute_s,
                                                        route, after)[0])

    def _row(self, src, dst, nbytes, deps, tag, compute_s, route, after):
        """One transfer of plain ints whose dependencies are single ids (NVLS exchanges,
        tree hops) as a row, joined into arrays in bulk (broadcasting each alone cost
        ~100 us, 15 s for a 8,192-GPU NVLS-tree): its id; None for anything else."""
        one = (_single_ids(deps) if type(src) is int and type(dst) is int
               and type(nbytes) is int and type(route) is int and type(after) is int
               and type(compute_s) in (float, int) else None)
        if one is None:
            return None
        code = self._tags.setdefault(tag, len(self._tags))
        self._rows.append((src, dst, nbytes, float(compute_s), one, code, route, after))
        self._n += 1
        return self._n - 1

    def _flush(self) -> None:
        """The pending single transfers as one part, in the order they were added (a part
        per tag, dependency width padded with -1)."""
        rows, self._rows = self._rows, []
        if not rows:
            return
        i64 = np.int64
        width = max(len(r[4]) for r in rows)
        deps = np.full((len(rows), width), -1, dtype=i64)
        for k, r in enumerate(rows):
            deps[k, :len(r[4])] = r[4]
        codes = [r[5] for r in rows]
        # parts carry one tag each: cut the rows where the tag changes
        cuts = [0] + [k for k in range(1, len(rows)) if codes[k] != codes[k - 1]] + [len(rows)]
        cols = [np.array([r[j] for r in rows], dtype=i64 if j != 3 else np.float64)
                for j in (0, 1, 2, 3, 6, 7)]
        for a, b in zip(cuts, cuts[1:]):
            src, dst, size, comp, route, after = (c[a:b] for c in cols)
            self._parts.append((src, dst, size, comp, deps[a:b], codes[a], route, after))

    def local(self, rank, deps=(), tag: str = "", compute_s=0.0) -> np.ndarray:
        """Local steps (src == dst, 0 bytes) at ``rank`` (an array of ranks)."""
        return self.add(rank, rank, 0, deps, tag, compute_s)

    def build(self, ranks, op, algorithm, nbytes, chunks=1) -> Schedule:
        self._flush()
        if self._parts:
            def joined(k):
                # one add (an allgather's whole ring): its arrays as they are where contiguous
                arrs = [p[k] for p in self._parts]
                return np.ascontiguousarray(arrs[0]) if len(arrs) == 1 else np.concatenate(arrs)

            src, dst, size, compute = joined(0), joined(1), joined(2), joined(3)
            counts, flat = [], []
            for p in self._parts:
                mask = p[4] >= 0
                counts.append(np.count_nonzero(mask, axis=1))
                flat.append(p[4][mask])
            counts = np.concatenate(counts)
            dep_idx = np.concatenate(flat)
            tag_code = np.concatenate([np.full(len(p[0]), p[5], dtype=np.int32)
                                       for p in self._parts])
            route, after = joined(6), joined(7)
        else:
            src = dst = size = dep_idx = route = after = np.empty(0, dtype=np.int64)
            compute = np.empty(0)
            counts = np.empty(0, dtype=np.int64)
            tag_code = np.empty(0, dtype=np.int32)
        dep_ptr = np.zeros(len(src) + 1, dtype=np.int64)
        np.cumsum(counts, out=dep_ptr[1:])
        return Schedule.from_arrays(src=src, dst=dst, size=size, compute_s=compute,
                                    dep_ptr=dep_ptr, dep_idx=dep_idx, tag_code=tag_code,
                                    tags=tuple(self._tags), ranks=ranks, op=op,
                                    algorithm=algorithm, nbytes=nbytes, chunks=chunks,
                                    route=route, routes=tuple(self._routes), after=after)


def _single_ids(deps):
    """``deps`` as a tuple of ints when each is one transfer id (an int, or any array of one
    element), else None. Ints and numpy arrays are read without numpy's generic functions:
    an 8,192-GPU NVLS tree adds 150,000 transfers one at a time."""
    out = []
    for d in deps:
        if type(d) is int:
            out.append(d)
        elif type(d) is np.ndarray:
            if d.size != 1:
                return None
            out.append(int(d.ravel()[0]))
        elif np.size(d) == 1:
            out.append(int(np.ravel(d)[0]))
        else:
            return None
    return tuple(out)
