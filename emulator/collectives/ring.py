"""Ring algorithms (Patarasuk & Yuan 2009; NCCL's ring): reduce-scatter, allgather, allreduce.

Positions 0..p-1 follow the order of ``ranks``; position r sends to r+1 (mod p). The
vector is cut into p segments, each into ``chunks`` chunks. At global step k position r
sends chunk i of segment ``(r - k + offset) mod p``. Each transfer waits for

- the data: the same chunk from the previous position at step k-1 (the partial sum or the
  block it forwards), and
- its connection: the previous send on the same connection (chunk i-1, or the last chunk of
  step k-1), as one NCCL connection delivers its slots in order.

So a connection carries one message at a time and, on a ring of links, no two flows ever
share a channel: the time is 2(p-1)(c alpha + n/(p B)) for an allreduce of n bytes when
p*c divides n (:mod:`emulator.closed_form`).
"""
from __future__ import annotations

import numpy as np

from ._builder import Builder
from ._schedule import split, split_each


def segment_chunks(nbytes: int, p: int, chunks: int) -> np.ndarray:
    """(p, chunks) bytes: ``nbytes`` cut into p segments, each into ``chunks`` chunks."""
    return split_each(split(nbytes, p), chunks).T


def ring_pass(b: Builder, order, chunk_bytes: np.ndarray, steps: int, offset: int, tag,
              first_deps=None, *, route=None, scale=None, hop_compute=None,
              start_compute=0.0, ordered: bool = True) -> np.ndarray:
    """Add ``steps`` ring steps; returns ids shaped (steps, p, chunks).

    Parameters
    ----------
    order : sequence of int
        Ranks in ring order (position r sends to r+1 mod p).
    chunk_bytes : ndarray (p, chunks)
        Bytes of chunk i of segment j.
    offset : int
        Position r sends segment (r - k + offset) mod p at step k.
    tag : str or list of (str, int)
        The phase label, or labels with their step counts (summing to ``steps``).
    first_deps : list of ndarray (p,), optional
        Extra dependencies of each position's first transfer (-1 for none).
    route : ndarray (p,) of int, optional
        Route id (:meth:`Builder.route`) of the hop from position r to r+1; default route 0.
    scale : ndarray (p,) of float, optional
        Wire bytes per payload byte on the hop from position r (a protocol's flags, a link's
        unusable share); transfers carry ceil(bytes * scale).
    hop_compute : ndarray (p,) of float, optional
        Seconds before the first chunk of every step on the hop from position r (a protocol's
        per-step latency beyond the path's own).
    start_compute : float
        Extra seconds before each position's very first transfer (a launch latency).
    ordered : bool
        Whether a connection sends one message at a time (each waits for the previous one to
        arrive). False lets a connection have several in flight, as NCCL's 8 buffer slots per
        connection do: a message then waits for its data and for the previous message's last
        byte to leave (``after``: a connection's bytes go out in order, so its messages never
        share a link with each other), and the path latency overlaps the next message.
    """
    order = np.asarray(order, dtype=np.int64)
    p = len(order)
    c = chunk_bytes.shape[1]
    if p < 2 or steps < 1:
        return np.empty((0, p, c), dtype=np.int64)
    nxt = np.roll(order, -1)
    base = b.count
    # Transfer (k, r, i) has id base + (k p + r) c + i. The dependency ids are computed from
    # that formula on broadcast index grids: at 2 million transfers, fancy indexing into an
    # id array (and repeat/tile grids) cost a second where this arithmetic costs ~0.1 s.
    ids = base + np.arange(steps * p * c, dtype=np.int64).reshape(steps, p, c)
    k = np.arange(steps, dtype=np.int64)[:, None, None]
    r = np.arange(p, dtype=np.int64)[None, :, None]
    i = np.arange(c, dtype=np.int64)[None, None, :]
    nbytes = ring_sizes(chunk_bytes, steps, offset, scale)
    compute = 0.0
    if hop_compute is not None or start_compute:
        hc = np.zeros(p) if hop_compute is None else np.asarray(hop_compute, dtype=float)
        compute = (np.where(i == 0, hc[None, :, None], 0.0)
                   + np.where((k == 0) & (i == 0), float(start_compute), 0.0))
        compute = np.broadcast_to(compute, ids.shape).reshape(-1)
    hop_route = 0 if route is None else np.broadcast_to(
        np.asarray(route, dtype=np.int64)[None, :, None], ids.shape).reshape(-1)
    # data: the same chunk from the previous position at step k-1
    data = np.where(k > 0, base + ((k - 1) * p + (r - 1) % p) * c + i, -1)
    # connection: the previous chunk on this connection (chunk i-1, or step k-1's last chunk)
    conn = np.where(i > 0, ids - 1, np.where(k > 0, ids - p * c + (c - 1), -1))
    data, conn = data.reshape(-1), conn.reshape(-1)
    senders = np.broadcast_to(order[None, :, None], ids.shape).reshape(-1)
    receivers = np.broadcast_to(nxt[None, :, None], ids.shape).reshape(-1)
    deps = [data, conn] if ordered else [data]
    after = -1 if ordered else conn
    for extra in first_deps or ():
        # position r's first transfer is id base + r c
        col = np.full(ids.size, -1, dtype=np.int64)
        col[np.arange(p) * c] = np.asarray(extra, dtype=np.int64)
        deps.append(col)
    phases = [(tag, steps)] if isinstance(tag, str) else list(tag)
    lo = 0
    for name, n in phases:
        sl = slice(lo * p * c, (lo + n) * p * c)
        b.add(senders[sl], receivers[sl], nbytes[sl], [d[sl] for d in deps], name,
              compute_s=compute if np.isscalar(compute) else compute[sl],
              route=hop_route if np.isscalar(hop_route) else hop_route[sl],
              after=after if np.isscalar(after) else after[sl])
        lo += n
    if lo != steps:
        raise AssertionError("ring_pass: phase steps do not sum to steps")
    return ids


def ring_sizes(chunk_bytes: np.ndarray, steps: int, offset: int, scale=None) -> np.ndarray:
    """Bytes of the transfers :func:`ring_pass` adds, in the order it adds them (step, position,
    chunk): position r sends chunk i of segment ``(r - k + offset) mod p`` at step k, times
    its hop's ``scale`` rounded up.

    Examples
    --------
    >>> ring_sizes(np.array([[10], [20], [30]]), 2, 0).tolist()
    [10, 20, 30, 30, 10, 20]
    """
    p, c = chunk_bytes.shape
    k = np.arange(steps, dtype=np.int64)[:, None, None]
    r = np.arange(p, dtype=np.int64)[None, :, None]
    i = np.arange(c, dtype=np.int64)[None, None, :]
    nbytes = chunk_bytes[(r - k + offset) % p, i]
    if scale is not None:
        nbytes = np.ceil(nbytes * np.asarray(scale, dtype=float)[None, :, None]).astype(np.int64)
    return np.broadcast_to(nbytes, (steps, p, c)).reshape(-1)


def last_of(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(last receive, last send) transfer id of each position after a :func:`ring_pass`."""
    last = ids[-1, :, -1]
    return np.roll(last, 1), last


def reduce_scatter(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Ring reduce-scatter of ``nbytes`` in total (nccl-tests' size); p-1 steps."""
    b = Builder()
    p = len(ranks)
    # offset -1: after p-1 steps position r holds the full sum of segment r.
    ring_pass(b, ranks, segment_chunks(nbytes, p, chunks), p - 1, -1, "reduce_scatter")
    return b.build(ranks, "reduce_scatter", "ring", nbytes, chunks)


def allgather(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Ring allgather; ``nbytes`` is the gathered total, each rank contributes nbytes/p."""
    b = Builder()
    p = len(ranks)
    ring_pass(b, ranks, segment_chunks(nbytes, p, chunks), p - 1, 0, "allgather")
    return b.build(ranks, "allgather", "ring", nbytes, chunks)


def allreduce_pass(b: Builder, ranks, chunk_bytes, first_deps=None) -> np.ndarray:
    """Reduce-scatter then allgather as one 2(p-1)-step ring; ids (2(p-1), p, chunks).

    Offset -1 all along: position r ends the reduce-scatter owning segment r and starts the
    allgather by sending it, so both phases are one continuous grid of dependencies.
    """
    p = len(ranks)
    return ring_pass(b, ranks, chunk_bytes, 2 * (p - 1), -1,
                     [("reduce_scatter", p - 1), ("allgather", p - 1)], first_deps=first_deps)


def allreduce(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Ring allreduce: reduce-scatter then allgather, 2(p-1) steps of n/p bytes."""
    b = Builder()
    allreduce_pass(b, ranks, segment_chunks(nbytes, len(ranks), chunks))
    return b.build(ranks, "allreduce", "ring", nbytes, chunks)


def broadcast(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Pipelined chain broadcast from ``ranks[0]``: chunk i crosses hop h after hop h-1.

    (p - 1 + c - 1) chunk times of (alpha + n/(c B)) when nothing is shared.
    """
    b = Builder()
    order = np.asarray(ranks, dtype=np.int64)
    p, c = len(order), chunks
    if p >= 2:
        sizes = split(nbytes, c)
        hops = p - 1
        base = b.count
        ids = base + np.arange(hops * c).reshape(hops, c)
        h = np.repeat(np.arange(hops), c)
        i = np.tile(np.arange(c), hops)
        data = np.where(h > 0, ids[np.maximum(h - 1, 0), i], -1)
        conn = np.where(i > 0, ids[h, np.maximum(i - 1, 0)], -1)
        b.add(order[h], order[h + 1], sizes[i], [data, conn], "broadcast")
    return b.build(ranks, "broadcast", "ring", nbytes, chunks)
