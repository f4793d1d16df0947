"""Machines of a cluster graph, analysed once per kind of machine.

A cluster of 8,192 GPUs is 1,024 copies of one machine joined by a fabric. What a consumer
asks of a machine (which GPU is nearest a NIC, which links join two GPUs) depends on the
machine only, provided the routes inside it never leave it. Two helpers make that cheap and
exact:

- :func:`machine_signature`: a positional description of a machine's nodes, links and attachment
  to the rest of the graph; two machines with equal signatures are copies (node ``k`` of one
  plays the part of node ``k`` of the other), so facts found on one hold, position for
  position, on the other.
- :class:`LocalRoutes`: shortest routes inside a machine's own subgraph, with the router's
  metric (:func:`topologies.routing.link_cost`), and a proof per pair that the whole graph's
  shortest routes are these: a route that leaves the machine crosses at least two of its
  outside links, so when the inside distance is shorter than the cheapest way out and back
  in, every shortest route of the graph stays inside and is one of the inside ones (the
  same equal-cost set, so the router's choice among them is the same too).

A pair without that proof (a machine whose GPUs are closer through the fabric than
through their own links) is left to the caller, which then asks the graph's router.
"""
from __future__ import annotations

import heapq

import networkx as nx

from .routing import HOP, link_cost

__all__ = ["machine_signature", "LocalRoutes"]


def machine_signature(G: nx.Graph, nodes, *, skip=("host",), shift=None) -> tuple:
    """A hashable positional description of the machine ``nodes`` (in this order) of ``G``.

    Node ``k`` is described by its attributes (without those in ``skip``; ``shift`` maps an
    attribute name to an offset subtracted from it, e.g. ``{"rank": base}``), each link
    between the machine's nodes by its ends' positions and attributes, and each link leaving
    the machine by its inside end's position and its attributes. Equal signatures mean the
    two machines are the same graph under the positional map and attach to the rest of the
    graph through the same kinds of links.

    Examples
    --------
    >>> import topologies
    >>> G = topologies.from_spec("cluster:dgx_a100x2")
    >>> a = [n for n in G if G.nodes[n].get("host") == 0]
    >>> b = [n for n in G if G.nodes[n].get("host") == 1]
    >>> machine_signature(G, a, shift={"rank": 0}) == machine_signature(G, b, shift={"rank": 8})
    True
    """
    shift = shift or {}
    pos = {n: k for k, n in enumerate(nodes)}
    desc = []
    for n in nodes:
        d = G.nodes[n]
        desc.append(tuple(sorted((k, (v - shift[k]) if k in shift else v)
                                 for k, v in d.items() if k not in skip)))
    inside, outside = [], []
    adj = G._adj            # the graph's own table: its views cost a second on 8,192 machines
    for n in nodes:
        i = pos[n]
        for m, d in adj[n].items():
            j = pos.get(m)
            if j is None:
                outside.append((i, tuple(sorted(d.items()))))
            elif i < j:     # each inside link once, from its lower end
                inside.append((i, j, tuple(sorted(d.items()))))
    return (tuple(desc), tuple(sorted(inside)), tuple(sorted(outside)))


class LocalRoutes:
    """Shortest routes inside the machine ``nodes`` of ``G`` (all pairs; a machine has tens
    of nodes), and whether they are the graph's.

    Parameters
    ----------
    G : nx.Graph
        The whole topology (edges with ``latency`` in seconds).
    nodes : sequence of node
        The machine's nodes; positions index them in every method.

    Examples
    --------
    >>> import topologies
    >>> G = topologies.from_spec("cluster:dgx_a100x2")
    >>> mine = [n for n in G if G.nodes[n].get("host") == 1]
    >>> r = LocalRoutes(G, mine)
    >>> i, j = mine.index("n1.nic0"), mine.index("n1.gpu0")
    >>> r.exact(i, j), r.latency(i, j) == topologies.Router(G).latency("n1.nic0", "n1.gpu0")
    (True, True)
    """

    def __init__(self, G: nx.Graph, nodes):
        nodes = list(nodes)
        pos = {n: k for k, n in enumerate(nodes)}
        adj: list = [[] for _ in nodes]
        way_out: list = [None] * len(nodes)
        for a in nodes:
            i = pos[a]
            for b, d in G.adj[a].items():
                c = link_cost(float(d["latency"]))
                j = pos.get(b)
                if j is None:
                    way_out[i] = c if way_out[i] is None else min(way_out[i], c)
                else:
                    adj[i].append((j, c))
        self._setup(nodes, adj, way_out)

    @classmethod
    def of_links(cls, nodes, adj, way_out) -> "LocalRoutes":
        """From the machine's own links: ``adj[k]`` the (position, cost) of node ``k``'s
        links inside, ``way_out[k]`` the cost of its cheapest link out (None: none), costs
        in the router's metric (:func:`topologies.routing.link_cost`)."""
        self = cls.__new__(cls)
        self._setup(list(nodes), adj, way_out)
        return self

    def _setup(self, nodes, adj, way_out):
        self.nodes = nodes
        n = len(nodes)
        self.adj = adj
        self.dist = [self._dijkstra(i) for i in range(n)]
        exits = [i for i in range(n) if way_out[i] is not None]
        self._cheapest = min((way_out[i] for i in exits), default=None)
        # Cheapest way from each node to a link out (its cost included), inside links first.
        inf = float("inf")
        self._out = [min((self.dist[i][x] + way_out[x] for x in exits), default=inf)
                     for i in range(n)]

    def _dijkstra(self, s: int) -> list:
        inf = float("inf")
        best = [inf] * len(self.adj)
        best[s] = 0
        heap = [(0, s)]
        while heap:
            d, u = heapq.heappop(heap)
            if d > best[u]:
                continue
            for v, c in self.adj[u]:
                if d + c < best[v]:
                    best[v] = d + c
                    heapq.heappush(heap, (d + c, v))
        return best

    def exact(self, i: int, j: int) -> bool:
        """Every shortest route of the whole graph between nodes ``i`` and ``j`` stays in the
        machine (and so is one of its own shortest routes): the inside distance is below
        that of any route out through one link and back in through another."""
        d = self.dist[i][j]
        if d == float("inf"):
            return False
        return self._cheapest is None or d < self._out[i] + self._out[j]

    def latency(self, i: int, j: int) -> float:
        """Seconds along a shortest inside route, as :meth:`topologies.Router.latency` gives it."""
        return (self.dist[i][j] // HOP) * 1e-12

    def shortest_edges(self, i: int, j: int) -> list:
        """The inside links ``(u, v)`` (positions, in the direction i -> j) that lie on some
        shortest route from ``i`` to ``j``."""
        di, dj = self.dist[i], self.dist[j]
        total = di[j]
        return [(u, v) for u in range(len(self.adj)) for v, c in self.adj[u]
                if di[u] + c + dj[v] == total]

    def unique_path(self, i: int, j: int):
        """The positions along the only shortest route from ``i`` to ``j`` when it is the
        only one and :meth:`exact`, else None (equal-cost routes are the router's hash's to
        choose, which depends on the nodes' names)."""
        if not self.exact(i, j):
            return None
        dj = self.dist[j]
        seq = [i]
        u = i
        while u != j:
            nxt = [v for v, c in self.adj[u] if dj[v] + c == dj[u]]
            if len(nxt) != 1:
                return None
            u = nxt[0]
            seq.append(u)
        return tuple(seq)
