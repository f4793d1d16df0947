"""Direct (one-shot, all pairs at once) algorithms: allgather, reduce-scatter, allreduce,
all-to-all, and a parameter server.

Every rank talks to every other rank in one round, so on a non-blocking switch the time is
alpha + (p-1) * m / B for a message of m bytes per pair (each rank's NIC carries p-1
messages at once, sharing its port max-min fairly).
"""
from __future__ import annotations

import numpy as np

from ._builder import Builder
from ._schedule import split


def _pairs(p: int):
    a = np.repeat(np.arange(p), p)
    b = np.tile(np.arange(p), p)
    keep = a != b
    return a[keep], b[keep]


def _gather_pass(b: Builder, order, block_bytes, tag, deps_of_src=None):
    """Every position sends its block (``block_bytes[src]``) to every other; ids (p*(p-1),)."""
    order = np.asarray(order, dtype=np.int64)
    s, d = _pairs(len(order))
    deps = [] if deps_of_src is None else [np.asarray(deps_of_src)[s]]
    return b.add(order[s], order[d], np.asarray(block_bytes, dtype=np.int64)[s], deps, tag), s, d


def allgather(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Direct allgather; ``nbytes`` is the gathered total (nccl-tests), nbytes/p per rank."""
    b = Builder()
    p = len(ranks)
    if p >= 2:
        _gather_pass(b, ranks, split(nbytes, p), "allgather")
    return b.build(ranks, "allgather", "direct", nbytes, chunks)


def reduce_scatter(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Direct reduce-scatter: each rank sends segment j of its vector to rank j."""
    b = Builder()
    p = len(ranks)
    if p >= 2:
        seg = split(nbytes, p)
        order = np.asarray(ranks, dtype=np.int64)
        s, d = _pairs(p)
        b.add(order[s], order[d], seg[d], (), "reduce_scatter")
    return b.build(ranks, "reduce_scatter", "direct", nbytes, chunks)


def allreduce(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Direct reduce-scatter, then direct allgather of the reduced segments."""
    b = Builder()
    p = len(ranks)
    if p >= 2:
        seg = split(nbytes, p)
        order = np.asarray(ranks, dtype=np.int64)
        s, d = _pairs(p)
        rs = b.add(order[s], order[d], seg[d], (), "reduce_scatter")
        # Owner j may send its reduced segment once all p-1 contributions to it arrived.
        inbound = [rs[d == j] for j in range(p)]
        done = np.array([b.local(order[j], [inbound[j][k:k + 1] for k in range(p - 1)],
                                 "reduce")[0] for j in range(p)])
        _gather_pass(b, ranks, seg, "allgather", deps_of_src=done)
    return b.build(ranks, "allreduce", "direct", nbytes, chunks)


def alltoall(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """All-to-all: ``nbytes`` per rank (nccl-tests), nbytes/p to each peer."""
    b = Builder()
    p = len(ranks)
    if p >= 2:
        seg = split(nbytes, p)
        order = np.asarray(ranks, dtype=np.int64)
        s, d = _pairs(p)
        b.add(order[s], order[d], seg[d], (), "alltoall")
    return b.build(ranks, "alltoall", "direct", nbytes, chunks)


def parameter_server(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Allreduce through a parameter server at ``ranks[0]``: every worker pushes its full
    gradient, the server sums, then sends the result back to every worker (Li et al. 2014)."""
    b = Builder()
    order = np.asarray(ranks, dtype=np.int64)
    p = len(order)
    if p >= 2:
        workers = order[1:]
        push = b.add(workers, order[0], int(nbytes), (), "push")
        summed = b.local(order[0], [push[k:k + 1] for k in range(p - 1)], "reduce")
        b.add(np.full(p - 1, order[0]), workers, int(nbytes), [np.full(p - 1, summed[0])], "pull")
    return b.build(ranks, "allreduce", "parameter_server", nbytes, chunks)
