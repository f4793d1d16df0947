"""The hops of NCCL's trees as arrays, for the Tree closed form (:func:`.cost.tree_time`).

Per ring's channel, NCCL's two trees (:func:`.channels.channel_trees`): every tree edge's hop
per direction (up to the root, down from it) and the shared rates of the first chunk's hops
and of both phases' hops at once; independent of size and protocol, so kept with the rings.

The first chunk crosses a tree one level at a time: up, an edge's hop runs at the height of
its child (leaves first); down, at the depth of its parent. So its hops share links with the
other trees' hops of the same phase and level, not with every hop of the phase (on several
nodes that over-counted sharing by up to 2x). The chunks after it keep every hop of both
phases busy at once.

On 8,192 GPUs that is 262,000 hops; :func:`.hoptable.hop_table` takes those inside a machine
per kind of machine (9 s of Python objects per hop before, on the 2-core machine).
"""
from __future__ import annotations

import numpy as np

from .channels import channel_trees
from .hoptable import hop_table, shared_rates
from .system import NcclSystem

__all__ = ["tree_arrays"]


def tree_arrays(system: NcclSystem, rings: list) -> list:
    """Per ring, per tree of its channel, the tree's edges as arrays: each non-root rank's
    parent (index into the tree's ranks, parents first), its level groups, the leaves, and
    per direction the hop's latency (s), inflation, network flag and the first chunk's and
    the steady state's shared rates (bytes/s). Kept with the rings.

    Examples
    --------
    >>> import topologies
    >>> from .channels import channel_rings
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_a100x2"), range(16))
    >>> parent, levels, leaves, up, down = tree_arrays(s, channel_rings(s))[0][0]
    >>> len(parent), int(leaves.sum()), len(up), bool(up[2].any())   # 15 edges, 2 chains
    (15, 2, 5, True)
    """
    return system.kept("tree_arrays", tuple(rings), lambda: _make(system, rings))


def _shape(tree) -> tuple:
    """``(order, parent positions, depth per position, height per position)`` of ``tree``:
    its ranks parents first (breadth first, children in sending order)."""
    order = [tree.root]
    children = tree.children
    for x in order:
        order.extend(children.get(x, ()))
    pos = {r: k for k, r in enumerate(order)}
    up = tree.parent
    par = [pos[up[a]] for a in order[1:]]
    # the walks over Python ints: indexing arrays element by element costs 5x (65,536 ranks)
    depth = [0] * len(order)
    for k, pk in enumerate(par, start=1):          # parents come first
        depth[k] = depth[pk] + 1
    height = [0] * len(order)
    for k in range(len(order) - 1, 0, -1):         # children come after their parent
        pk = par[k - 1]
        if height[k] + 1 > height[pk]:
            height[pk] = height[k] + 1
    return (order, np.array(par, dtype=np.int64), np.array(depth, dtype=np.int64),
            np.array(height, dtype=np.int64))


def _make(system: NcclSystem, rings: list) -> list:
    gpu = system.gpu
    shapes, down, flows, lv_down, lv_up = [], [], [], [], []
    for rg in rings:
        shapes.append([])
        for tree in channel_trees(system, rg):
            order, parent, depth, height = _shape(tree)
            stops = tree.stops
            for k, a in enumerate(order[1:]):
                up = tree.parent[a]
                st = stops[(up, a)]
                down.append(st if st[0] == gpu(up) else tuple(reversed(st)))
            flows.extend([tree.flow] * (len(order) - 1))
            lv_down.append(depth[parent])
            lv_up.append(height[1:])
            shapes[-1].append((tree, order, parent, depth))
    t_down = hop_table(system, down, flows)
    t_up = hop_table(system, [st[::-1] for st in down], flows)
    first_up, = shared_rates([t_up], [np.concatenate(lv_up)] if lv_up else None)
    first_down, = shared_rates([t_down], [np.concatenate(lv_down)] if lv_down else None)
    both_up, both_down = shared_rates([t_up, t_down])
    cols = {"up": (t_up.latency, t_up.inflation, t_up.net, first_up, both_up),
            "down": (t_down.latency, t_down.inflation, t_down.net, first_down, both_down)}
    out, at = [], 0
    for ring_shapes in shapes:
        out.append([])
        for tree, order, parent, depth in ring_shapes:
            e = len(parent)
            facts = {name: tuple(np.asarray(c[at:at + e], dtype=float if k != 2 else bool)
                                 for k, c in enumerate(cs)) for name, cs in cols.items()}
            at += e
            levels = [np.flatnonzero(depth[1:] == d) for d in range(1, int(depth.max()) + 1)]
            leaves = np.array([not tree.children.get(r) for r in order])
            out[-1].append((parent, levels, leaves, facts["up"], facts["down"]))
    return out
