"""Routes between machines through the fabric, from the fabric's own structure.

NCCL's network hops go from a NIC of one machine to a NIC of another. A search of the whole
graph per pair settles each machine's interior, its leaf's other NICs and every spine; a
65,536-GPU cluster asks it for 200,000 pairs. But a cluster is machines (nodes with a ``host``
attribute) hung on a fabric (the nodes without one), and a fabric is small and regular: 2,080
switches for 65,536 GPUs. So the router answers a NIC-to-NIC route from two tables per
destination leaf, over the fabric's switches only:

- ``DF``: the distance from every switch to the leaf over switch-to-switch links;
- ``DV``: the same over those links and *transits*: a virtual link between two switches for
  every way through a machine (in at one NIC, through the machine's own links, out at
  another), at the machine's inside distance; costs doubled and a transit's less one, so that
  ``DV == 2 DF`` proves that no route through a machine is as short as the fabric's.

Every route of the graph between two switches is a fabric route with transits (each visit to a
machine is one), so ``DV / 2`` is a lower bound of the graph's distance and ``DF`` an upper
one. A route from NIC ``a`` (machine A) to NIC ``b`` (machine B) is ``a``, its leaf, the
fabric's equal-cost routes to ``b``'s leaf, ``b``, when that is strictly shorter than any
other way out of A and into B (every pair of A's and B's NIC links, inside distances from
the machines' own analysis, :class:`topologies.hosts.LocalRoutes`) and no transit ties the
fabric between the two leaves. Then the graph's equal-cost routes are exactly those, their
next hops at every switch are its fabric neighbours one ``DF`` step closer, in the order of
its links, and the router's hash picks among them as it would after a search. Pairs that
fail the proof (a PXN-like shortcut through a machine, an irregular fabric) are searched.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["FabricRoutes"]

#: Pairs per array in :meth:`FabricRoutes.prove` (8 x 8 ways: 2 MB of float64 per batch).
_BATCH = 4096
#: Most switches whose tables :func:`_all_pairs` makes by Floyd-Warshall: its m**3 sums cost
#: about what importing scipy's graph routines does at ~400 switches.
_DENSE_UP_TO = 384


def _all_pairs(m: int, rows, cols, cost: np.ndarray) -> np.ndarray:
    """Shortest distances between all ``m`` nodes of the directed links ``rows[k] ->
    cols[k]`` of ``cost[k]`` (inf: unreachable). Up to :data:`_DENSE_UP_TO` nodes by
    Floyd-Warshall over a dense array (288 switches for 8,192 GPUs: 0.04 s), beyond by
    scipy's compiled Dijkstra (whose import alone costs 0.25 s); the costs are whole numbers
    whose sums stay exact in a float64 (the caller checks), so both give the same table."""
    if m > _DENSE_UP_TO:
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import dijkstra

        return dijkstra(csr_matrix((cost, (rows, cols)), shape=(m, m)), directed=True)
    D = np.full((m, m), np.inf)
    np.minimum.at(D, (np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)), cost)
    np.fill_diagonal(D, 0.0)
    for k in range(m):
        np.minimum(D, D[:, k, None] + D[None, k, :], out=D)
    return D


class FabricRoutes:
    """The fabric of a router's graph and its per-destination-leaf tables.

    Parameters
    ----------
    router : topologies.Router
        Its adjacency (costs, links in name order), ``host`` attributes and per-kind machine
        analysis.

    Attributes
    ----------
    ok : bool
        The graph is machines on a fabric: some ``host`` nodes, every link that leaves a
        machine ends at a fabric node, and the fabric's costs fit a float64 exactly.
    """

    def __init__(self, router):
        self.router = router
        host = router._host
        adj = router._adj
        n = len(adj)
        fab = [k for k in range(n) if host[k] is None]
        self.ok = bool(fab) and len(fab) < n
        self.index = {x: i for i, x in enumerate(fab)}        # node -> fabric index
        self.nodes = fab
        self.exits: dict = {}          # host node -> ((fabric node, link cost), ...)
        if not self.ok:
            return
        index = self.index
        for k in range(n):
            if host[k] is None:
                continue
            out = []
            for v, c in adj[k]:
                if host[v] is None:
                    out.append((v, c))
                elif host[v] != host[k]:
                    self.ok = False             # machines joined directly: not a fabric
                    return
            if out:
                self.exits[k] = tuple(out)
        rows, cols, cost = [], [], []
        for x in fab:
            for v, c in adj[x]:
                if host[v] is None:
                    rows.append(index[x])
                    cols.append(index[v])
                    cost.append(c)
        self._fabric = (rows, cols, cost)
        transits: dict = {}
        seen = set()
        for h, members in self._machines().items():
            ex = [x for x in members if x in self.exits]
            desc, pos = self._kind(h)
            # copies of one machine on the same switches offer the same transits
            key = (desc, tuple((pos[x], self.exits[x]) for x in ex))
            if key in seen:
                continue
            seen.add(key)
            dist = router._host_kinds[desc][0].dist
            for x in ex:
                for y in ex:
                    d = dist[pos[x]][pos[y]]
                    if x == y or d == math.inf:
                        continue
                    inside = int(d)
                    for lx, cx in self.exits[x]:
                        for ly, cy in self.exits[y]:
                            if lx != ly:
                                k2 = (index[lx], index[ly])
                                c = cx + inside + cy
                                if c < transits.get(k2, math.inf):
                                    transits[k2] = c
        self._transits = transits
        # Every sum the doubled tables form is at most their longest distance plus their
        # dearest link: checked on the tables (_tables), so a link must leave room.
        self._dearest = 2.0 * max(max(cost, default=0), max(transits.values(), default=0))
        if self._dearest >= 1 << 51:
            self.ok = False
            return
        self._adj = [tuple((v, c) for v, c in adj[x] if host[v] is None) for x in fab]
        self._nbr: dict = {}           # fabric index -> (neighbour indices, costs) arrays
        self._succ: dict = {}          # (switch, destination) -> next hops
        self._way: dict = {}           # machine node -> its ways out (see _ways)
        self._exits_by_host: dict = {}  # machine -> its links out (see _exits_of)
        self._proved: dict = {}        # (node, node) -> route() of the pair
        self._DF = self._DV = None

    def _machines(self) -> dict:
        r = self.router
        if r._hosts is None:
            r._describe_host(next(h for h in r._host if h is not None))
        return r._hosts

    def _kind(self, h) -> tuple:
        """(description, node -> position) of machine ``h`` (the router's, made on demand)."""
        r = self.router
        kind = r._host_kind.get(h)
        if kind is None:
            kind = r._host_kind[h] = r._describe_host(h)
        return kind

    def _tables(self):
        """``(DF, DV)``: every switch's distance to every switch over the fabric's links,
        and over links and transits doubled with a transit one less (module docstring);
        all pairs at once (:func:`_all_pairs`; 2,080 switches: 2 x 35 MB). A table whose sums
        could leave a float64's exact integers is replaced by inf: no route is proved."""
        if self._DF is None:
            rows, cols, cost = self._fabric
            m = len(self.nodes)
            best: dict = {}
            for a, b, c in zip(rows, cols, cost):
                best[(a, b)] = min(best.get((a, b), math.inf), 2.0 * c)
            for (a, b), c in self._transits.items():       # a transit may beat a link
                best[(a, b)] = min(best.get((a, b), math.inf), 2.0 * c - 1.0)
            keys = list(best)
            DF = _all_pairs(m, rows, cols, np.asarray(cost, dtype=float))
            DV = _all_pairs(m, [k[0] for k in keys], [k[1] for k in keys],
                            np.array([best[k] for k in keys]))
            far = max(float(DF[np.isfinite(DF)].max()), float(DV[np.isfinite(DV)].max()))
            if far + self._dearest >= 1 << 53:
                DF = np.full_like(DF, np.inf)
            self._DF, self._DV = DF, DV
        return self._DF, self._DV

    def route(self, a: int, b: int):
        """``(leaf of a, leaf of b, destination index)`` when every shortest route from
        ``a`` to ``b`` is ``a``, that leaf, fabric switches, ``b``'s leaf, ``b`` (module
        docstring); else None."""
        key = (a, b)
        if key not in self._proved:
            self.prove([key])
        return self._proved[key]

    def prove(self, pairs) -> None:
        """:meth:`route` of many node pairs ``(a, b)`` at once, kept for :meth:`route`: the
        same checks pair by pair, and the same sums and minimum over every other way out of
        ``a``'s machine and into ``b``'s, as one array of ``(pairs, ways, ways)`` per batch.
        NCCL's trees on 8,192 GPUs ask 30,000 NIC pairs; one by one, the small arrays'
        overheads cost about two seconds."""
        todo = [k for k in dict.fromkeys(pairs) if k not in self._proved]
        if not todo:
            return
        index, host, proved, exits = self.index, self.router._host, self._proved, self.exits
        one = []                # pairs of nodes with one link out each, on two machines
        for a, b in todo:
            ea, eb = exits.get(a), exits.get(b)
            if ea is None or eb is None or host[a] == host[b] or len(ea) != 1 or len(eb) != 1:
                proved[(a, b)] = None
            else:
                one.append((a, b, ea[0], eb[0]))
        if not one:
            return
        DF, DV = self._tables()
        # the per-pair table checks over arrays (65,536 ring legs on 65,536 GPUs)
        ia = np.fromiter((index[ea[0]] for _, _, ea, _ in one), dtype=np.int64, count=len(one))
        ib = np.fromiter((index[eb[0]] for _, _, _, eb in one), dtype=np.int64, count=len(one))
        ca = np.fromiter((ea[1] for _, _, ea, _ in one), dtype=float, count=len(one))
        cb = np.fromiter((eb[1] for _, _, _, eb in one), dtype=float, count=len(one))
        df, dv = DF[ia, ib], DV[ia, ib]
        good = np.isfinite(df) & (dv == 2.0 * df)
        direct = (ca + df + cb).tolist()    # as ``ca + DF[ia, ib] + cb`` pair by pair
        ready = []
        for k, ok in enumerate(good.tolist()):
            a, b, ea, eb = one[k]
            if ok:
                ready.append((a, b, ea[0], eb[0], int(ib[k]), direct[k]))
            else:
                proved[(a, b)] = None
        for at in range(0, len(ready), _BATCH):
            self._prove(ready[at:at + _BATCH], DV)

    def _prove(self, ready: list, DV) -> None:
        """:meth:`prove` of pairs that passed the per-pair checks: ``(a, b, leaf of a, leaf
        of b, b's leaf's index, the direct route's cost)`` each."""
        sides = []
        for end in (0, 1):
            nodes = {x: k for k, x in enumerate(dict.fromkeys(r[end] for r in ready))}
            ways = [self._ways(x) for x in nodes]
            w = max(len(x[0]) for x in ways)
            leaf = np.zeros((len(ways), w), dtype=np.int64)
            cost = np.full((len(ways), w), np.inf)         # a missing way: never the least
            own = np.empty(len(ways), dtype=np.int64)      # the row of the node's own link
            for k, (x, lx, c, mine) in enumerate(ways):
                leaf[k, :len(lx)] = lx
                cost[k, :len(c)] = c
                own[k] = mine
            at = np.fromiter((nodes[row[end]] for row in ready), dtype=np.int64,
                             count=len(ready))
            sides.append((leaf[at], cost[at], own[at]))
        (lxa, A, ra), (lyb, B, rb) = sides
        # per pair, every other way's cost: (A + DV / 2) + B, in that order
        alt = A[:, :, None] + DV[lxa[:, :, None], lyb[:, None, :]] / 2.0 + B[:, None, :]
        mine = np.flatnonzero((ra >= 0) & (rb >= 0))
        alt[mine, ra[mine], rb[mine]] = np.inf             # the direct way itself
        least = alt.reshape(len(ready), -1).min(axis=1)
        for (a, b, la, lb, ib, direct), m in zip(ready, least.tolist()):
            self._proved[(a, b)] = None if m <= direct else (la, lb, ib)

    def _ways(self, a: int) -> tuple:
        """Arrays over every link out of ``a``'s machine reachable inside it: the exit node,
        its switch's fabric index, and the inside distance from ``a`` plus the link's cost;
        and the row of ``a``'s own link (-1: none, or several); kept per node."""
        hit = self._way.get(a)
        if hit is None:
            r = self.router
            h = r._host[a]
            pos, local, _ = r._host_routes(h)
            dist = local.dist[pos[a]]
            rows = []
            for x, px, lx, cx in self._exits_of(h):
                dx = dist[px]
                if dx != math.inf:
                    rows.append((x, lx, dx + cx))
            own = [k for k, row in enumerate(rows) if row[0] == a]
            hit = self._way[a] = (np.array([x for x, _, _ in rows], dtype=np.int64),
                                  np.array([lx for _, lx, _ in rows], dtype=np.int64),
                                  np.array([c for _, _, c in rows], dtype=float),
                                  own[0] if len(own) == 1 else -1)
        return hit

    def _exits_of(self, h) -> tuple:
        """``(node, its position, switch's fabric index, link cost)`` of every link out of
        machine ``h``, in the order of its nodes and their links; kept per machine (each of
        its nodes' :meth:`_ways` reads them)."""
        hit = self._exits_by_host.get(h)
        if hit is None:
            pos = self.router._host_routes(h)[0]
            hit = self._exits_by_host[h] = tuple(
                (x, pos[x], self.index[lx], cx) for x in self._machines()[h]
                for lx, cx in self.exits.get(x, ()))
        return hit

    def next_hops(self, u: int, dest: int) -> tuple:
        """Fabric neighbours of switch ``u`` one ``DF`` step closer to fabric index
        ``dest``, in the order of ``u``'s links."""
        key = (u, dest)
        nxt = self._succ.get(key)
        if nxt is None:
            iu = self.index[u]
            nbr = self._nbr.get(iu)
            if nbr is None:
                links = self._adj[iu]
                nbr = self._nbr[iu] = (np.array([self.index[v] for v, _ in links], dtype=np.int64),
                                       np.array([c for _, c in links], dtype=float),
                                       tuple(v for v, _ in links))
            DF = self._DF
            hit = np.flatnonzero(DF[nbr[0], dest] + nbr[1] == DF[iu, dest])
            nxt = self._succ[key] = tuple(nbr[2][k] for k in hit)
        return nxt

    def walks(self, la: int, lb: int, dest: int, limit: int) -> tuple:
        """The fabric's equal-cost switch sequences from leaf ``la`` to leaf ``lb`` (fabric
        index ``dest``), both included: the first ``limit`` of a depth-first walk that takes
        each switch's :meth:`next_hops` in order. :meth:`topologies.Router.equal_cost_paths`
        keeps them per leaf pair, named and ordered: NCCL's ring search asks the same leaves
        for every NIC pair behind them (8,192 legs on 8,192 GPUs, two seconds walked one by
        one)."""
        out: list = []

        def walk(u, acc):
            if len(out) >= limit:
                return
            if u == lb:
                out.append(tuple(acc))
                return
            for v in self.next_hops(u, dest):
                walk(v, acc + [v])

        walk(la, [la])
        return tuple(out)
