"""A two-tier leaf-spine (folded Clos) fabric with an oversubscription ratio."""
from __future__ import annotations

import networkx as nx

from ._graph import (DEFAULT_BANDWIDTH, DEFAULT_LATENCY, add_gpu, add_link, add_node,
                     check_int, check_link, check_positive, new_graph)


def uplink_for(hosts_per_leaf: int, spines: int, bandwidth: float,
               oversubscription: float) -> float:
    """Bytes/s per direction of one leaf-to-spine link for a given oversubscription.

    Oversubscription is the ratio of a leaf's host-facing capacity to its spine-facing
    capacity: hosts_per_leaf * bandwidth / (spines * uplink).
    """
    return hosts_per_leaf * bandwidth / (oversubscription * spines)


def build_leaf_spine_fabric(G: nx.Graph, leaves: int, spines: int, hosts_per_leaf: int,
                            uplink_bandwidth: float, latency: float, link: str,
                            prefix: str = "") -> list[str]:
    """Add ``leaves`` leaf and ``spines`` spine switches, every leaf linked to every spine.

    Returns
    -------
    list of str
        ``slots[h]`` is the leaf that host port ``h`` attaches to (h // hosts_per_leaf).
    """
    for s in range(spines):
        add_node(G, f"{prefix}spine{s}", "switch", tier="spine")
    slots = []
    for leaf in range(leaves):
        name = f"{prefix}leaf{leaf}"
        add_node(G, name, "switch", tier="leaf")
        for s in range(spines):
            add_link(G, name, f"{prefix}spine{s}", uplink_bandwidth, latency, link)
        slots.extend([name] * hosts_per_leaf)
    return slots


def leaf_spine(leaves: int, spines: int, hosts_per_leaf: int, *,
               bandwidth: float = DEFAULT_BANDWIDTH, oversubscription: float = 1.0,
               uplink_bandwidth: float | None = None, latency: float = DEFAULT_LATENCY,
               link: str = "generic") -> nx.Graph:
    """GPUs on ``leaves`` leaf switches, every leaf linked to each of ``spines`` spines.

    Parameters
    ----------
    leaves, spines, hosts_per_leaf : int
        Switch counts and GPUs per leaf (>= 1 each). ``leaves * hosts_per_leaf`` GPUs,
        ``leaves * (hosts_per_leaf + spines)`` links.
    bandwidth : float
        Bytes/s per direction of each GPU-to-leaf link.
    oversubscription : float
        Leaf down capacity / leaf up capacity (1 = non-blocking, 3 = 3:1). Sets the
        leaf-to-spine link bandwidth to ``hosts_per_leaf * bandwidth / (oversubscription *
        spines)`` unless ``uplink_bandwidth`` is given.
    uplink_bandwidth : float, optional
        Bytes/s per direction of each leaf-to-spine link (overrides ``oversubscription``).
    latency : float
        Seconds per link.
    link : str
        Link class name.
    """
    fam = "leaf_spine"
    leaves = check_int(fam, "leaves", leaves, 1)
    spines = check_int(fam, "spines", spines, 1)
    hosts_per_leaf = check_int(fam, "hosts_per_leaf", hosts_per_leaf, 1)
    bandwidth = check_positive(fam, "bandwidth", bandwidth)
    oversubscription = check_positive(fam, "oversubscription", oversubscription)
    latency = check_positive(fam, "latency", latency)
    link = check_link(fam, link)
    if uplink_bandwidth is None:
        uplink_bandwidth = uplink_for(hosts_per_leaf, spines, bandwidth, oversubscription)
    uplink_bandwidth = check_positive(fam, "uplink_bandwidth", uplink_bandwidth)
    name = f"leaf_spine:leaves={leaves},spines={spines},hosts={hosts_per_leaf}"
    if oversubscription != 1.0:
        name += f",oversub={oversubscription:g}"
    G = new_graph(name)
    slots = build_leaf_spine_fabric(G, leaves, spines, hosts_per_leaf, uplink_bandwidth,
                                    latency, link)
    for r, leaf in enumerate(slots):
        add_gpu(G, f"gpu{r}", r)
        add_link(G, f"gpu{r}", leaf, bandwidth, latency, link)
    return G
