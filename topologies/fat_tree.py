"""The k-ary fat tree of Al-Fares, Loukissas & Vahdat (SIGCOMM 2008).

k pods, each with k/2 edge and k/2 aggregation switches; (k/2)**2 core switches. Each edge
switch serves k/2 hosts and links to every aggregation switch of its pod; aggregation switch i
of every pod links to core switches i*k/2 .. (i+1)*k/2 - 1. Hence k**3/4 hosts, 5k**2/4
switches and 3k**3/4 links, full bisection bandwidth with identical links, and k**2/4
equal-cost paths between hosts of different pods.
"""
from __future__ import annotations

import networkx as nx

from ._graph import (DEFAULT_BANDWIDTH, DEFAULT_LATENCY, add_gpu, add_link, add_node,
                     check_int, check_link, check_positive, new_graph)
from .errors import SpecError


def check_k(family: str, k) -> int:
    k = check_int(family, "k", k, 2)
    if k % 2:
        raise SpecError(f"{family}: k={k} must be even (k/2 ports up, k/2 down)")
    return k


def build_fat_tree_fabric(G: nx.Graph, k: int, bandwidth: float, latency: float,
                          link: str) -> list[str]:
    """Add the switches and switch-to-switch links of a k-ary fat tree to ``G``.

    Returns
    -------
    list of str
        ``slots[h]`` is the edge switch that host ``h`` (0 .. k**3/4 - 1) attaches to.
    """
    half = k // 2
    for c in range(half * half):
        add_node(G, f"core{c}", "switch", tier="core")
    slots = []
    for p in range(k):
        for i in range(half):
            add_node(G, f"pod{p}.agg{i}", "switch", tier="aggregation", pod=p)
            for j in range(half):
                add_link(G, f"pod{p}.agg{i}", f"core{i * half + j}", bandwidth, latency, link)
        for e in range(half):
            edge = f"pod{p}.edge{e}"
            add_node(G, edge, "switch", tier="edge", pod=p)
            for i in range(half):
                add_link(G, edge, f"pod{p}.agg{i}", bandwidth, latency, link)
            slots.extend([edge] * half)
    return slots


def fat_tree(k: int, *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY,
             link: str = "generic") -> nx.Graph:
    """A k-ary fat tree with one GPU per host port: k**3/4 GPUs.

    Parameters
    ----------
    k : int
        Switch radix, even, >= 2 (k = 32 gives 8192 GPUs, 1280 switches).
    bandwidth : float
        Bytes/s per direction of every link (hosts and switches alike: non-blocking).
    latency : float
        Seconds per link.
    link : str
        Link class name.

    Returns
    -------
    nx.Graph
        GPU ``gpu{r}`` hangs off edge switch ``pod{p}.edge{e}`` with p = r // (k**2/4) and
        e = (r // (k/2)) mod (k/2); switches carry ``tier`` and ``pod``.
    """
    k = check_k("fat_tree", k)
    bandwidth = check_positive("fat_tree", "bandwidth", bandwidth)
    latency = check_positive("fat_tree", "latency", latency)
    link = check_link("fat_tree", link)
    G = new_graph(f"fat_tree:k={k}")
    slots = build_fat_tree_fabric(G, k, bandwidth, latency, link)
    for r, edge in enumerate(slots):
        add_gpu(G, f"gpu{r}", r)
        add_link(G, f"gpu{r}", edge, bandwidth, latency, link)
    return G
