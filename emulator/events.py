"""The engine's event loop in compiled code: starts, finishes, arrivals, in time order.

A transfer has three moments: it *starts* once its dependencies have arrived, its local work
(``compute_s``) is done and its sender's straggler delay has passed; its last byte *leaves*
when its flow finishes (:mod:`emulator.flows`), at once if it has no bytes or is a local
step; it *arrives* one path latency after that. Starts and arrivals wait in one binary heap
of (time, transfer, kind); flows in progress in the per-path finish heap of
:mod:`emulator.flows`.

A transfer queued behind another on its connection (``after``) starts once that one's last
byte has left (not arrived) and its own dependencies and local work are done, whichever is
later: the local work overlaps the message ahead.

One event is one instant: every finish, arrival and start due then (to 1e-12 relative) is
handled, dependants whose start falls in the same instant included, and the rates are then
re-solved once (:func:`emulator.maxmin.solve`). :func:`run` handles up to ``max_events``
events per call, so the SimPy process that drives the engine (:mod:`emulator.engine`) steps
its clock in batches, not one Python round trip per event: a 1024-GPU ring phase of uneven
hops has millions of events.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._jit import kernel
from .flows import finish, join_one, next_finish, rekey
from .maxmin import heap_pop, heap_push, solve

__all__ = ["Schedule", "Clock", "new_clock", "dependants", "start", "run"]

START = 0
ARRIVE = 1


class Schedule(NamedTuple):
    """The schedule as the loop reads it (struct of arrays, per transfer unless noted)."""
    moves: np.ndarray        # bool: a flow with bytes on the network
    compute: np.ndarray      # s of local work before the start
    earliest: np.ndarray     # s before which it may not start (straggler delay)
    lat: np.ndarray          # s from its last byte leaving to its arrival
    remaining: np.ndarray    # dependencies not arrived yet
    rev_ptr: np.ndarray      # (n+1,) CSR of dependants
    rev_idx: np.ndarray
    after: np.ndarray        # transfer whose last byte must leave before this one's first
    aft_ptr: np.ndarray      # (n+1,) CSR of the reverse of ``after``
    aft_idx: np.ndarray
    ready: np.ndarray        # s when its data and local work are ready (nan before)
    left: np.ndarray         # s when its last byte left (nan before)


class Clock(NamedTuple):
    """Event heap, outcome times and counters."""
    hkey: np.ndarray         # (2n,) times of pending starts and arrivals (s)
    hval: np.ndarray         # (2n,) 2 * transfer + kind
    start: np.ndarray        # (n,) when each transfer started (s), nan before
    arrive: np.ndarray       # (n,) when it arrived (s), nan before
    counts: np.ndarray       # (5,) int64: heap size, arrived, events, paths re-solved, status


def new_clock(n: int) -> Clock:
    return Clock(hkey=np.empty(2 * n), hval=np.empty(2 * n, dtype=np.int64),
                 start=np.full(n, np.nan), arrive=np.full(n, np.nan),
                 counts=np.zeros(5, dtype=np.int64))


@kernel
def dependants(dep_ptr, dep_idx, n):
    """The reverse of the dependency CSR: ``(rev_ptr, rev_idx)``, transfer ``i``'s dependants
    in ``rev_idx[rev_ptr[i]:rev_ptr[i+1]]`` in increasing order (a counting sort: O(n), where
    a stable argsort of a 2-million-transfer all-gather's edges took 0.15 s)."""
    rev_ptr = np.zeros(n + 1, dtype=np.int64)
    for k in range(len(dep_idx)):
        rev_ptr[dep_idx[k] + 1] += 1
    for i in range(n):
        rev_ptr[i + 1] += rev_ptr[i]
    fill = rev_ptr[:-1].copy()
    rev_idx = np.empty(len(dep_idx), dtype=np.int64)
    for j in range(n):
        for k in range(dep_ptr[j], dep_ptr[j + 1]):
            i = dep_idx[k]
            rev_idx[fill[i]] = j
            fill[i] += 1
    return rev_ptr, rev_idx


@kernel(allocates=False)
def _push(K, t, i, kind):
    K.counts[0] = heap_push(K.hkey, K.hval, K.counts[0], t, 2 * i + kind)


@kernel(allocates=False)
def _ready(D, K, i, t):
    """Transfer ``i``'s dependencies have all arrived at ``t``: schedule its start, once its
    local work is done and the message ahead of it on its connection has left."""
    st = (t if t > D.earliest[i] else D.earliest[i]) + D.compute[i]
    a = D.after[i]
    if a < 0 or not np.isnan(D.left[a]):
        _push(K, st, i, START)          # (that message left at or before t <= st)
    else:
        D.ready[i] = st


@kernel(allocates=False)
def _left(D, K, i, t):
    """Transfer ``i``'s last byte left at ``t``: a message queued behind it on its connection
    (:attr:`emulator.Transfer.after`) whose work is done may start."""
    D.left[i] = t
    for k in range(D.aft_ptr[i], D.aft_ptr[i + 1]):
        j = D.aft_idx[k]
        if not np.isnan(D.ready[j]):
            _push(K, D.ready[j] if D.ready[j] > t else t, j, START)


@kernel(allocates=False)
def start(D: Schedule, K: Clock):
    """Schedule the starts of the transfers with no dependency."""
    for i in range(len(D.remaining)):
        if D.remaining[i] == 0:
            _ready(D, K, i, 0.0)


@kernel(allocates=False)
def next_time(F, K):
    """When the next event is due (s); inf when nothing is pending."""
    t = next_finish(F)
    if K.counts[0] > 0 and K.hkey[0] < t:
        t = K.hkey[0]
    return t


@kernel(allocates=False)
def run(P, S, F, D: Schedule, K: Clock, rel_t, rel_d, max_events):
    """Handle up to ``max_events`` events; returns the time of the last one (s), or -1.0 if
    nothing was pending. ``K.counts[4]`` is set to 1 when a rate came out non-positive."""
    last = -1.0
    for _ in range(max_events):
        t = next_time(F, K)
        if t == np.inf:
            break
        due = t + rel_t * t
        n_out = finish(P, S, F, t, rel_t, rel_d)
        changed = n_out > 0
        for k in range(n_out):
            f = F.out[k]
            _push(K, t + D.lat[f], f, ARRIVE)
            _left(D, K, f, t)
        while K.counts[0] > 0 and K.hkey[0] <= due:
            v = K.hval[0]
            K.counts[0] = heap_pop(K.hkey, K.hval, K.counts[0])
            i = v >> 1
            if v & 1 == ARRIVE:
                K.arrive[i] = t
                K.counts[1] += 1
                for k in range(D.rev_ptr[i], D.rev_ptr[i + 1]):
                    j = D.rev_idx[k]
                    D.remaining[j] -= 1
                    if D.remaining[j] == 0:
                        _ready(D, K, j, t)
            else:
                K.start[i] = t
                if D.moves[i]:
                    join_one(P, S, F, i, t)
                    changed = True
                else:
                    _push(K, t + D.lat[i], i, ARRIVE)
                    _left(D, K, i, t)
        if changed:
            n = solve(P, S, t)
            if n < 0:
                K.counts[4] = 1
                return t
            K.counts[3] += n
            rekey(P, S, F)
        K.counts[2] += 1
        last = t
    return last
