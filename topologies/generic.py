"""Generic topologies: a ring, a fully connected mesh and a single non-blocking switch."""
from __future__ import annotations

import networkx as nx

from ._graph import (DEFAULT_BANDWIDTH, DEFAULT_LATENCY, add_gpu, add_link, add_node,
                     check_int, check_link, check_positive, new_graph)


def ring(n: int, *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY,
         link: str = "generic") -> nx.Graph:
    """``n`` GPUs ``gpu0..gpu{n-1}`` on a bidirectional ring (GPU i linked to GPU i+1 mod n).

    Parameters
    ----------
    n : int
        Number of GPUs, >= 2 (a ring of 2 is a single link: a simple graph has no parallel
        edges).
    bandwidth : float
        Bytes/s per direction of every link.
    latency : float
        Seconds per link.
    link : str
        Link class name.

    Returns
    -------
    nx.Graph
        ``n`` nodes and ``n`` edges (1 edge when ``n == 2``).
    """
    n = check_int("ring", "n", n, 2)
    bandwidth = check_positive("ring", "bandwidth", bandwidth)
    latency = check_positive("ring", "latency", latency)
    link = check_link("ring", link)
    G = new_graph(f"ring:{n}")
    for r in range(n):
        add_gpu(G, f"gpu{r}", r)
    for r in range(n):
        add_link(G, f"gpu{r}", f"gpu{(r + 1) % n}", bandwidth, latency, link)
    return G


def fully_connected(n: int, *, bandwidth: float = DEFAULT_BANDWIDTH,
                    latency: float = DEFAULT_LATENCY, link: str = "generic") -> nx.Graph:
    """``n`` GPUs with a direct link between every pair: n*(n-1)/2 links.

    Parameters are those of :func:`ring`; ``n >= 2``.
    """
    n = check_int("fully_connected", "n", n, 2)
    bandwidth = check_positive("fully_connected", "bandwidth", bandwidth)
    latency = check_positive("fully_connected", "latency", latency)
    link = check_link("fully_connected", link)
    G = new_graph(f"fully_connected:{n}")
    for r in range(n):
        add_gpu(G, f"gpu{r}", r)
    for a in range(n):
        for b in range(a + 1, n):
            add_link(G, f"gpu{a}", f"gpu{b}", bandwidth, latency, link)
    return G


def switch(n: int, *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY,
           link: str = "generic") -> nx.Graph:
    """``n`` GPUs on one non-blocking switch ``sw0``: a star of ``n`` links.

    The switch has no internal limit, so the only bottlenecks are the GPU links
    (``bandwidth`` bytes/s per direction each); a GPU-to-GPU path crosses two links.
    """
    n = check_int("switch", "n", n, 1)
    bandwidth = check_positive("switch", "bandwidth", bandwidth)
    latency = check_positive("switch", "latency", latency)
    link = check_link("switch", link)
    G = new_graph(f"switch:{n}")
    add_node(G, "sw0", "switch")
    for r in range(n):
        add_gpu(G, f"gpu{r}", r)
        add_link(G, f"gpu{r}", "sw0", bandwidth, latency, link)
    return G
