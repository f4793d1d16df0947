"""Route searches over a topology's core: the equal-cost DAG of a pair and distance maps.

:class:`CoreSearch` is the part of :class:`topologies.Router` that finds routes the shortcuts
(a direct link, a route inside one machine, the fabric's tables) do not give. Two facts keep
it fast on clusters of 10**4 GPUs:

1. A route search is bidirectional: it settles only the nodes within half the route's cost
   of either end. Every node of a shortest path is in one of those two balls (its distance to
   one end is at most half the total), so the equal-cost DAG is exact while a search between
   two GPUs of one DGX never looks past its NVSwitch, and one between leaves never expands the
   spines' fan-out.
2. A destination many routes lead to (all-to-all: every GPU is one) gets one single-source
   search instead: its distance to every node. The equal-cost next hops at u are then the
   neighbours v with ``dist(v) == dist(u) - cost(u, v)``, found while walking, with no search
   per pair. They are the same next hops, in the same order, as the DAG of the pair search.
   A destination buys its map once the pair searches towards it have settled as many nodes
   as a fraction of the graph (the rent-or-buy rule): a GPU that only its own machine's NICs
   and GPUs route to (NCCL's analysis of a 1024-machine cluster asks 15 such routes per GPU,
   each settling a dozen nodes) never pays for a search of the whole cluster, which made that
   analysis quadratic in the machines (20 s at 2048 GPUs), while an all-to-all's
   destinations, searched from everywhere, buy theirs after a few dozen routes.

The state it reads (``_adj``, ``_cadj``, ``_core``, ``_parent``, ``_label``, ``_names``,
``_dists``, ``_dags``, ``_work``, ``_wides``, ``_csr``, the caches' bounds) is the router's own.
"""
from __future__ import annotations

import hashlib
import heapq
import math
from array import array

from .errors import RoutingError

__all__ = ["CoreSearch"]


def _stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process (unlike the salted ``hash``).

    BLAKE2b rather than CRC-32: CRC is linear, so its low bits barely change between flow
    keys that differ in a few characters, and ``% 2`` would send them all the same way.
    """
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class CoreSearch:
    """Pair searches and distance maps of a :class:`topologies.Router` (mixed into it)."""

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

    def __init__(self, router: "CoreSearch", rem: dict):
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
