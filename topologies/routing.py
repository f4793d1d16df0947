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
2. A route search is bidirectional: it settles only the nodes within half the route's cost
   of either end. Every node of a shortest path is in one of those two balls (its distance to
   one end is at most half the total), so the equal-cost DAG is exact while a search between
   two GPUs of one DGX never looks past its NVSwitch, and one between leaves never expands the
   spines' fan-out.
3. A destination many routes lead to (all-to-all: every GPU is one) gets one single-source
   search instead: its distance to every node. The equal-cost next hops at u are then the
   neighbours v with ``dist(v) == dist(u) - cost(u, v)``, found while walking, with no search
   per pair. They are the same next hops, in the same order, as the DAG of the pair search.
   A destination buys its map once the pair searches towards it have settled as many nodes
   as a fraction of the graph (the rent-or-buy rule): a GPU that only its own machine's NICs
   and GPUs route to (NCCL's analysis of a 1024-machine cluster asks 15 such routes per GPU,
   each settling a dozen nodes) never pays for a search of the whole cluster, which made that
   analysis quadratic in the machines (20 s at 2048 GPUs), while an all-to-all's
   destinations, searched from everywhere, buy theirs after a few dozen routes.
"""
from __future__ import annotations

import hashlib
import heapq
import math
import weakref
from array import array
from collections import OrderedDict

import networkx as nx

from ._graph import peel_leaves
from .errors import RoutingError, ValidationError

def _stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process (unlike the salted ``hash``).

    BLAKE2b rather than CRC-32: CRC is linear, so its low bits barely change between flow
    keys that differ in a few characters, and ``% 2`` would send them all the same way.
    """
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


#: Hop weight: cost = latency_ps * HOP + hops, so latency dominates and hops break ties.
HOP = 1 << 20


def link_cost(latency: float) -> int:
    """The routing metric of a link of ``latency`` seconds (an int: whole picoseconds x
    :data:`HOP`, plus one hop); a path's cost is the sum over its links."""
    return round(latency * 1e12) * HOP + 1


class Router:
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
        self._cheapest: dict = {}                   # node -> its two cheapest link costs
        # Sorted by neighbour id: routes must not depend on the order edges were added.
        self._adj = [sorted(lst, key=lambda t: label[t[0]]) for lst in adj]
        self._parent, core = self._peel(self._adj)
        self._core = core
        self._cadj = [tuple((v, c) for v, c in lst if core[v]) for lst in self._adj]
        self._paths: OrderedDict = OrderedDict()
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
        i, j = self._node(src), self._node(dst)
        seq = self._link(i, j)
        salt = f"{self._label[i]}\0{self._label[j]}\0{flow}\0"
        if seq is None and self._host[i] is not None and self._host[j] is not None and i != j:
            seq = (self._in_host(i, j, salt) if self._host[i] == self._host[j]
                   else self._via_fabric(i, j, salt))
        if seq is None:
            seq = self._route(i, j, salt)
        names = self._names
        result = tuple([names[x] for x in seq])
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
            out = [tuple(names[x] for x in (i, *mid, j)) for mid in fr.walks(la, lb, dest, limit)]
            return sorted(out, key=lambda p: [str(x) for x in p])
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
        positions instead of a search of the graph per pair of nodes."""
        h = self._host[i]
        pos, local, paths = self._host_routes(h)
        key = (pos[i], pos[j])
        hit = paths.get(key, False)
        if hit is False:
            hit = paths[key] = (None if not local.exact(*key)
                                else local.unique_path(*key) or "walk")
        if hit is None:
            return None
        nodes = self._hosts[h]
        if hit != "walk":
            return [nodes[k] for k in hit]
        u, end = key
        dj, label = local.dist[end], self._label
        seq = [nodes[u]]
        while u != end:
            nxt = [v for v, c in local.adj[u] if dj[v] + c == dj[u]]
            u = nxt[0] if len(nxt) == 1 else nxt[_stable_hash(salt + label[nodes[u]]) % len(nxt)]
            seq.append(nodes[u])
        return seq

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

    def _wide(self, u: int, adj) -> dict:
        """``{neighbour: (its position in adj[u], cost)}`` of a node with many links, kept
        (``adj`` is ``self._adj`` or ``self._cadj``, each with its own table)."""
        key = (u, adj is self._cadj)
        hit = self._wides.get(key)
        if hit is None:
            hit = self._wides[key] = {v: (k, c) for k, (v, c) in enumerate(adj[u])}
        return hit

    def _chain(self, i: int) -> list[int]:
        out = [i]
        parent, core = self._parent, self._core
        while not core[i]:
            i = parent[i]
            if i < 0:
                break
            out.append(i)
        return out

    @staticmethod
    def _tree_path(up_i, up_j):
        pos = {v: k for k, v in enumerate(up_j)}
        for k, v in enumerate(up_i):
            if v in pos:
                return up_i[:k + 1] + up_j[:pos[v]][::-1]
        raise AssertionError("chains with one anchor share it")

    def _route(self, i: int, j: int, salt: str) -> list[int]:
        if i == j:
            return [i]
        up_i, up_j = self._chain(i), self._chain(j)
        a, b = up_i[-1], up_j[-1]
        if a == b:
            return self._tree_path(up_i, up_j)
        label = self._label
        u, mid = a, [a]
        dist = self._dist_to(b)
        if dist is None:
            dag = self._dag(a, b, count=True)
            while u != b:
                nxt = dag.next(u)
                u = nxt[0] if len(nxt) == 1 else nxt[_stable_hash(salt + label[u]) % len(nxt)]
                mid.append(u)
        else:
            dist, succ = dist
            if dist[a] < 0:
                self._unreachable(a, b)
            cadj = self._cadj
            while u != b:
                nxt = succ.get(u)
                if nxt is None:
                    left = dist[u]
                    nxt = succ[u] = tuple(v for v, c in cadj[u] if dist[v] == left - c)
                u = nxt[0] if len(nxt) == 1 else nxt[_stable_hash(salt + label[u]) % len(nxt)]
                mid.append(u)
        return up_i[:-1] + mid + up_j[:-1][::-1]

    #: Nodes settled by pair searches towards one node (a cached search counts 1) before it
    #: gets a distance map; None: an eighth of the core's nodes (at least 8).
    _DIST_AFTER = None

    def _dist_to(self, b: int):
        """The distance (cost) from every core node to core node ``b`` (-1: unreachable) and
        a dict of next hops found so far, once the routes towards ``b`` have searched enough
        to pay for it; else None (the caller's pair search adds its work)."""
        dist = self._dists.get(b)
        if dist is not None:
            self._dists.move_to_end(b)
            return dist
        after = self._dist_after if self._DIST_AFTER is None else self._DIST_AFTER
        if self._work.get(b, 0) + 1 < after:
            return None
        dist = (self._distances(b), {})
        self._dists[b] = dist
        if len(self._dists) > self._max_dists:
            self._dists.popitem(last=False)
        return dist

    def _distances(self, b: int):
        """Cost from every node to core node ``b`` over core links (-1: unreachable).

        Dijkstra in compiled code (scipy.sparse.csgraph; costs are symmetric, so distances
        from ``b`` are distances to it) when every cost sum is an integer a float64 holds
        exactly, else in Python: a 512-GPU cluster needs ~600 maps, 2.4 ms each in Python.
        Every sum Dijkstra forms is at most the longest distance plus the dearest link, so
        that bound, checked on the result, proves the map exact (a bound on the sum of all
        costs refused every cluster from 8,192 GPUs)."""
        if self._csr is None:
            self._dearest = max((c for lst in self._cadj for _, c in lst), default=0)
            self._csr = False
            if self._dearest < 1 << 52:
                from scipy.sparse import csr_matrix

                rows = [u for u, lst in enumerate(self._cadj) for _ in lst]
                cols = [v for lst in self._cadj for v, _ in lst]
                costs = [float(c) for lst in self._cadj for _, c in lst]
                n = len(self._cadj)
                self._csr = csr_matrix((costs, (rows, cols)), shape=(n, n))
        if self._csr is not False:
            import numpy as np
            from scipy.sparse.csgraph import dijkstra

            d = dijkstra(self._csr, directed=True, indices=b)
            reach = np.isfinite(d)
            if float(d[reach].max()) + self._dearest < 1 << 53:
                return array("q", np.where(reach, d, -1).astype(np.int64).tobytes())
        cadj = self._cadj
        best = [-1] * len(cadj)
        best[b] = 0
        heap = [(0, b)]
        done = [False] * len(cadj)
        while heap:
            d, u = heapq.heappop(heap)
            if done[u]:
                continue
            done[u] = True
            for v, c in cadj[u]:
                nd = d + c
                if not done[v] and (best[v] < 0 or nd < best[v]):
                    best[v] = nd
                    heapq.heappush(heap, (nd, v))
        # Over ~8.8 s of path latency the costs leave int64: keep Python ints then.
        return array("q", best) if max(best) < 1 << 63 else best

    def _unreachable(self, a: int, b: int):
        raise RoutingError(f"no path between {self._names[a]!r} and {self._names[b]!r} "
                           f"(the topology is partitioned)")

    def _dag(self, a: int, b: int, count: bool = False) -> "_Dag":
        """The equal-cost shortest-path DAG from core node a to b; ``count``: add the
        search's work (nodes settled, 1 when cached) to ``b``'s."""
        key = (a, b)
        dag = self._dags.get(key)
        if dag is not None:
            self._dags.move_to_end(key)
            if count:
                self._work[b] = self._work.get(b, 0) + 1
            return dag
        dag, work = self._search(a, b)
        if count:
            self._work[b] = self._work.get(b, 0) + work
        self._dags[key] = dag
        if len(self._dags) > self._max_dags:
            self._dags.popitem(last=False)
        return dag

    def _search(self, a: int, b: int) -> tuple:
        """``(_Dag, nodes settled)`` of the pair search from a to b."""
        cadj = self._cadj
        inf = math.inf
        settled = ({}, {})
        tent = ({a: 0}, {b: 0})
        heaps = ([(0, a)], [(0, b)])
        mu = inf
        # Phase 1: bidirectional Dijkstra until the cost D of the best route is known.
        while heaps[0] and heaps[1]:
            tf, tb = heaps[0][0][0], heaps[1][0][0]
            if tf + tb >= mu:
                break
            side = 0 if tf <= tb else 1
            d, u = heapq.heappop(heaps[side])
            S = settled[side]
            if u in S:
                continue
            S[u] = d
            T, O, H = tent[side], tent[1 - side], heaps[side]
            for v, c in cadj[u]:
                if v in S:
                    continue
                nd = d + c
                if nd < T.get(v, inf):
                    T[v] = nd
                    heapq.heappush(H, (nd, v))
                o = O.get(v)
                if o is not None and nd + o < mu:
                    mu = nd + o
        if b in settled[0]:
            mu = min(mu, settled[0][b])
        if a in settled[1]:
            mu = min(mu, settled[1][a])
        if mu == inf:
            self._unreachable(a, b)
        D = mu
        # Phase 2: complete both balls to radius D/2: every node of a shortest path lies in one.
        for side, r in ((0, D // 2), (1, D - D // 2)):
            S, T, H = settled[side], tent[side], heaps[side]
            while H and H[0][0] <= r:
                d, u = heapq.heappop(H)
                if u in S:
                    continue
                S[u] = d
                if d < r:  # costs are >= 1, so a node at radius r reaches nothing within r
                    for v, c in cadj[u]:
                        nd = d + c
                        if v not in S and nd < T.get(v, inf):
                            T[v] = nd
                            heapq.heappush(H, (nd, v))
        F, B = settled
        # rem[x]: cost from x to b along a shortest a-b path. Exact for backward nodes; forward
        # nodes are on a shortest path iff some neighbour continues one (decreasing ds order).
        rem = dict(B)
        for x in sorted((x for x in F if x not in B), key=F.__getitem__, reverse=True):
            want = D - F[x]
            if any(rem.get(v) == want - c for v, c in cadj[x]):
                rem[x] = want
        return _Dag(self, rem), len(F) + len(B)


#: Nodes with more links than this (and than the search's balls have nodes) find their
#: next hops from the balls rather than by scanning every link (a spine of a 65,536-GPU
#: fabric has 2,048).
_WIDE = 16


class _Dag:
    """The equal-cost DAG of one pair search: ``rem[x]``, the cost from x to the destination
    along a shortest route, for the nodes of the two balls; each node's next hops (its
    neighbours that continue a shortest route, in the order of its links) are found when a
    route first walks through it. Walking one route through a spine then costs the balls'
    few nodes, not the spine's thousands of links, and a DAG whose routes all take one spine
    never looks at the others."""

    __slots__ = ("router", "rem", "succ")

    def __init__(self, router: Router, rem: dict):
        self.router, self.rem, self.succ = router, rem, {}

    def next(self, u: int) -> tuple:
        nxt = self.succ.get(u)
        if nxt is None:
            rem, cadj = self.rem, self.router._cadj
            r = rem[u]
            if len(cadj[u]) > _WIDE and len(cadj[u]) > len(rem):
                links = self.router._wide(u, cadj)
                found = [links[v] + (v,) for v in rem if v in links]
                nxt = tuple(v for _, c, v in sorted(found) if rem[v] == r - c)
            else:
                nxt = tuple(v for v, c in cadj[u] if rem.get(v) == r - c)
            self.succ[u] = nxt
        return nxt


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
    fp = hash((tuple(G.nodes), tuple((u, v, d.get("latency")) for u, v, d in G.edges(data=True))))
    hit = _SHARED.get(G)
    if hit is None or hit[0] != fp:
        hit = _SHARED[G] = (fp, Router(G))
    return hit[1]

