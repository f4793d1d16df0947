"""Flows in progress on their paths: when each one's last byte leaves.

Every flow of a path has the same rate at every instant (:mod:`emulator.maxmin`), so each
path keeps one counter, the bytes sent per flow since it became active (``sent``), and a
flow that joins with ``size`` bytes finishes when that counter reaches its *threshold*
``sent + size`` (the virtual-time idea of fair queuing). A path's flows wait in a list
sorted by threshold; an indexed heap over paths holds each path's next finish time, updated
only for the paths whose rate an event re-solved. An event therefore costs in proportion to
the flows that start, finish or change rate, not to the flows in progress.

Finishing is batched by a rule with two relative tolerances: a flow whose last byte leaves at
``fin`` may finish at the current time ``t`` when ``fin - t <= rel_t * t + rel_d * (fin -
start)``. The exact engine uses ``rel_t = 1e-12`` (the same byte count at the same rate
computed through different float paths) and ``rel_d = 0``, and every flow within that window
finishes. The approximate mode adds ``rel_d``: flows are taken in order of finish time while
they satisfy the rule (it permits finishing early, it does not oblige: scanning further would
cost every event all it could group), so a flow leaves at most that fraction of its own
duration early.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._jit import kernel
from .maxmin import Paths, State, advance, change

__all__ = ["Flows", "new_flows", "join", "join_one", "finish", "rekey", "next_finish"]


class Flows(NamedTuple):
    path: np.ndarray       # (n,) int64: path of each transfer
    size: np.ndarray       # (n,) float64: bytes
    start: np.ndarray      # (n,) float64: when the flow joined (s)
    thr: np.ndarray        # (n,) float64: its path's ``sent`` when its last byte leaves
    nxt: np.ndarray        # (n,) int64: next flow of the path by threshold (-1: none)
    head: np.ndarray       # (P,) int64: first flow of each path (-1: none)
    hkey: np.ndarray       # (P,) float64: indexed heap of next finish times (s)...
    hval: np.ndarray       # (P,) int64: ...of these paths
    hpos: np.ndarray       # (P,) int64: position of each path in the heap (-1: absent)
    hsize: np.ndarray      # (1,) int64
    out: np.ndarray        # (n,) int64: flows that finished in the last call of finish


def new_flows(path: np.ndarray, size: np.ndarray, n_paths: int) -> Flows:
    n = len(path)
    return Flows(path=np.ascontiguousarray(path, dtype=np.int64),
                 size=np.ascontiguousarray(size, dtype=np.float64), start=np.zeros(n),
                 thr=np.zeros(n), nxt=np.full(n, -1, dtype=np.int64),
                 head=np.full(n_paths, -1, dtype=np.int64), hkey=np.zeros(n_paths),
                 hval=np.zeros(n_paths, dtype=np.int64),
                 hpos=np.full(n_paths, -1, dtype=np.int64), hsize=np.zeros(1, dtype=np.int64),
                 out=np.zeros(n, dtype=np.int64))


# -- an indexed min-heap of paths by finish time ---------------------------------------------
@kernel(allocates=False)
def _less(F, i, j):
    a, b = F.hkey[i], F.hkey[j]
    return a < b or (a == b and F.hval[i] < F.hval[j])


@kernel(allocates=False)
def _swap(F, i, j):
    F.hkey[i], F.hkey[j] = F.hkey[j], F.hkey[i]
    F.hval[i], F.hval[j] = F.hval[j], F.hval[i]
    F.hpos[F.hval[i]] = i
    F.hpos[F.hval[j]] = j


@kernel(allocates=False)
def _sift(F, i):
    n = F.hsize[0]
    while i > 0 and _less(F, i, (i - 1) >> 1):
        _swap(F, i, (i - 1) >> 1)
        i = (i - 1) >> 1
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _less(F, c + 1, c):
            c += 1
        if not _less(F, c, i):
            break
        _swap(F, i, c)
        i = c


@kernel(allocates=False)
def _heap_set(F, p, key):
    """Insert path ``p`` with ``key`` or move it there."""
    i = F.hpos[p]
    if i < 0:
        i = F.hsize[0]
        F.hsize[0] = i + 1
        F.hval[i] = p
        F.hpos[p] = i
    F.hkey[i] = key
    _sift(F, i)


@kernel(allocates=False)
def _heap_remove(F, p):
    i = F.hpos[p]
    if i < 0:
        return
    last = F.hsize[0] - 1
    F.hsize[0] = last
    F.hpos[p] = -1
    if i != last:
        F.hkey[i] = F.hkey[last]
        F.hval[i] = F.hval[last]
        F.hpos[F.hval[i]] = i
        _sift(F, i)


@kernel(allocates=False)
def next_finish(F):
    """When the next flow's last byte leaves (s); inf when no flow is in progress."""
    return F.hkey[0] if F.hsize[0] > 0 else np.inf


# -- events -----------------------------------------------------------------------------------
@kernel(allocates=False)
def join_one(P: Paths, S: State, F: Flows, f, t):
    """Flow ``f`` (a transfer index) starts at ``t`` (s) on its path."""
    p = F.path[f]
    change(P, S, p, 1, t)          # brings S.sent[p] to t
    F.start[f] = t
    thr = S.sent[p] + F.size[f]
    F.thr[f] = thr
    prev = -1
    cur = F.head[p]
    while cur >= 0 and F.thr[cur] <= thr:
        prev = cur
        cur = F.nxt[cur]
    F.nxt[f] = cur
    if prev < 0:
        F.head[p] = f
    else:
        F.nxt[prev] = f


@kernel(allocates=False)
def join(P: Paths, S: State, F: Flows, idx, t):
    """Flows ``idx`` (transfer indices) start at ``t`` (s) on their paths."""
    for k in range(len(idx)):
        join_one(P, S, F, idx[k], t)


@kernel(allocates=False)
def finish(P: Paths, S: State, F: Flows, t, rel_t, rel_d):
    """Flows due at ``t`` (module docstring) leave their paths, in order of finish time
    while the rule holds; returns how many (listed first in ``F.out``). A path left with
    flows is out of the heap until :func:`rekey` after the solve (it changed)."""
    n_out = 0
    while F.hsize[0] > 0:
        p = F.hval[0]
        key = F.hkey[0]
        f = F.head[p]
        if key - t > rel_t * t + rel_d * (key - F.start[f]):
            break
        _heap_remove(F, p)
        advance(P, S, p, t)
        base = F.thr[f]
        while F.head[p] >= 0:
            f = F.head[p]
            fin = key + (F.thr[f] - base) / S.rate[p]
            if fin - t > rel_t * t + rel_d * (fin - F.start[f]):
                break
            F.head[p] = F.nxt[f]
            F.out[n_out] = f
            n_out += 1
            change(P, S, p, -1, t)
    return n_out


@kernel(allocates=False)
def rekey(P: Paths, S: State, F: Flows):
    """Finish times of the paths the last solve re-rated."""
    for k in range(S.counters[2]):
        p = S.paths[k]
        f = F.head[p]
        if f >= 0:
            _heap_set(F, p, S.mark[p] + (F.thr[f] - S.sent[p]) / S.rate[p])
