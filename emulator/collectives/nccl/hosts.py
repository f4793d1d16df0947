"""NCCL's per-node facts (NVLink between the GPUs, an NVSwitch, each NIC's nearest GPUs),
found once per kind of machine.

:class:`~.system.NcclSystem` needs, for every node (host) of a cluster, whether its GPUs
talk over NVLink only, whether an NVSwitch joins them, and each NIC's local GPUs by path
latency. Asking the graph's router for each (NIC, GPU) and (GPU, GPU) pair of every node
costs a route search per pair; a cluster of 1,024 identical machines asks 1,024 times the
same questions. Here each machine is described positionally (:func:`topologies.
machine_signature`), the questions are answered once per distinct description on the machine's own
subgraph (:class:`topologies.LocalRoutes`, which proves per pair that the graph's
shortest routes stay inside the machine), and the answers are mapped, position for position,
onto its copies. A machine whose answers the proof does not cover (a route that may leave it,
equal-cost routes over different kinds of link, which the router's hash would decide) is
answered by the graph's router as before, machine by machine.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

import topologies

__all__ = ["HostFacts", "host_facts"]


@dataclass(frozen=True)
class HostFacts:
    """What NCCL sees of one node: ``nvlink`` (every GPU pair joined over NVLink-class links
    only), ``near`` (NIC -> local ranks, nearest first) and ``latency`` ((NIC, GPU node) ->
    path seconds, for the pairs of ``near``)."""

    nvlink: bool
    near: dict
    latency: dict
    kind: object = None     # the machine's description: equal for copies of one machine
    nodes: tuple = ()       # its nodes, in the order the description numbers them


def _by_host(G: nx.Graph, groups, gpus, machines) -> list:
    """The node list (in ``G``'s order) of each group's machine: the nodes sharing the
    GPUs' ``host`` attribute, or else their intra-machine component (``machines()``)."""
    first = [gpus[grp[0]] for grp in groups]
    hosts = [G.nodes[g].get("host") for g in first]
    members: dict = {}
    if all(h is not None for h in hosts):
        wanted = set(hosts)
        for n, d in G.nodes(data=True):
            h = d.get("host")
            if h in wanted:
                members.setdefault(h, []).append(n)
        return [members[h] for h in hosts]
    comp = machines()
    keys = [comp[g] for g in first]
    wanted = set(keys)
    for n in G.nodes:
        k = comp.get(n)
        if k in wanted:
            members.setdefault(k, []).append(n)
    return [members[k] for k in keys]


def host_facts(G: nx.Graph, gpus, groups, nics, router, machines, nvlink_classes,
               link_class) -> list:
    """The :class:`HostFacts` of each group of ranks (one machine each) and its ``nics``.

    Parameters
    ----------
    G : nx.Graph
    gpus : list
        GPU node of each rank.
    groups : list of list of int
        Ranks per machine.
    nics : list of list
        NIC nodes of each group's machine (NCCL's order).
    router : topologies.Router
        The graph's router, for machines the local analysis does not cover.
    machines : callable
        Node -> machine index of graphs without ``host`` attributes (on demand).
    nvlink_classes : set of str
        Link classes that count as NVLink.
    link_class : callable
        Edge attributes -> class name.
    """
    members = _by_host(G, groups, gpus, machines)
    kinds: dict = {}
    out = []
    for grp, mine, cards in zip(groups, members, nics):
        pos = {n: k for k, n in enumerate(mine)}
        if any(gpus[r] not in pos for r in grp) or any(c not in pos for c in cards):
            out.append(_global(G, gpus, grp, cards, router, nvlink_classes, link_class))
            continue
        sig = topologies.machine_signature(G, mine, shift={"rank": grp[0]})
        key = (sig, tuple(pos[gpus[r]] for r in grp), tuple(r - grp[0] for r in grp),
               tuple(pos[c] for c in cards))
        kind = kinds.get(key)
        if kind is None:
            kind = kinds[key] = _local(G, mine, gpus, grp, cards, pos, nvlink_classes,
                                       link_class)
        if kind is None:        # not provable inside the machine: the graph's routes decide
            out.append(_global(G, gpus, grp, cards, router, nvlink_classes, link_class))
            continue
        nvlink, near_pos, lat_pos = kind
        base = grp[0]
        near = {c: tuple(base + off for off in near_pos[k]) for k, c in enumerate(cards)}
        latency = {(c, mine[g]): lat_pos[(k, g)] for k, c in enumerate(cards)
                   for g in (pos[gpus[r]] for r in grp)}
        out.append(HostFacts(nvlink, near, latency, sig, tuple(mine)))
    return out


def _local(G, mine, gpus, grp, cards, pos, nvlink_classes, link_class):
    """Positional facts of one kind of machine from its own subgraph, or None where a pair's
    routes are not provably inside it or equal-cost routes disagree on NVLink."""
    routes = topologies.LocalRoutes(G, mine)
    gp = [pos[gpus[r]] for r in grp]
    nvlink = True
    for x in range(len(gp)):
        for y in range(x + 1, len(gp)):
            a, b = gp[x], gp[y]
            if not routes.exact(a, b):
                return None
            on = routes.shortest_edges(a, b)
            classes = {link_class(G.edges[mine[u], mine[v]]) in nvlink_classes for u, v in on}
            if classes == {False} or (classes == {True}):
                nvlink = nvlink and classes == {True}
                continue
            # Mixed: is there a shortest route over NVLink-class links only? If every one
            # crosses another class, the pair is not NVLink; if some do and some do not,
            # the router's hash decides.
            if _nvlink_route(routes, a, b, mine, G, nvlink_classes, link_class):
                return None
            nvlink = False
    near_pos, lat_pos = [], {}
    for k, c in enumerate(cards):
        ci = pos[c]
        for g in gp:
            if not routes.exact(ci, g):
                return None
            lat_pos[(k, g)] = routes.latency(ci, g)
        order = sorted(range(len(grp)), key=lambda i: (lat_pos[(k, gp[i])], grp[i]))
        near_pos.append(tuple(grp[i] - grp[0] for i in order))
    return nvlink, near_pos, lat_pos


def _nvlink_route(routes, a, b, mine, G, nvlink_classes, link_class) -> bool:
    """Some shortest route a -> b crosses NVLink-class links only."""
    di, dj = routes.dist[a], routes.dist[b]
    total = di[b]
    stack, seen = [a], {a}
    while stack:
        u = stack.pop()
        if u == b:
            return True
        for v, c in routes.adj[u]:
            if (v not in seen and di[u] + c + dj[v] == total
                    and link_class(G.edges[mine[u], mine[v]]) in nvlink_classes):
                seen.add(v)
                stack.append(v)
    return False


def _global(G, gpus, grp, cards, router, nvlink_classes, link_class) -> HostFacts:
    """The facts from the graph's router (every pair routed), as the analysis always did."""
    nvlink = all(all(link_class(G.edges[u, v]) in nvlink_classes
                     for u, v in router.channels(gpus[a], gpus[b]))
                 for a in grp for b in grp if a < b)
    latency = {(c, gpus[r]): router.latency(c, gpus[r]) for c in cards for r in grp}
    near = {c: tuple(sorted(grp, key=lambda r: (latency[(c, gpus[r])], r))) for c in cards}
    return HostFacts(nvlink, near, latency)
