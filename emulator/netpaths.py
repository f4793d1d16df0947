"""The paths a schedule's transfers take, routed once per topology and kept.

Routing is the costly part of setting a simulation up: a 1024-GPU all-to-all has a million
(source, destination) pairs and :class:`topologies.Router` spends tens of microseconds on
each. A study simulates dozens of collectives on one graph, a size sweep the same collective
at every size, so the routes of a graph are cached with it: in a weak dictionary keyed by the
graph object (dropped with it) and checked against a fingerprint of its links, bandwidths,
latencies and GPUs, so a graph changed in place is routed afresh.

Channel ids are the graph's directed links in edge order (u -> v, then v -> u), the same
whatever was simulated before. A path is the channel sequence of one (route, source GPU,
destination GPU); routes other than the default one (:class:`emulator.Route`) that cross the
same channels share a path id, so their flows share one entity in the engine.
"""
from __future__ import annotations

import weakref
from array import array

import numpy as np

from .collectives import Schedule
from .errors import ConfigError

__all__ = ["Network"]

_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: The last :meth:`Network.of`: (schedule structure, routes table, Network).
_KEPT: dict = {}


def _fingerprint(G, gpus) -> int:
    import topologies

    return hash((topologies.fingerprint(G, node_data=False), tuple(gpus)))


class _Routes:
    """Every path routed so far on one graph: global CSR, latencies, lookup tables."""

    def __init__(self, G, gpus):
        import topologies

        self.router = topologies.router_of(G)
        self.gpus = list(gpus)
        self.chan_of: dict = {}           # u -> {v: id of channel u -> v}
        channels, cap, lat = [], [], []
        for u, v, d in G.edges(data=True):
            for a, b in ((u, v), (v, u)):
                self.chan_of.setdefault(a, {})[b] = len(channels)
                channels.append((a, b))
                cap.append(float(d["bandwidth"]))
                lat.append(float(d["latency"]))
        self.channels = channels
        self.capacity = np.array(cap)
        self.chan_lat = np.array(lat)
        n = len(self.gpus)
        self.default = _Pairs(n)                           # (src, dst) -> path, Route()
        self.other: dict = {}                              # (Route, src, dst) -> path
        self.by_channels: dict = {}                        # channel tuple -> path (routes)
        self._legs: dict = {}                              # (a, b, flow) -> channel ids
        self._ids: dict = {}                               # node path -> channel ids
        self.ptr = array("q", [0])        # compact growing CSR (a list of ints costs 36 B each)
        self.chan = array("q")
        self._ptr = np.zeros(1, dtype=np.int64)
        self._chan = np.zeros(0, dtype=np.int64)
        self._lat = np.zeros(0)

    def _add(self, ids: list) -> int:
        """A new path (its latency is summed in :meth:`_sync`)."""
        self.chan.extend(ids)
        self.ptr.append(len(self.chan))
        return len(self.ptr) - 2

    def _route(self, route, s: int, d: int) -> list:
        nodes = self.gpus
        stops = (nodes[s], *route.via, nodes[d])
        out: list = []
        for a, b in zip(stops, stops[1:]):
            out.extend(self._leg(a, b, route.flow))
        return out

    def _leg(self, a, b, flow: int) -> tuple:
        """Channel ids of the routed path ``a -> b`` with ECMP label ``flow``, kept: the legs
        of waypoint routes repeat (NCCL's all-to-all sends every pair of nodes' GPUs through
        the same NIC-to-NIC legs)."""
        key = (a, b, flow)
        hit = self._legs.get(key)
        if hit is None:
            p = self.router.path(a, b, flow)
            # a machine's legs take one route whatever the flow (topologies.Router keeps
            # those per pair): their channel ids are kept per route, not per flow
            hit = self._ids.get(p)
            if hit is None:
                chan_of = self.chan_of
                hit = self._ids[p] = tuple(map(dict.__getitem__, map(chan_of.__getitem__, p[:-1]),
                                               p[1:]))
            self._legs[key] = hit
        return hit

    def _default_path(self, route, s: int, d: int) -> int:
        """The default route's path id of (s, d), a pair without one yet (:meth:`paths`
        asks only :meth:`_Pairs.missing` ones). The numpy copies are synced once per
        :meth:`paths` call, not per path: per path they made a million-pair all-to-all
        quadratic."""
        chans = self._route(route, s, d)
        # a waypoint route routed before may have crossed the same channels: one path
        pid = self.by_channels.get(tuple(chans)) if self.by_channels else None
        pid = self._add(chans) if pid is None else pid
        self.default.set(s * len(self.gpus) + d, pid)
        return int(pid)

    def paths(self, routes, route_idx: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Global path ids of the (route, src, dst) triples (arrays of equal length)."""
        n = len(self.gpus)
        out = np.full(len(src), -1, dtype=np.int64)
        default = route_idx == 0
        key = src * n + dst if default.all() else src[default] * n + dst[default]
        for k in self.default.missing(key).tolist():
            self._default_path(routes[0], *divmod(k, n))
        out[default] = self.default.lookup(key)
        rest = np.flatnonzero(~default)
        if len(rest):
            # One int64 key per (route, src, dst): unique on rows sorts a void dtype, ~20x slower.
            key = (route_idx[rest].astype(np.int64) * n + src[rest]) * n + dst[rest]
            uniq, inverse = np.unique(key, return_inverse=True)
            # each pair's default path so far, looked up at once (the loop adds none)
            bases = self.default.lookup((uniq // n) % n * n + uniq % n).tolist()
            ids = []
            for k, base in zip(uniq.tolist(), bases):
                rs, d = divmod(k, n)
                r, s = divmod(rs, n)
                k = (routes[r], s, d)
                pid = self.other.get(k)
                if pid is None:
                    chans = tuple(self._route(routes[r], s, d))
                    pid = self.by_channels.get(chans)
                    if pid is None:
                        # the only other path that can cross the same channels is the default
                        # route's between the same GPUs; routing it just to compare would
                        # double a million-pair all-to-all's routing, so only one routed
                        # already is compared (:meth:`_default_path` compares the other way)
                        same = base >= 0 and tuple(
                            self.chan[self.ptr[base]:self.ptr[base + 1]]) == chans
                        pid = base if same else self._add(list(chans))
                        self.by_channels[chans] = pid
                    self.other[k] = pid
                ids.append(pid)
            out[rest] = np.asarray(ids, dtype=np.int64)[np.ravel(inverse)]
        if len(self.ptr) - 1 != len(self._lat):
            self._sync()
        return out

    def _sync(self) -> None:
        """numpy copies of the CSR, and the latencies of the paths added since the last."""
        self._ptr = np.array(self.ptr, dtype=np.int64)
        self._chan = np.array(self.chan, dtype=np.int64)
        done = len(self._lat)
        ptr = self._ptr[done:]
        lens = np.diff(ptr)
        # Sum along each path in route order, as a float sum along the route adds them.
        lat = np.zeros(len(lens))
        pos = ptr[:-1].copy()
        for k in range(int(lens.max()) if len(lens) else 0):
            at = k < lens
            lat[at] += self.chan_lat[self._chan[pos[at] + k]]
        self._lat = np.concatenate([self._lat, lat])


class _Pairs:
    """(source, destination) GPU pair -> path id (-1: none yet), for keys ``s * n + d``.

    A dense array of n**2 entries up to 4,096 GPUs (128 MB), as it always was: one gather per
    lookup, and a flag per pair finds the missing ones without sorting millions of keys.
    Beyond, sorted keys and a binary search (n**2 entries are 512 MB at 8,192 GPUs and 34 GB
    at 65,536; a collective uses a few pairs per GPU), with new pairs merged in per call."""

    DENSE = 1 << 24

    def __init__(self, n: int):
        self.n2 = n * n
        self.dense = np.full(self.n2, -1, dtype=np.int64) if self.n2 <= self.DENSE else None
        self.keys = np.zeros(0, dtype=np.int64)
        self.vals = np.zeros(0, dtype=np.int64)
        self.new: dict = {}

    def set(self, k: int, v: int) -> None:
        if self.dense is not None:
            self.dense[k] = v
        else:
            self.new[k] = v

    def _merge(self) -> None:
        if self.new:
            keys = np.concatenate([self.keys, np.fromiter(self.new, dtype=np.int64)])
            vals = np.concatenate([self.vals, np.fromiter(self.new.values(), dtype=np.int64)])
            order = np.argsort(keys, kind="stable")
            self.keys, self.vals = keys[order], vals[order]
            self.new = {}

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        if self.dense is not None:
            return self.dense[keys]
        self._merge()
        i = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        if not len(self.keys):
            return np.full(len(keys), -1, dtype=np.int64)
        return np.where(self.keys[i] == keys, self.vals[i], -1)

    def missing(self, keys: np.ndarray) -> np.ndarray:
        """The distinct keys without a path yet, in increasing order."""
        if self.dense is not None:
            seen = np.zeros(self.n2, dtype=bool)
            seen[keys[self.dense[keys] < 0]] = True
            return np.flatnonzero(seen)
        return np.unique(keys[self.lookup(keys) < 0])


def _routes_of(G, gpus) -> _Routes:
    fp = _fingerprint(G, gpus)
    hit = _CACHE.get(G)
    if hit is not None and hit[0] == fp:
        return hit[1]
    routes = _Routes(G, gpus)
    _CACHE[G] = (fp, routes)
    return routes


class Network:
    """Routes, channel capacities and latencies of the paths a schedule uses.

    Attributes
    ----------
    pair_of : ndarray of int
        Path of each transfer (local steps share one path with no channel).
    pair_ptr, pair_chan : ndarray of int
        The paths' channel ids (CSR), in route order.
    pair_lat : ndarray of float
        Latency of each path (s): the sum of its links'.
    channels : list of (u, v)
        Every directed channel of the graph; ``capacity`` their bytes/s.
    derived : dict
        What the engine derives from the schedule's structure, kept here for the schedules
        this network serves (:meth:`of`).
    """

    @classmethod
    def of(cls, G, schedule: Schedule) -> "Network":
        """``Network(G, schedule)``, kept for the next schedule of the same
        :attr:`~emulator.Schedule.structure` on the same routes (a collective's other sizes,
        :meth:`emulator.Schedule.resized`): the paths depend on who sends to whom by which
        route, not on the bytes. One is kept (at 1024 GPUs it holds a path id per transfer, and
        the engine's :attr:`derived` arrays)."""
        import topologies

        table = _routes_of(G, topologies.gpus(G))
        kept = _KEPT.get("net")
        if kept is not None and kept[0] is schedule.structure and kept[1] is table:
            return kept[2]
        _KEPT.clear()
        net = cls(G, schedule)
        _KEPT["net"] = (schedule.structure, table, net)
        return net

    def __init__(self, G, schedule: Schedule):
        import topologies

        self.G = G
        self.nodes = topologies.gpus(G)
        n_gpus = len(self.nodes)
        bad = [r for r in schedule.ranks if r >= n_gpus]
        if bad:
            raise ConfigError(f"ranks {bad[:5]} are not in the topology "
                              f"{G.graph.get('name', '')!r} ({n_gpus} GPUs, ranks 0..{n_gpus - 1})")
        for route in schedule.routes:
            missing = [v for v in route.via if v not in G]
            if missing:
                raise ConfigError(f"route via {missing[0]!r} is not a node of the topology "
                                  f"{G.graph.get('name', '')!r}")
        table = _routes_of(G, self.nodes)
        moving = schedule.src != schedule.dst
        if moving.all():                # no local steps: the arrays as they are, no copies
            net = slice(None)
            glob = table.paths(schedule.routes, schedule.route, schedule.src, schedule.dst)
        else:
            net = np.flatnonzero(moving)
            glob = table.paths(schedule.routes, schedule.route[net], schedule.src[net],
                               schedule.dst[net])
        # Local ids: the used global paths in order of id, then one empty path for local steps.
        used = np.zeros(len(table._lat) + 1, dtype=bool)
        used[glob] = True
        used[-1] = True
        local = np.cumsum(used) - 1
        keep = np.flatnonzero(used[:-1])
        self.pair_of = np.full(len(schedule), local[-1], dtype=np.int64)
        self.pair_of[net] = local[glob]
        lens = table._ptr[keep + 1] - table._ptr[keep]
        self.pair_ptr = np.zeros(len(keep) + 2, dtype=np.int64)
        np.cumsum(lens, out=self.pair_ptr[1:-1])
        self.pair_ptr[-1] = self.pair_ptr[-2]
        starts = np.repeat(table._ptr[keep] - self.pair_ptr[:-2], lens)
        self.pair_chan = table._chan[starts + np.arange(int(self.pair_ptr[-1]))]
        self.pair_lat = np.append(table._lat[keep], 0.0)
        self.channels = table.channels
        self.capacity = table.capacity
        self.derived: dict = {}

    def entries(self, pair_ids: np.ndarray):
        """(flow index, channel id) entries of flows with these pair ids."""
        starts = self.pair_ptr[pair_ids]
        lens = self.pair_ptr[pair_ids + 1] - starts
        total = int(lens.sum())
        flow = np.repeat(np.arange(len(pair_ids)), lens)
        offs = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
        return flow, self.pair_chan[np.repeat(starts, lens) + offs]

    def channel_bytes(self, schedule: Schedule) -> np.ndarray:
        """Bytes each channel carries over the whole schedule (int64)."""
        n_paths = len(self.pair_ptr) - 1
        per_path = np.bincount(self.pair_of, weights=schedule.size.astype(np.float64),
                               minlength=n_paths)
        owner = np.repeat(np.arange(n_paths), np.diff(self.pair_ptr))
        return np.rint(np.bincount(self.pair_chan, weights=per_path[owner],
                                   minlength=len(self.capacity))).astype(np.int64)
