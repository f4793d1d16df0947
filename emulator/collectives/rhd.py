"""Recursive halving-doubling allreduce (Rabenseifner; Thakur, Rabenseifner & Gropp 2005).

Reduce-scatter by recursive halving (log2 q rounds; in round k partners at distance q/2**(k+1)
swap halves of what they still own), then allgather by recursive doubling (the same rounds
backwards). A rank count p that is not a power of two is reduced to q = 2**floor(log2 p) first
(section 4.1 of the paper): the first 2(p - q) positions pair up, the even one of each pair
sends its whole vector to the odd one and gets the result back at the end.

An exchange between partners starts when both have finished the previous round (a
rendezvous, as MPI_Sendrecv), so partners' messages overlap only with each other.
"""
from __future__ import annotations

import numpy as np

from ._builder import Builder
from ._schedule import split


def _exchange(b, order, pairs, sizes, ready, chunks, tag):
    """Partners swap ``sizes[a]`` bytes, each message in ``chunks`` pieces; returns receive ids.

    pairs: list of (a, partner); ready[a]: ids a waits for (both ends' previous round).
    """
    got = {}
    for a, q in pairs:
        deps_first = list(ready[a]) + list(ready[q])
        pieces = split(sizes[a], chunks)
        base = b.count
        conn = np.concatenate([[-1], base + np.arange(chunks - 1)]).astype(np.int64)
        cols = [conn] + [np.concatenate([[d], np.full(chunks - 1, -1)]).astype(np.int64)
                         for d in deps_first]
        ids = b.add(order[a], order[q], pieces, cols, tag)
        got[q] = ids[-1]
    return got


def allreduce(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Rabenseifner allreduce over any number of ranks (see the module docstring)."""
    b = Builder()
    order = np.asarray(ranks, dtype=np.int64)
    p = len(order)
    if p >= 2:
        q = 1 << (p.bit_length() - 1)
        extra = p - q
        ready = {x: [] for x in range(p)}
        if extra:
            got = _exchange(b, order, [(2 * i, 2 * i + 1) for i in range(extra)],
                            {2 * i: nbytes for i in range(extra)}, ready, chunks, "pre")
            for x, last in got.items():
                ready[x] = [last]
        active = [2 * i + 1 for i in range(extra)] + list(range(2 * extra, p))
        segs = split(nbytes, q)
        csum = np.concatenate([[0], np.cumsum(segs)])
        lo = {a: 0 for a in range(q)}
        hi = {a: q for a in range(q)}
        history = []
        dist = q >> 1
        while dist:
            pairs, sizes, keep = [], {}, {}
            for a in range(q):
                partner = a ^ dist
                mid = (lo[a] + hi[a]) // 2
                # The lower partner keeps the lower half and sends the upper one.
                send = (mid, hi[a]) if a < partner else (lo[a], mid)
                keep[a] = (lo[a], mid) if a < partner else (mid, hi[a])
                pairs.append((active[a], active[partner]))
                sizes[active[a]] = int(csum[send[1]] - csum[send[0]])
            got = _exchange(b, order, pairs, sizes, ready, chunks, "reduce_scatter")
            history.append(dist)
            for a in range(q):
                lo[a], hi[a] = keep[a]
                ready[active[a]] = [got[active[a]]]
            dist >>= 1
        for dist in reversed(history):
            pairs, sizes = [], {}
            for a in range(q):
                partner = a ^ dist
                pairs.append((active[a], active[partner]))
                sizes[active[a]] = int(csum[hi[a]] - csum[lo[a]])
            got = _exchange(b, order, pairs, sizes, ready, chunks, "allgather")
            new = {}
            for a in range(q):
                partner = a ^ dist
                new[a] = (min(lo[a], lo[partner]), max(hi[a], hi[partner]))
            for a in range(q):
                lo[a], hi[a] = new[a]
                ready[active[a]] = [got[active[a]]]
        if extra:
            _exchange(b, order, [(2 * i + 1, 2 * i) for i in range(extra)],
                      {2 * i + 1: nbytes for i in range(extra)}, ready, chunks, "post")
    return b.build(ranks, "allreduce", "rhd", nbytes, chunks)
