"""The figures every user asks first: GPUs, links, bandwidths, bisection, diameter."""
from __future__ import annotations

from collections import Counter

import networkx as nx

from ._graph import gpus


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
        "diameter": nx.diameter(G, usebounds=True) if G.number_of_nodes() > 1 else 0,
        "links_by_class": dict(sorted(by_class.items())),
        "bandwidth_by_class": {k: float(v) for k, v in sorted(bw_class.items())},
        "min_link_bandwidth": min(bws) if bws else 0.0,
        "max_link_bandwidth": max(bws) if bws else 0.0,
        "min_link_latency": min(lats) if lats else 0.0,
        "max_link_latency": max(lats) if lats else 0.0,
    }
