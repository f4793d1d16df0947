"""The figures every user asks first: GPUs, links, bandwidths, bisection, diameter."""
from __future__ import annotations

from collections import Counter

import networkx as nx
import numpy as np

from ._graph import gpus, peel_leaves
from .errors import ValidationError

#: Largest core (nodes left after peeling hanging trees) searched exhaustively with scipy's
#: C breadth-first search; bigger cores use networkx's eccentricity bounding (Takes & Kosters),
#: fast on clusters whose eccentricities differ, slow only on huge vertex-transitive graphs.
EXHAUSTIVE_CORE = 6000


def diameter(G: nx.Graph) -> int:
    """The hop diameter of ``G``: the most hops on a shortest (in hops) path between any nodes.

    Trees hanging off the graph (hosts on an edge switch, NICs of a lone box) are peeled
    first: a pair in two such trees is as far apart as their anchors plus the trees' heights,
    so only the core (e.g. the 1280 switches of a k=32 fat tree, not its 9472 nodes) is
    searched, exhaustively with scipy's breadth-first search while it is small.

    Raises
    ------
    ValidationError
        If ``G`` is not connected.
    """
    names = list(G)
    n = len(names)
    if n <= 1:
        return 0
    index = {v: i for i, v in enumerate(names)}
    adj = [[index[u] for u in G[v] if u != v] for v in names]
    peeled, core = peel_leaves(adj)
    down1, down2 = [0] * n, [0] * n     # two largest (child height + 1) over peeled children
    local = 0                           # longest path inside one anchor's hanging trees
    for v, u in peeled:                 # children are peeled before their parents
        local = max(local, down1[v] + down2[v])
        h = down1[v] + 1
        if h > down1[u]:
            down1[u], down2[u] = h, down1[u]
        elif h > down2[u]:
            down2[u] = h
    kept = [i for i in range(n) if core[i]]
    for u in kept:
        local = max(local, down1[u] + down2[u])
    if len(kept) == 1:
        return local
    if not nx.is_connected(G):
        raise ValidationError("topology is not connected: its diameter is infinite")
    if len(kept) > EXHAUSTIVE_CORE:
        return int(nx.diameter(G, usebounds=True))
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    pos = {v: k for k, v in enumerate(kept)}
    rows, cols = [], []
    for v in kept:
        for u in adj[v]:
            if core[u]:
                rows.append(pos[v])
                cols.append(pos[u])
    m = len(kept)
    A = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(m, m))
    height = np.array([down1[v] for v in kept], dtype=float)
    best = local
    step = max(1, 2_000_000 // m)
    for start in range(0, m, step):
        idx = np.arange(start, min(m, start + step))
        d = shortest_path(A, directed=False, unweighted=True, indices=idx)
        d += height[idx, None] + height[None, :]
        d[np.arange(len(idx)), idx] = -np.inf   # u == v is the local case above
        best = max(best, int(d.max()))
    return best


def bisection_bandwidth(G: nx.Graph) -> float:
    """Bytes/s (per direction) that can cross between the two rank halves of ``G``.

    The halves are ranks [0, N/2) and [N/2, N) (N odd: the first half is the smaller). The
    value is the minimum cut between them with link ``bandwidth`` as capacity (max-flow
    min-cut: the most the first half can send to the second at once), so it is the bisection
    of the rank order the collectives use, not the minimum over all balanced cuts (NP-hard);
    for the symmetric fabrics here the two agree. Switches, NICs and CPUs may fall on either
    side of the cut. 0.0 with fewer than two GPUs.
    """
    order = gpus(G)
    n = len(order)
    if n < 2:
        return 0.0
    H = nx.Graph()
    H.add_edges_from((a, b, {"capacity": d["bandwidth"]}) for a, b, d in G.edges(data=True))
    src, dst = ("__bisection__", 0), ("__bisection__", 1)
    # Edges without a capacity attribute have infinite capacity in networkx flows.
    H.add_edges_from((src, g) for g in order[: n // 2])
    H.add_edges_from((dst, g) for g in order[n // 2:])
    return float(nx.minimum_cut_value(H, src, dst, capacity="capacity"))


def summary(G: nx.Graph) -> dict:
    """Headline figures of a topology.

    Returns
    -------
    dict
        ``name``; counts ``gpus``, ``nodes``, ``links``, ``switches``, ``nics``, ``cpus``;
        ``total_bandwidth`` (sum over links, bytes/s per direction); ``bisection_bandwidth``
        (bytes/s, see :func:`bisection_bandwidth`); ``diameter`` (hops, the longest shortest
        path between any two nodes); ``links_by_class`` and ``bandwidth_by_class`` (count and
        summed bytes/s per link class); ``min_link_bandwidth``/``max_link_bandwidth`` (bytes/s)
        and ``min_link_latency``/``max_link_latency`` (s).
    """
    kinds = Counter(d.get("kind") for _, d in G.nodes(data=True))
    by_class: Counter = Counter()
    bw_class: Counter = Counter()
    bws, lats = [], []
    for _, _, d in G.edges(data=True):
        cls = d.get("link", "generic")
        by_class[cls] += 1
        bw_class[cls] += d["bandwidth"]
        bws.append(d["bandwidth"])
        lats.append(d["latency"])
    return {
        "name": G.graph.get("name", ""),
        "gpus": kinds.get("gpu", 0),
        "nodes": G.number_of_nodes(),
        "links": G.number_of_edges(),
        "switches": kinds.get("switch", 0),
        "nics": kinds.get("nic", 0),
        "cpus": kinds.get("cpu", 0),
        "total_bandwidth": float(sum(bws)),
        "bisection_bandwidth": bisection_bandwidth(G),
        "diameter": diameter(G),
        "links_by_class": dict(sorted(by_class.items())),
        "bandwidth_by_class": {k: float(v) for k, v in sorted(bw_class.items())},
        "min_link_bandwidth": min(bws) if bws else 0.0,
        "max_link_bandwidth": max(bws) if bws else 0.0,
        "min_link_latency": min(lats) if lats else 0.0,
        "max_link_latency": max(lats) if lats else 0.0,
    }
