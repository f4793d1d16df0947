"""The dragonfly of Kim, Dally, Scott & Abts (ISCA 2008).

``groups`` groups of ``routers`` routers each; routers of a group are fully connected (local
links); each router has ``global_links`` global links, and every pair of groups is joined by one
global link; each router serves ``hosts`` GPUs. The balanced maximum size is
groups = routers * global_links + 1 (the default).
"""
from __future__ import annotations

import networkx as nx

from ._graph import (DEFAULT_BANDWIDTH, DEFAULT_LATENCY, add_gpu, add_link, add_node,
                     check_int, check_link, check_positive, new_graph)
from .errors import SpecError


def dragonfly(groups: int | None = None, routers: int = 4, hosts: int = 2,
              global_links: int = 2, *, bandwidth: float = DEFAULT_BANDWIDTH,
              global_bandwidth: float | None = None, latency: float = DEFAULT_LATENCY,
              global_latency: float | None = None, link: str = "generic") -> nx.Graph:
    """A dragonfly with one global link between every pair of groups.

    Parameters
    ----------
    groups : int, optional
        Number of groups, 2 .. routers * global_links + 1 (default: the maximum).
    routers : int
        Routers per group ("a"), fully connected inside the group.
    hosts : int
        GPUs per router ("p").
    global_links : int
        Global ports per router ("h").
    bandwidth, latency : float
        Bytes/s per direction and seconds of host and local links.
    global_bandwidth, global_latency : float, optional
        Of the global links (default: as local; long optical cables have more latency).
    link : str
        Link class name.

    Notes
    -----
    The global link between groups i and j leaves group i from router q // global_links,
    where q = j if j < i else j - 1 (the "consecutive" arrangement), so global ports are filled
    in order. GPU ranks run group-major, then router, then host. Links:
    groups * (routers*(routers-1)/2 + routers*hosts) + groups*(groups-1)/2.
    """
    fam = "dragonfly"
    routers = check_int(fam, "routers", routers, 1)
    hosts = check_int(fam, "hosts", hosts, 1)
    global_links = check_int(fam, "global_links", global_links, 1)
    most = routers * global_links + 1
    groups = most if groups is None else check_int(fam, "groups", groups, 2)
    if groups > most:
        raise SpecError(f"{fam}: groups={groups} needs more global ports than routers * "
                        f"global_links = {routers * global_links} per group (at most {most})")
    bandwidth = check_positive(fam, "bandwidth", bandwidth)
    latency = check_positive(fam, "latency", latency)
    global_bandwidth = check_positive(fam, "global_bandwidth",
                                      bandwidth if global_bandwidth is None else global_bandwidth)
    global_latency = check_positive(fam, "global_latency",
                                    latency if global_latency is None else global_latency)
    link = check_link(fam, link)
    G = new_graph(f"dragonfly:groups={groups},routers={routers},hosts={hosts},"
                  f"global_links={global_links}")
    rank = 0
    for g in range(groups):
        for r in range(routers):
            add_node(G, f"g{g}.r{r}", "switch", group=g)
        for r in range(routers):
            for s in range(r + 1, routers):
                add_link(G, f"g{g}.r{r}", f"g{g}.r{s}", bandwidth, latency, link)
            for _ in range(hosts):
                add_gpu(G, f"gpu{rank}", rank)
                add_link(G, f"gpu{rank}", f"g{g}.r{r}", bandwidth, latency, link)
                rank += 1
    for i in range(groups):
        for j in range(i + 1, groups):
            ri = (j - 1) // global_links      # port j-1 of group i (j > i)
            rj = i // global_links            # port i of group j (i < j)
            add_link(G, f"g{i}.r{ri}", f"g{j}.r{rj}", global_bandwidth, global_latency, link,
                     scope="global")
    return G
