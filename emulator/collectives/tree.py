"""Tree algorithms: NCCL's double binary tree allreduce and a binomial-tree broadcast.

Double binary tree (Sanders, Speck & Traeff 2009; NCCL 2.4, src/graph/trees.cc): two binary
trees over the ranks such that a rank is an inner node of at most one of them; each tree
reduces and then broadcasts half of the vector, pipelined in chunks. Tree 0 is the in-order
tree given by the lowest set bit of the position; tree 1 is its mirror (p even) or its shift
by one (p odd), as NCCL builds them.
"""
from __future__ import annotations

import numpy as np

from ._builder import Builder
from ._schedule import split


def btree(p: int) -> tuple[list[int], list[list[int]]]:
    """Parent and children of each position 0..p-1 in the in-order binary tree.

    Position 0 is the root with one child (the highest power of two below p); a position
    with lowest set bit ``bit`` has parent ``(x ^ bit) | (bit << 1)`` (or ``x ^ bit`` if that
    is out of range) and children ``x - bit/2`` and the largest ``x + bit/2**j`` below p.
    """
    parent = [-1] * p
    children: list[list[int]] = [[] for _ in range(p)]
    for x in range(1, p):
        bit = x & -x
        up = (x ^ bit) | (bit << 1)
        if up >= p:
            up = x ^ bit
        parent[x] = up
    for x in range(1, p):
        children[parent[x]].append(x)
    for c in children:
        c.sort()
    return parent, children


def double_btree(p: int):
    """The two trees as (parent, children) lists over positions."""
    parent0, children0 = btree(p)
    m = (lambda x: p - 1 - x) if p % 2 == 0 else (lambda x: (x + 1) % p)
    parent1 = [-1] * p
    children1: list[list[int]] = [[] for _ in range(p)]
    for x in range(p):
        if parent0[x] >= 0:
            parent1[m(x)] = m(parent0[x])
            children1[m(parent0[x])].append(m(x))
    for c in children1:
        c.sort()
    return (parent0, children0), (parent1, children1)


def _depth_order(parent):
    p = len(parent)
    depth = [0] * p
    for x in range(p):
        d, y = 0, x
        while parent[y] >= 0:
            y, d = parent[y], d + 1
        depth[x] = d
    return sorted(range(p), key=lambda x: (depth[x], x))


def tree_allreduce_pass(b: Builder, order, tree, chunk_bytes: np.ndarray):
    """Reduce up then broadcast down one tree, chunk by chunk; returns down ids per position."""
    parent, children = tree
    order = np.asarray(order, dtype=np.int64)
    p = len(order)
    c = len(chunk_bytes)
    top_down = _depth_order(parent)
    none = np.full(c, -1, dtype=np.int64)
    up: dict[int, np.ndarray] = {}
    # Leaves first: a position sends chunk i up once all its children's chunk i arrived.
    for x in reversed(top_down):
        if parent[x] < 0:
            continue
        deps = [up[ch] for ch in children[x]]
        base = b.count
        conn = np.where(np.arange(c) > 0, base + np.arange(c) - 1, -1)
        up[x] = b.add(order[x], order[parent[x]], chunk_bytes, deps + [conn], "reduce")
    root = next(x for x in range(p) if parent[x] < 0)
    have = {root: [up[ch] for ch in children[root]]}  # root holds chunk i when all arrived
    down: dict[int, np.ndarray] = {}
    for x in top_down:
        if parent[x] >= 0:
            have[x] = [down[x]]
        for ch in children[x]:
            base = b.count
            conn = np.where(np.arange(c) > 0, base + np.arange(c) - 1, -1)
            down[ch] = b.add(order[x], order[ch], chunk_bytes, have[x] + [conn], "broadcast")
    return down if down else {root: none}


def allreduce(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Double binary tree allreduce: each tree carries half the bytes, in ``chunks`` chunks."""
    b = Builder()
    p = len(ranks)
    if p >= 2:
        halves = split(nbytes, 2)
        for tree, half in zip(double_btree(p), halves):
            tree_allreduce_pass(b, ranks, tree, split(half, chunks))
    return b.build(ranks, "allreduce", "tree", nbytes, chunks)


def binomial(p: int) -> list[list[int]]:
    """Children of each position of a binomial tree rooted at 0, in sending order.

    Position x receives from x minus its lowest set bit and sends to x + 2**j for the j
    below that bit, the largest subtree first (MPICH's order).
    """
    children: list[list[int]] = [[] for _ in range(p)]
    top = 1
    while top < p:
        top <<= 1
    for x in range(p):
        low = (x & -x) if x else top
        mask = low >> 1
        while mask:
            if x + mask < p:
                children[x].append(x + mask)
            mask >>= 1
    return children


def broadcast(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Binomial-tree broadcast from ``ranks[0]``, pipelined in chunks.

    A position sends to one child at a time (all chunks to the first child, then to the
    next); chunk i leaves once it has arrived from the parent.
    """
    b = Builder()
    order = np.asarray(ranks, dtype=np.int64)
    p, c = len(order), chunks
    sizes = split(nbytes, c)
    got: dict[int, np.ndarray] = {0: np.full(c, -1, dtype=np.int64)}
    kids = binomial(p)
    # Breadth order by position works: a parent's position is always smaller than its child's.
    for x in range(p):
        prev_last = -1
        for ch in kids[x]:
            base = b.count
            conn = np.concatenate([[prev_last], base + np.arange(c - 1)]).astype(np.int64)
            got[ch] = b.add(order[x], order[ch], sizes, [got[x], conn], "broadcast")
            prev_last = int(got[ch][-1])
    return b.build(ranks, "broadcast", "tree", nbytes, chunks)
