"""Shortest-latency routing with deterministic per-hop ECMP, fast on clusters of 10**4 GPUs.

Metric: a path's cost is (total latency, hops), compared lexicographically. Latencies are
rounded to whole picoseconds, so two paths whose latencies agree to 0.5 ps tie; ties are
broken by hop count and what still ties is an equal-cost multi-path (ECMP) set. As in real
switches, each hop picks one of its equal-cost next hops by a stable hash of the flow (the
BLAKE2b of src, dst, flow and the hop; never Python's salted ``hash``), so a route is a pure
function of (graph, src, dst, flow).

Speed. Two facts keep routing of a whole cluster in seconds:

1. Hosts hang off few attachment points. Nodes in trees hanging off the rest of the graph
   (GPUs on a fat-tree edge switch, NICs of a single box) are peeled off once; their route to
   anything else is forced through their attachment node, so only routes between attachment
   nodes are searched, and those are cached and shared by every host behind them.
2. What the shortcuts (a direct link, a route inside one machine, the fabric's tables) do not
   give is searched over the core: a bidirectional search per pair, or one distance map per
   destination many routes lead to (:mod:`topologies.coresearch`).
"""
from __future__ import annotations

import math
import weakref
from collections import OrderedDict

import networkx as nx

from ._graph import fingerprint, peel_leaves
from .coresearch import _WIDE, CoreSearch, _stable_hash
from .errors import RoutingError, ValidationError

#: Hop weight: cost = latency_ps * HOP + hops, so latency dominates and hops break ties.
HOP = 1 << 20


def link_cost(latency: float) -> int:
    """The routing metric of a link of ``latency`` seconds (an int: whole picoseconds x
    :data:`HOP`, plus one hop); a path's cost is the sum over its links."""
    return round(latency * 1e12) * HOP + 1


class Router(CoreSearch):
    """Routes of one topology, cached.

    Parameters
    ----------
    G : nx.Graph
        A topology (edges need a positive finite ``latency`` in seconds). The router keeps
        its own copy of the structure: build a new router after changing ``G``.
    max_cached_paths : int
        Most (src, dst, flow) routes kept (least recently used are dropped).
    max_cached_pairs : int
        Most equal-cost DAGs between attachment nodes kept.
    """

    def __init__(self, G: nx.Graph, *, max_cached_paths: int = 1 << 18,
                 max_cached_pairs: int = 1 << 16):
        names = list(G.nodes)
        self._names = names
        self._index = {n: i for i, n in enumerate(names)}
        self._label = [str(n) for n in names]
        n = len(names)
        adj: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        idx = self._index
        for a, b, d in G.edges(data=True):
            lat = d.get("latency")
            if (not isinstance(lat, (int, float)) or isinstance(lat, bool)
                    or not math.isfinite(lat) or lat <= 0):
                raise ValidationError(f"edge ({a!r}, {b!r}): latency={lat!r} must be a positive "
                                      f"finite number of seconds")
            if a == b:
                raise ValidationError(f"edge ({a!r}, {b!r}): self-loop")
            cost = link_cost(lat)
            ia, ib = idx[a], idx[b]
            adj[ia].append((ib, cost))
            adj[ib].append((ia, cost))
        label = self._label
        self._host = [G.nodes[n].get("host") for n in names]
        self._hosts = None                          # host -> its node ids (built on demand)
        self._host_kinds: dict = {}                 # machine description -> its routes
        self._host_kind: dict = {}                  # host -> (description, positions)
        self._host_local: dict = {}                 # host -> (positions, its kind's routes)
        self._fabric = None                         # topologies.fabric.FabricRoutes, on demand
        self._walk_names: dict = {}                 # (leaf, leaf, limit) -> named fabric walks
        self._cheapest: dict = {}                   # node -> its two cheapest link costs
        # Sorted by neighbour id: routes must not depend on the order edges were added.
        self._adj = [sorted(lst, key=lambda t: label[t[0]]) for lst in adj]
        self._parent, core = self._peel(self._adj)
        self._core = core
        self._cadj = [tuple((v, c) for v, c in lst if core[v]) for lst in self._adj]
        self._paths: OrderedDict = OrderedDict()
        self._free: dict = {}                       # (src, dst) -> the route of every flow
        self._dags: OrderedDict = OrderedDict()
        self._max_paths = int(max_cached_paths)
        self._max_dags = int(max_cached_pairs)
        self._dists: OrderedDict = OrderedDict()    # core node -> its distance to every node
        self._work: dict = {}                       # core node -> nodes its pair searches settled
        self._csr = None                            # core links for scipy (False: too long)
        self._wides: dict = {}                      # (node, core?) -> its links by neighbour
        # Distance maps kept: about 2**24 entries (128 MB) in all.
        self._max_dists = max(16, (1 << 24) // max(1, sum(core)))
        # Rent or buy: a map (compiled Dijkstra over the core) costs about as much as pair
        # searches (Python) settling an eighth of the core's nodes.
        self._dist_after = max(8, sum(core) // 8)

    @staticmethod
    def _peel(adj):
        """Peel trees hanging off the graph: returns (parent, is_core)."""
        peeled, core = peel_leaves([[u for u, _ in lst] for lst in adj])
        parent = [-1] * len(adj)
        for v, u in peeled:
            parent[v] = u
        return parent, core

    # -- public API -------------------------------------------------------------------------
    def path(self, src, dst, flow=0) -> tuple:
        """The nodes a flow from ``src`` to ``dst`` crosses, ``src`` and ``dst`` included.

        Parameters
        ----------
        src, dst : node
            Node ids of the graph.
        flow : hashable
            Flow label (an int, or a string such as a transfer id): different flows between
            the same nodes may take different equal-cost paths; the same flow always the same.
            Flows are hashed by ``str(flow)``, so ``1`` and ``"1"`` take the same path.

        Raises
        ------
        RoutingError
            If a node is unknown or no path exists.
        """
        key = (src, dst, flow)
        try:
            cached = self._paths.get(key)
        except TypeError:
            self._node(src), self._node(dst)
            raise RoutingError(f"flow {flow!r} must be hashable (an int or a string)") from None
        if cached is not None:
            self._paths.move_to_end(key)
            return cached
        free = self._free.get((src, dst))
        if free is not None:
            return free
        i, j = self._node(src), self._node(dst)
        seq = self._link(i, j)
        free = seq is not None      # a link every other way beats: every flow's route
        salt = f"{self._label[i]}\0{self._label[j]}\0{flow}\0"
        if seq is None and self._host[i] is not None and self._host[j] is not None and i != j:
            if self._host[i] == self._host[j]:
                seq, free = self._in_host(i, j, salt)
            else:
                seq = self._via_fabric(i, j, salt)
        if seq is None:
            seq = self._route(i, j, salt)
        names = self._names
        result = tuple([names[x] for x in seq])
        if free and len(self._free) < self._max_paths:
            # kept per pair, whatever the flow: the engine asks a machine's GPU-to-NIC legs
            # with every transfer's own flow label (57,000 on 8,192 GPUs)
            self._free[(src, dst)] = result
            return result
        self._paths[key] = result
        if len(self._paths) > self._max_paths:
            self._paths.popitem(last=False)
        return result

    def channels(self, src, dst, flow=0) -> tuple:
        """The directed link channels ``(u, v)`` a flow crosses, in order (empty if src == dst)."""
        p = self.path(src, dst, flow)
        return tuple(zip(p, p[1:]))

    def latency(self, src, dst, flow=0) -> float:
        """Sum of the link latencies (s) along :meth:`path`, the minimum over all paths.

        Computed from the router's metric, so it is exact to the picosecond it rounds to.
        """
        p = self.path(src, dst, flow)
        cost = sum(self._edge_cost(self._index[a], self._index[b]) for a, b in zip(p, p[1:]))
        return (cost // HOP) * 1e-12

    def equal_cost_paths(self, src, dst, limit: int = 1024) -> list[tuple]:
        """All equal-cost shortest paths from ``src`` to ``dst`` (at most ``limit``), sorted."""
        i, j = self._node(src), self._node(dst)
        if i == j:
            return [(src,)]
        fab = self._fabric_of(i, j)
        if fab is not None:                    # a NIC-to-NIC route (topologies.fabric)
            fr, (la, lb, dest) = fab
            names = self._names
            key = (la, lb, limit)
            hit = self._walk_names.get(key)
            if hit is None:
                walks = [tuple(names[x] for x in mid) for mid in fr.walks(la, lb, dest, limit)]
                # Equally long walks order every NIC pair's paths (i, *walk, j) as they order
                # themselves: sorted once per leaf pair, not per pair (8,192 ring legs)
                ordered = len({len(w) for w in walks}) <= 1
                if ordered:
                    walks.sort(key=lambda w: [str(x) for x in w])
                hit = self._walk_names[key] = (walks, ordered)
            a, b = names[i], names[j]
            out = [(a, *mid, b) for mid in hit[0]]
            return out if hit[1] else sorted(out, key=lambda p: [str(x) for x in p])
        up_i, up_j = self._chain(i), self._chain(j)
        if up_i[-1] == up_j[-1]:
            return [tuple(self._names[x] for x in self._tree_path(up_i, up_j))]
        dag, start, end = self._dag(up_i[-1], up_j[-1]), up_i[-1], up_j[-1]
        head, tail = up_i[:-1], up_j[:-1][::-1]
        out: list[tuple] = []

        def walk(u, acc):
            if len(out) >= limit:
                return
            if u == end:
                seq = head + acc + tail
                out.append(tuple(self._names[x] for x in seq))
                return
            for v in dag.next(u):
                walk(v, acc + [v])

        walk(start, [start])
        return sorted(out, key=lambda p: [str(x) for x in p])

    def prove_routes(self, pairs) -> None:
        """Settle whether the fabric's tables route each ``(src, dst)`` node pair of
        different machines (:meth:`topologies.fabric.FabricRoutes.prove`), all at once: a
        caller about to route thousands of NIC pairs (NCCL's trees) saves the proof's
        per-pair overhead. The routes are the same with or without it."""
        idx, host = self._index, self._host
        ij = [(idx[a], idx[b]) for a, b in pairs]
        ij = [(i, j) for i, j in ij if host[i] is not None and host[j] is not None
              and host[i] != host[j]]
        if ij and self._fabric_routes().ok:
            self._fabric.prove(ij)

    # -- internals --------------------------------------------------------------------------
    def _link(self, i: int, j: int):
        """``[i, j]`` when a link joins them and every other route is dearer: any other route
        leaves ``i`` by another link and enters ``j`` by another (NCCL's balanced ring hops
        are pinned link by link, 65,536 such legs on 8,192 GPUs); else None."""
        if i == j:
            return None
        adj = self._adj[i]
        if len(adj) > _WIDE:
            hit = self._wide(i, self._adj).get(j)
            c = None if hit is None else hit[1]
        else:
            for v, c in adj:         # a loop, not next() over a generator: 100,000 calls
                if v == j:
                    break
            else:
                return None
        if c is None:
            return None
        cheap = self._cheapest

        def other(k, cost):          # the cheapest of k's links but (one of) this one
            two = cheap.get(k)
            if two is None:          # per node asked (a cluster has 10**5 nodes)
                two = cheap[k] = sorted(c for _, c in self._adj[k])[:2]
            return two[1] if two[0] == cost and len(two) > 1 else (two[0] if two[0] != cost else None)

        oi, oj = other(i, c), other(j, c)
        if oi is None or oj is None or c < oi + oj:
            return [i, j]
        return None

    def _in_host(self, i: int, j: int, salt: str):
        """The route between two nodes of one machine (``host`` attribute) when the graph's
        shortest routes between them provably stay inside it (:class:`topologies.hosts.
        LocalRoutes`); else None. The machine's distances are found once per kind of machine
        (by position); the only shortest route is mapped by position, equal-cost ones are
        walked with the same hash of the same names as :meth:`_route` (inside a machine its
        links are in the same order on every copy: the description lists them so). A
        cluster's 1,024 copies of one machine then cost one small search per pair of
        positions instead of a search of the graph per pair of nodes. Returns ``(route or
        None, whether the route is the only shortest one: every flow's)``."""
        h = self._host[i]
        pos, local, paths = self._host_routes(h)
        key = (pos[i], pos[j])
        hit = paths.get(key, False)
        if hit is False:
            hit = paths[key] = (None if not local.exact(*key)
                                else local.unique_path(*key) or "walk")
        if hit is None:
            return None, False
        nodes = self._hosts[h]
        if hit != "walk":
            return [nodes[k] for k in hit], True
        u, end = key
        dj, label = local.dist[end], self._label
        seq = [nodes[u]]
        while u != end:
            nxt = [v for v, c in local.adj[u] if dj[v] + c == dj[u]]
            u = nxt[0] if len(nxt) == 1 else nxt[_stable_hash(salt + label[nodes[u]]) % len(nxt)]
            seq.append(nodes[u])
        return seq, False

    def _host_routes(self, h) -> tuple:
        """``(node -> position, LocalRoutes, routes by position pair)`` of machine ``h``,
        kept per host: its kind's are kept per description, a long tuple whose hash every
        dict lookup works out again (the engine asks 70,000 pairs)."""
        hit = self._host_local.get(h)
        if hit is None:
            kind = self._host_kind.get(h)
            if kind is None:
                kind = self._host_kind[h] = self._describe_host(h)
            hit = self._host_local[h] = (kind[1], *self._host_kinds[kind[0]])
        return hit

    def _fabric_of(self, i: int, j: int):
        """``(FabricRoutes, (leaf of i, leaf of j, table))`` when every shortest route from
        machine node ``i`` to a node ``j`` of another machine crosses the fabric between
        their leaves (:mod:`topologies.fabric`); else None."""
        if self._host[i] is None or self._host[j] is None or self._host[i] == self._host[j]:
            return None
        fr = self._fabric_routes()
        if not fr.ok:
            return None
        got = fr.route(i, j)
        return None if got is None else (fr, got)

    def _fabric_routes(self):
        """The graph's :class:`topologies.fabric.FabricRoutes`, made on first use."""
        if self._fabric is None:
            from .fabric import FabricRoutes

            self._fabric = FabricRoutes(self)
        return self._fabric

    def _via_fabric(self, i: int, j: int, salt: str):
        """The route from machine node ``i`` to a node ``j`` of another machine through the
        fabric's tables, hashed as :meth:`_route` hashes (None: not provably that route)."""
        fab = self._fabric_of(i, j)
        if fab is None:
            return None
        fr, (la, lb, dest) = fab
        label = self._label
        u, seq = la, [i, la]
        while u != lb:
            nxt = fr.next_hops(u, dest)
            u = nxt[0] if len(nxt) == 1 else nxt[_stable_hash(salt + label[u]) % len(nxt)]
            seq.append(u)
        seq.append(j)
        return seq

    def _describe_host(self, h) -> tuple:
        """(description, node -> position) of machine ``h``: its links by position and cost,
        and the costs of its links out; its :class:`LocalRoutes` once per description."""
        if self._hosts is None:
            self._hosts = {}
            for k, x in enumerate(self._host):
                if x is not None:
                    self._hosts.setdefault(x, []).append(k)
        nodes = self._hosts[h]
        pos = {x: k for k, x in enumerate(nodes)}
        adj, way_out = [], []
        for x in nodes:
            inside, out = [], None
            for v, c in self._adj[x]:
                k = pos.get(v)
                if k is None:
                    out = c if out is None else min(out, c)
                else:
                    inside.append((k, c))
            adj.append(tuple(inside))
            way_out.append(out)
        desc = (tuple(adj), tuple(way_out))
        if desc not in self._host_kinds:
            from .hosts import LocalRoutes

            self._host_kinds[desc] = (LocalRoutes.of_links(nodes, [list(a) for a in adj],
                                                           way_out), {})
        return desc, pos

    def _node(self, node) -> int:
        try:
            return self._index[node]
        except (KeyError, TypeError):
            raise RoutingError(f"node {node!r} is not in the topology") from None

    def _edge_cost(self, a: int, b: int) -> int:
        adj = self._adj[a]
        if len(adj) > _WIDE:                    # a spine: thousands of links
            c = self._wide(a, self._adj).get(b)
            if c is not None:
                return c[1]
        else:
            for v, c in adj:
                if v == b:
                    return c
        raise RoutingError(f"no link between {self._names[a]!r} and {self._names[b]!r}")

#: graph -> (fingerprint, Router): the consumers of one graph share its routes.
_SHARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def router_of(G: nx.Graph) -> Router:
    """The :class:`Router` of ``G`` that every consumer shares, built again when ``G``'s nodes,
    links or latencies changed.

    The engine's routing tables and NCCL's analysis of a graph route the same legs (a 1024-GPU
    all-to-all: 150,000 of them); with a router each, each leg was searched twice.

    Examples
    --------
    >>> import topologies
    >>> G = topologies.ring(4)
    >>> router_of(G) is router_of(G)
    True
    >>> router_of(G).path("gpu0", "gpu2") == Router(G).path("gpu0", "gpu2")
    True
    """
    fp = fingerprint(G, rates=False, node_data=False)
    hit = _SHARED.get(G)
    if hit is None or hit[0] != fp:
        hit = _SHARED[G] = (fp, Router(G))
    return hit[1]

