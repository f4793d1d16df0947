"""Max-min fair rates of flows on shared channels, kept up to date event by event.

Flows are grouped by *path* (a fixed sequence of directed channels): every flow of a path
crosses the same channels, so max-min fairness gives them the same rate for as long as they
coexist (the allocation is unique and symmetric in them). A path with ``mult`` active flows
is one entity of weight ``mult``: the many chunks of one connection, or the NCCL channels
that share a route, cost one.

Water-filling (Bertsekas & Gallager, *Data Networks*, section 6.5.2) with a heap: the
channel of least fair share ``residual / unfrozen flows`` is the next bottleneck; its
unfrozen flows freeze at that share and leave their other channels' residuals. Every flow
freezes once, so one allocation costs O(entries log channels), not one numpy pass over all
flows per level.

Incrementally, an event (flows joining or leaving paths) re-solves only what it can change.
Let ``lam`` be the least of the old rates of the paths that lost flows and, for paths that
gained flows, a lower bound of their new rate: ``min cap_c / n_c`` over their channels
(every flow gets at least that much at its bottleneck channel, where all flows are no faster
than it and fill the capacity). Water-filling of the old and the new flow sets runs
identically below ``lam``: a channel crossed by a changed flow is never a bottleneck below
that flow's rate, in either set, and every other channel has the same flows. So every flow
slower than ``lam`` keeps its rate. Above ``lam`` the problem splits into connected
components of the faster flows; only the components that touch a changed path can change.
The re-solve is therefore a search from the changed paths' channels through paths no slower
than ``lam`` (less a 1e-9 margin, which can only add paths: a subset solved against fixed
rates of all other flows on its channels is still max-min fair), followed by water-filling
of what it found against the residual capacity the slower flows leave.

Per channel it also records when it carried flows (busy seconds) and its highest load.
Kernels are plain Python until compiled (:mod:`emulator._jit`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._jit import compile_kernels, kernel, use_compiled
from .errors import ConfigError, SimulationError

__all__ = ["Paths", "Allocator", "max_min"]

#: Paths slower than lam by less than this fraction are re-solved too (float noise).
MARGIN = 1e-9


class Paths(NamedTuple):
    """The static structure: paths (CSR over channel ids), the reverse index, capacities."""
    ptr: np.ndarray        # (P+1,) int64: path p crosses chan[ptr[p]:ptr[p+1]]
    chan: np.ndarray       # (E,) int64: channel of each entry
    owner: np.ndarray      # (E,) int64: path of each entry
    cptr: np.ndarray       # (C+1,) int64: slots of channel c are cptr[c]:cptr[c+1]
    cap: np.ndarray        # (C,) float64: bytes/s


class State(NamedTuple):
    """What changes: active flows per path, rates, channel occupancy and usage, scratch."""
    slot: np.ndarray       # (E,) entry in each slot; a channel's region comes first
    where: np.ndarray      # (E,) slot of each entry
    sdat: np.ndarray       # (E, 2) per slot: its path's rate (inf: changed, re-solve it;
                           # -1: idle) and flows (0: idle), side by side for the scans
    fill: np.ndarray       # (C,) entries in each channel's region: active and idle ones
    dead: np.ndarray       # (C,) idle entries in the region, compacted when half of it
    mult: np.ndarray       # (P,) active flows per path
    mult0: np.ndarray      # (P,) active flows before the pending changes
    nflows: np.ndarray     # (C,) active flows crossing each channel (with multiplicity)
    rate: np.ndarray       # (P,) bytes/s of each flow of the path
    sent: np.ndarray       # (P,) bytes each flow of the path sent since it became active...
    mark: np.ndarray       # (P,) ...as of this time (s)
    busy: np.ndarray       # (C,) seconds with flows on the channel
    since: np.ndarray      # (C,) when the channel last became busy (s)
    peak: np.ndarray       # (C,) highest load / capacity
    flags: np.ndarray      # (P,) int8: 1 lost flows, 2 gained flows, since the last solve
    changed: np.ndarray    # (P,) paths with flags, first counters[0]
    counters: np.ndarray   # (3,) int64: changed paths, solve stamp, paths re-solved last
    in_set: np.ndarray     # (P,) stamp: path is re-solved in this solve
    frozen: np.ndarray     # (P,) stamp: path frozen in this solve
    new_rate: np.ndarray   # (P,)
    seen: np.ndarray       # (C,) stamp: channel visited in this solve
    resid: np.ndarray      # (C,) residual capacity, bytes/s
    count: np.ndarray      # (C,) unfrozen flows of the solved set (float: exact integers)
    paths: np.ndarray      # (P,) the solved set, then paths only re-keyed; first counters[2]
    chans: np.ndarray      # (C,) the visited channels
    hkey: np.ndarray       # (C+E,) heap of fair shares (lazy deletion)
    hval: np.ndarray       # (C+E,)


def build_paths(ptr, chan, capacity) -> Paths:
    """The :class:`Paths` of paths given as CSR (``ptr``, ``chan``) over ``capacity``."""
    ptr = np.ascontiguousarray(ptr, dtype=np.int64)
    chan = np.ascontiguousarray(chan, dtype=np.int64)
    cap = np.ascontiguousarray(capacity, dtype=np.float64)
    if len(ptr) < 1 or ptr[0] != 0 or ptr[-1] != len(chan) or np.any(np.diff(ptr) < 0):
        raise ConfigError("paths: ptr must be a CSR pointer over chan")
    if len(chan) and (chan.min() < 0 or chan.max() >= len(cap)):
        raise ConfigError(f"paths: channel ids must be in 0..{len(cap) - 1}")
    if len(cap) and not (np.all(np.isfinite(cap)) and cap.min() > 0):
        raise ConfigError(f"paths: capacities must be finite and > 0, got min {cap.min()!r}")
    owner = np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
    cptr = np.zeros(len(cap) + 1, dtype=np.int64)
    np.cumsum(np.bincount(chan, minlength=len(cap)), out=cptr[1:])
    return Paths(ptr, chan, owner, cptr, cap)


def new_state(paths: Paths) -> State:
    """All paths idle."""
    n_p, n_c, n_e = len(paths.ptr) - 1, len(paths.cap), len(paths.chan)
    slot = np.argsort(paths.chan, kind="stable").astype(np.int64)
    where = np.empty(n_e, dtype=np.int64)
    where[slot] = np.arange(n_e, dtype=np.int64)
    i64 = lambda n: np.zeros(n, dtype=np.int64)   # noqa: E731
    sdat = np.zeros((n_e, 2))
    sdat[:, 0] = -1.0
    return State(slot=slot, where=where, sdat=sdat, fill=i64(n_c), dead=i64(n_c), mult=i64(n_p),
                 mult0=i64(n_p),
                 nflows=i64(n_c), rate=np.zeros(n_p), sent=np.zeros(n_p), mark=np.zeros(n_p),
                 busy=np.zeros(n_c), since=np.zeros(n_c), peak=np.zeros(n_c),
                 flags=np.zeros(n_p, dtype=np.int8), changed=i64(n_p), counters=i64(3),
                 in_set=i64(n_p), frozen=i64(n_p), new_rate=np.zeros(n_p), seen=i64(n_c),
                 resid=np.zeros(n_c), count=np.zeros(n_c), paths=i64(n_p), chans=i64(n_c),
                 hkey=np.empty(n_c + n_e), hval=np.empty(n_c + n_e, dtype=np.int64))


# -- a binary min-heap on two arrays ---------------------------------------------------------
@kernel(allocates=False)
def heap_push(key, val, n, k, v):
    """Push (k, v) on the heap of ``n`` items; returns the new size."""
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if key[parent] < k or (key[parent] == k and val[parent] <= v):
            break
        key[i] = key[parent]
        val[i] = val[parent]
        i = parent
    key[i] = k
    val[i] = v
    return n + 1


@kernel(allocates=False)
def heap_pop(key, val, n):
    """Remove the least item (read it at [0] first); returns the new size."""
    n -= 1
    k, v = key[n], val[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (key[c + 1] < key[c] or (key[c + 1] == key[c] and val[c + 1] < val[c])):
            c += 1
        if k < key[c] or (k == key[c] and v <= val[c]):
            break
        key[i] = key[c]
        val[i] = val[c]
        i = c
    if n > 0:
        key[i] = k
        val[i] = v
    return n


# -- occupancy -------------------------------------------------------------------------------
@kernel(allocates=False)
def advance(P, S, p, t):
    """Bring path ``p``'s bytes sent per flow forward to time ``t`` (s) at its rate."""
    if S.mult[p] > 0 and t > S.mark[p]:
        S.sent[p] += S.rate[p] * (t - S.mark[p])
    S.mark[p] = t


@kernel(allocates=False)
def change(P, S, p, delta, t):
    """``delta`` flows join (> 0) or leave (< 0) path ``p`` at time ``t`` (s)."""
    if delta == 0:
        return
    if S.flags[p] == 0:
        S.changed[S.counters[0]] = p
        S.counters[0] += 1
        S.mult0[p] = S.mult[p]
    if delta < 0:
        S.flags[p] |= 1
    else:
        S.flags[p] |= 2
    if S.mult[p] == 0:
        S.sent[p] = 0.0
        S.mark[p] = t
    else:
        advance(P, S, p, t)
    for e in range(P.ptr[p], P.ptr[p + 1]):
        c = P.chan[e]
        before = S.nflows[c]
        S.nflows[c] = before + delta
        if before == 0:
            S.since[c] = t
        elif S.nflows[c] == 0:
            S.busy[c] += t - S.since[c]
    was = S.mult[p]
    m = was + delta
    S.mult[p] = m
    for e in range(P.ptr[p], P.ptr[p + 1]):
        c = P.chan[e]
        s = S.where[e]
        if m == 0:                               # idle: left in the region, compacted later
            S.sdat[s, 0] = -1.0
            S.sdat[s, 1] = 0.0
            S.dead[c] += 1
            if 2 * S.dead[c] > S.fill[c] + 16:
                _compact(P, S, c)
            continue
        if was == 0:
            if s < P.cptr[c] + S.fill[c]:        # still in the region: revive in place
                S.dead[c] -= 1
            else:                                # into the region
                top = P.cptr[c] + S.fill[c]
                other = S.slot[top]
                S.slot[top], S.where[e] = e, top
                S.slot[s], S.where[other] = other, s
                S.sdat[s, 0], S.sdat[s, 1] = S.sdat[top, 0], S.sdat[top, 1]
                S.fill[c] += 1
                s = top
        S.sdat[s, 0] = np.inf
        S.sdat[s, 1] = m


@kernel(allocates=False)
def _compact(P, S, c):
    """Move channel ``c``'s active entries to the front of its region, idle ones out."""
    lo = P.cptr[c]
    i = lo
    for s in range(lo, lo + S.fill[c]):
        if S.sdat[s, 1] > 0.0:
            if s != i:
                e, other = S.slot[s], S.slot[i]
                S.slot[i], S.where[e] = e, i
                S.slot[s], S.where[other] = other, s
                for k in range(2):
                    S.sdat[i, k], S.sdat[s, k] = S.sdat[s, k], S.sdat[i, k]
            i += 1
    S.fill[c] = i - lo
    S.dead[c] = 0


@kernel(allocates=False)
def _bound(P, S, n_changed):
    """``lam``: no flow slower than this can change rate (module docstring)."""
    lam = np.inf
    for k in range(n_changed):
        p = S.changed[k]
        if S.flags[p] & 1 and S.mult0[p] > 0 and S.rate[p] < lam:
            lam = S.rate[p]
        if S.flags[p] & 2 and S.mult[p] > 0:
            for e in range(P.ptr[p], P.ptr[p + 1]):
                c = P.chan[e]
                share = P.cap[c] / S.nflows[c]
                if share < lam:
                    lam = share
    return lam


@kernel(allocates=False)
def solve(P, S, t):
    """Re-solve the rates the pending changes can affect; returns the number of paths
    re-solved (listed first in ``S.paths``, then the paths whose flows changed but not their
    count, ``S.counters[2]`` in all), or -1 if a rate came out non-positive."""
    n_all = S.counters[0]
    S.counters[2] = 0
    if n_all == 0:
        return 0
    # A path with as many flows as before (one left, the next on its connection joined) changes
    # no rate: the allocation depends on the multiplicities only. It keeps its rate and is not
    # a seed; it goes to the end of the list, to be re-keyed (its flows changed).
    n_changed = n_all
    k = 0
    while k < n_changed:
        p = S.changed[k]
        if S.mult[p] == S.mult0[p]:
            n_changed -= 1
            S.changed[k], S.changed[n_changed] = S.changed[n_changed], p
            if S.mult[p] > 0:
                for e in range(P.ptr[p], P.ptr[p + 1]):
                    S.sdat[S.where[e], 0] = S.rate[p]
        else:
            k += 1
    stamp = S.counters[1] + 1
    S.counters[1] = stamp
    floor = _bound(P, S, n_changed) * (1.0 - MARGIN)
    n_a = 0
    n_v = 0
    for k in range(n_changed):
        p = S.changed[k]
        if S.mult[p] > 0:
            S.in_set[p] = stamp
            S.paths[n_a] = p
            n_a += 1
        for e in range(P.ptr[p], P.ptr[p + 1]):
            c = P.chan[e]
            if S.seen[c] != stamp:
                S.seen[c] = stamp
                S.chans[n_v] = c
                n_v += 1
    # Search: the channels of the set, and on each the paths no slower than the floor (the
    # changed ones are marked inf); the others' load leaves the residual capacity.
    qa = 0
    qv = 0
    n_h = 0
    while qa < n_a or qv < n_v:
        while qa < n_a:
            p = S.paths[qa]
            qa += 1
            for e in range(P.ptr[p], P.ptr[p + 1]):
                c = P.chan[e]
                if S.seen[c] != stamp:
                    S.seen[c] = stamp
                    S.chans[n_v] = c
                    n_v += 1
        while qv < n_v:
            c = S.chans[qv]
            qv += 1
            r = P.cap[c]
            cnt = 0.0
            for s in range(P.cptr[c], P.cptr[c] + S.fill[c]):
                x = S.sdat[s, 0]
                if x >= floor:
                    cnt += S.sdat[s, 1]
                    q = P.owner[S.slot[s]]
                    if S.in_set[q] != stamp:
                        S.in_set[q] = stamp
                        S.paths[n_a] = q
                        n_a += 1
                else:
                    r -= S.sdat[s, 1] * x
            S.resid[c] = r
            S.count[c] = cnt
            if cnt > 0:
                n_h = heap_push(S.hkey, S.hval, n_h, max(r, 0.0) / cnt, c)
    # Water-filling: the least share is the next bottleneck; its flows freeze at it. A
    # freeze at share s only raises the share of the frozen path's other channels (each
    # had share >= s), so a channel's entry is re-keyed lazily, when it reaches the top.
    while n_h > 0:
        share, c = S.hkey[0], S.hval[0]
        n_h = heap_pop(S.hkey, S.hval, n_h)
        if S.count[c] == 0:
            continue                                # every path on it froze elsewhere
        now = max(S.resid[c], 0.0) / S.count[c]
        if now != share:
            n_h = heap_push(S.hkey, S.hval, n_h, now, c)
            continue
        if not share > 0.0:
            return -1
        for s in range(P.cptr[c], P.cptr[c] + S.fill[c]):
            if S.sdat[s, 0] < floor:
                continue
            q = P.owner[S.slot[s]]
            if S.frozen[q] == stamp:
                continue
            S.frozen[q] = stamp
            S.new_rate[q] = share
            m = S.mult[q]
            for e in range(P.ptr[q], P.ptr[q + 1]):
                c2 = P.chan[e]
                S.resid[c2] -= m * share
                S.count[c2] -= m
    for k in range(n_a):
        q = S.paths[k]
        r = S.new_rate[q]
        if r != S.rate[q]:
            advance(P, S, q, t)
            S.rate[q] = r
        for e in range(P.ptr[q], P.ptr[q + 1]):
            S.sdat[S.where[e], 0] = r
    for k in range(n_v):
        c = S.chans[k]
        load = (P.cap[c] - S.resid[c]) / P.cap[c]
        if load > S.peak[c]:
            S.peak[c] = load
    n_r = n_a
    for k in range(n_changed, n_all):
        q = S.changed[k]
        if S.mult[q] > 0 and S.in_set[q] != stamp:
            S.in_set[q] = stamp
            S.paths[n_r] = q
            n_r += 1
    for k in range(n_all):
        S.flags[S.changed[k]] = 0
    S.counters[0] = 0
    S.counters[2] = n_r
    return n_a


class Allocator:
    """Max-min fair rates of flows on paths, re-solved incrementally after each change.

    Parameters
    ----------
    ptr, chan : array of int
        Path p crosses channels ``chan[ptr[p]:ptr[p+1]]`` (CSR).
    capacity : array of float
        Bytes/s of each channel.

    Examples
    --------
    >>> a = Allocator([0, 1, 3], [0, 0, 1], [1.0, 2.0])
    >>> a.change(0, 1); a.change(1, 1); _ = a.solve()
    >>> a.rates().tolist()
    [0.5, 0.5]
    """

    def __init__(self, ptr, chan, capacity, *, compiled: bool | None = None):
        self.paths = build_paths(ptr, chan, capacity)
        self.state = new_state(self.paths)
        if compiled is None:
            use_compiled(len(self.paths.chan))
        elif compiled:
            compile_kernels()

    def change(self, path: int, delta: int, t: float = 0.0) -> None:
        """``delta`` flows join (> 0) or leave (< 0) ``path`` at time ``t`` (s)."""
        n = len(self.paths.ptr) - 1
        if not 0 <= path < n:
            raise ConfigError(f"path={path!r} must be in 0..{n - 1}")
        if self.state.mult[path] + delta < 0:
            raise ConfigError(f"path {path} has {self.state.mult[path]} flows; cannot remove "
                              f"{-delta}")
        change(self.paths, self.state, int(path), int(delta), float(t))

    def solve(self, t: float = 0.0) -> np.ndarray:
        """Re-solve after the changes; returns the paths whose rates were recomputed."""
        n = solve(self.paths, self.state, float(t))
        if n < 0:
            raise SimulationError("max-min allocation gave a flow no bandwidth (a channel's "
                                  "residual capacity reached 0 with flows left on it)")
        return self.state.paths[:n].copy()

    def rates(self) -> np.ndarray:
        """Bytes/s of each flow of every path (0 for idle paths)."""
        return np.where(self.state.mult > 0, self.state.rate, 0.0)


def max_min(entry_flow, entry_chan, capacity, n_flows: int, *, compiled: bool | None = None):
    """Max-min fair rates (bytes/s) of flows given as (flow, channel) crossings.

    Parameters
    ----------
    entry_flow, entry_chan : array of int
        One entry per (flow, channel) crossing.
    capacity : array of float
        Bytes/s of each channel.
    n_flows : int

    Returns
    -------
    ndarray of float
        One rate per flow (flows with no channel get inf).

    Examples
    --------
    >>> max_min([0, 1, 1], [0, 0, 1], [1.0, 2.0], 2).tolist()
    [0.5, 0.5]
    """
    entry_flow = np.asarray(entry_flow, dtype=np.int64)
    order = np.argsort(entry_flow, kind="stable")
    ptr = np.zeros(n_flows + 1, dtype=np.int64)
    np.cumsum(np.bincount(entry_flow, minlength=n_flows), out=ptr[1:])
    alloc = Allocator(ptr, np.asarray(entry_chan, dtype=np.int64)[order], capacity,
                      compiled=compiled)
    for f in range(n_flows):
        if ptr[f + 1] > ptr[f]:
            alloc.change(f, 1)
    alloc.solve()
    return np.where(np.diff(ptr) > 0, alloc.rates(), np.inf)
