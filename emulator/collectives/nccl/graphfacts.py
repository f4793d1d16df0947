"""How NCCL's topology detection reads a graph: link classes, machines, NICs, path types.

The graph facts :class:`~emulator.collectives.nccl.system.NcclSystem` builds its analysis
from (NCCL src/graph/topo.cc, paths.cc): which links stay inside a machine, which GPUs form a
machine when the graph has no ``host`` attributes, a machine's NICs in NCCL's order, and the
path type (topo.h ``PATH_NVL`` .. ``PATH_SYS``) of a routed path between two GPUs.
"""
from __future__ import annotations

import networkx as nx

#: Link classes inside one machine; every other class is a network link.
INTRA_CLASSES = frozenset({"nvlink", "nvswitch", "pcie", "qpi", "upi", "xgmi", "socket", "c2c"})
NVLINK_CLASSES = frozenset({"nvlink", "nvswitch"})


def _link_class(d: dict) -> str:
    return str(d.get("link") or "default")


def topologies_local_routes(G, nodes):
    import topologies

    return topologies.LocalRoutes(G, nodes)


def _nvswitch_joins(G, nodes) -> bool:
    """An NVSwitch is a neighbour of every one of ``nodes`` (it is one of the first's)."""
    return any(G.nodes[n].get("kind") == "switch" and G.nodes[n].get("fabric") == "nvswitch"
               and all(G.has_edge(n, g) for g in nodes[1:]) for n in G.neighbors(nodes[0]))


def _machines(G) -> dict:
    """Node id -> machine index, for graphs without ``host`` attributes: a machine is what
    intra-machine links (NVLink, PCIe, sockets) join."""
    H = nx.Graph()
    H.add_nodes_from(G.nodes)
    H.add_edges_from((u, v) for u, v, d in G.edges(data=True) if _link_class(d) in INTRA_CLASSES)
    comp = {}
    for i, part in enumerate(nx.connected_components(H)):
        for n in part:
            comp[n] = i
    return comp


def _group_by_node(G, gpus, ranks, machines) -> list:
    """Ranks grouped per machine; ``machines()`` gives :func:`_machines` of ``G`` on demand."""
    hosts = [G.nodes[gpus[r]].get("host") for r in ranks]
    if all(h is not None for h in hosts):
        groups: dict = {}
        for r, h in zip(ranks, hosts):
            groups.setdefault(h, []).append(r)
        return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])
    comp = machines()
    groups = {}
    for r in ranks:
        groups.setdefault(comp[gpus[r]], []).append(r)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


def _nics_by(G, key) -> dict:
    """``key(nic, attrs)`` -> that machine's NIC node ids, in natural name order."""
    found: dict = {}
    for n, d in G.nodes(data=True):
        if d.get("kind") == "nic":
            found.setdefault(key(n, d), []).append(n)
    return {k: sorted(v, key=_natural) for k, v in found.items()}


def _nics_of(G, gpus, grp, machines, memo) -> list:
    """NIC node ids of the machine holding ranks ``grp``, in natural name order: the NICs of
    its ``host`` or, without one, those its intra-machine links reach. ``memo`` keeps the
    per-machine tables across the groups of one analysis."""
    g = gpus[grp[0]]
    host = G.nodes[g].get("host")
    if host is not None:
        if "host" not in memo:
            memo["host"] = _nics_by(G, lambda n, d: d.get("host"))
        return list(memo["host"].get(host, ()))
    comp = machines()
    if "comp" not in memo:
        memo["comp"] = _nics_by(G, lambda n, d: comp[n])
    return list(memo["comp"].get(comp[g], ()))


def _natural(name: str):
    """Sort key that orders nic2 before nic10."""
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(name))]


#: NCCL's path types, nearest first (src/graph/topo.h PATH_NVL .. PATH_SYS).
_PATH_ORDER = {"NVL": 1, "PIX": 3, "PXB": 4, "PHB": 8, "SYS": 9}


def _path_type(G, path) -> str:
    """NCCL's type of a routed path between two GPUs (nodes in order)."""
    links = [_link_class(G.edges[u, v]) for u, v in zip(path, path[1:])]
    if links and all(k in NVLINK_CLASSES for k in links):
        return "NVL"
    kinds = [G.nodes[n] for n in path[1:-1]]
    cpus = sum(d.get("kind") == "cpu" for d in kinds)
    if cpus >= 2:
        return "SYS"
    if cpus == 1:
        return "PHB"
    bridges = sum(d.get("kind") == "switch" and d.get("fabric") == "pcie" for d in kinds)
    return "PXB" if bridges > 1 else "PIX"
