"""Schedules of collectives as NCCL runs them, for one (algorithm, protocol) and channel set.

Common to every builder (NCCL's cost model, src/graph/tuning.cc, made into transfers):

- the message is split across channels, each channel moving its share over its own ring or
  trees (:mod:`.channels`);
- a hop takes the protocol's per-step latency (``hwLat`` of the link type, algorithm and
  protocol) on top of the path's own latency: the first chunk of every step waits ``hwLat``
  before it leaves (``compute_s``). NCCL measured its figures on NVLink and InfiniBand, whose
  paths take a microsecond or less; a slower fabric (a cloud NIC, a long link) adds its own
  latency, which is also what ``validate calibrate`` can fit;
- every rank's first transfer waits the launch latency ``baseLat``;
- a hop carries ``1 / efficiency`` wire bytes per payload byte: the protocol's share of the
  algorithm's bandwidth (:func:`.cost.efficiency`: ring LL 0.5 capped at NCCL's llMaxBw, LL128
  0.92, Simple 1; trees x 0.92 with LL 1/3.8 and LL128 7/9 or 120/128) times the link's usable
  share (NVLink at NCCL's topo.h rate, PCIe at 0.76), so a link at line rate carries payload
  at the rate NCCL gets from it;
- trees and NVLS pipeline the message in chunks of the protocol's buffer step
  (:data:`.constants.CHUNK_BYTES`), at most :data:`MAX_CHUNKS` per tree edge; rings need none
  (each of their steps already moves one segment per hop), and a ring connection keeps several
  segments in flight (NCCL's 8 slots per connection): a segment waits for its data only, so the
  latency a segment meets is that of the hops it crosses, once each (tuning.cc's ring latency
  ``(nsteps - nInterSteps) intraLat + nInterSteps interLat``), not the slowest hop's at every
  step.

NVLS (NVLink SHARP) reduces inside the NVSwitch: each GPU sends every byte of its vector to the
switch once and receives every reduced byte once, ``n (1 + 1/p)`` bytes each way per GPU
(multimem loads of the p shards, one store of the own shard, the switch's multicast). The engine
moves point-to-point flows only, so the NVLS schedule sends the same bytes as an exchange of
``n (1 + 1/p) / (p - 1)`` between every GPU pair, which loads every GPU's NVSwitch link exactly
as NVLS does; the switch sustains ``nvlsEfficiency`` of NCCL's NVLink rate (nvls.cc).
"""
from __future__ import annotations

import math

import numpy as np

from .._builder import Builder
from .._schedule import Route, split, split_each
from ..ring import ring_pass, ring_sizes as ring_pass_sizes
from . import constants as C
from .channels import channel_trees
from .system import NcclSystem

#: Most chunks one tree edge or NVLS-tree stage is cut into: deeper pipelining would change the
#: fill time by less than 1/MAX_CHUNKS of a stage and multiply the transfers.
MAX_CHUNKS = 8


def hop_latency(system: NcclSystem, net: bool, algo: str, proto: str) -> float:
    """NCCL's per-step latency (s) of a hop over the network (``net``) or inside a node: a
    network plugin's own figure where it publishes one (the NICs' transport,
    :mod:`.transports`), else tuning.cc's ``hwLat``."""
    plugin = system.transport.step_latency if net and system.transport is not None else None
    if plugin is not None:
        return plugin[0] + (plugin[1] if proto == "Simple" else 0.0)
    hw = "net" if net else system.intra_hw
    lat = C.HOP_LATENCY[hw][algo][proto]
    if algo == "Ring" and not net and system.n_nodes > 1:
        # tuning.cc: inter-node rings still pay the network overhead on every step.
        lat = max(lat, C.NET_OVERHEAD * (C.NET_OVERHEAD_SIMPLE_FACTOR if proto == "Simple" else 1))
    return lat


class _Hops:
    """Route ids, wire-byte scale and per-step wait of the hops a schedule uses (cached)."""

    def __init__(self, b: Builder, system: NcclSystem, algo: str, proto: str, eff: float):
        self.b, self.system, self.algo, self.proto = b, system, algo, proto
        self.eff = eff
        self._cache: dict = {}
        self._waits: dict = {}          # network hop? -> per-step wait (s)
        memo = system.memo.get("hop_routes")
        if memo is None:
            memo = system.memo["hop_routes"] = {}
        self._routes = memo             # (stops, flow) -> (Route, inflation, network)

    def __call__(self, stops: tuple, flow: int):
        key = (stops, flow)
        hit = self._cache.get(key)
        if hit is None:
            route, scale, wait = self.facts(stops, flow)
            hit = self._cache[key] = (self.b.route(route), scale, wait)
        return hit

    def facts(self, stops: tuple, flow: int):
        """``(Route, wire bytes per payload byte, per-step wait in s)`` of a hop. Its Route
        and facts (:meth:`.NcclSystem.brief`) are the system's, kept across schedules,
        algorithms and protocols (a Tree schedule on 8,192 GPUs crosses 143,000 hops; a
        Route each, made and checked again per protocol, cost 2 s); :meth:`__call__` adds
        this schedule's route id."""
        key = (stops, flow)
        hit = self._routes.get(key)
        if hit is None:
            inflation, net = self.system.brief(stops, flow)
            hit = self._routes[key] = (Route(via=tuple(stops[1:-1]), flow=flow), inflation, net)
        route, inflation, net = hit
        wait = self._waits.get(net)
        if wait is None:
            wait = self._waits[net] = hop_latency(self.system, net, self.algo, self.proto)
        return route, inflation / self.eff, wait


# -- rings ---------------------------------------------------------------------------------------
#: op -> (steps as a function of p, segment offset, phase tags)
RING_OPS = {
    "allreduce": (lambda p: 2 * (p - 1), -1,
                  lambda p: [("reduce_scatter", p - 1), ("allgather", p - 1)]),
    "allgather": (lambda p: p - 1, 0, lambda p: [("allgather", p - 1)]),
    "reduce_scatter": (lambda p: p - 1, -1, lambda p: [("reduce_scatter", p - 1)]),
}


def ring(b: Builder, system: NcclSystem, rings: list, op: str, blocks, proto: str, eff: float,
         first_deps=None, lat_scale: float = 1.0, waits=None) -> list:
    """Ring ``op`` over ``rings`` (channels); ``blocks[j]`` payload bytes of rank j's block
    (a per-rank segment of the vector). Returns each channel's transfer ids (steps, p, 1).
    ``lat_scale`` multiplies the launch latency and, without ``waits``, every per-step wait
    (:func:`.cost.ring_latency_scale`). ``waits[c][r]`` (seconds; :func:`.cost.ring_waits`)
    is what channel c's steps on the hop from its position r wait for their handshakes,
    NCCL's pipeline of chunks and slices; without it, each step waits the whole per-step
    latency.

    ``first_deps[rank]`` (optional) is a transfer id a rank's first send waits for.
    """
    steps_of, offset, phases = RING_OPS[op]
    hops = _Hops(b, system, "Ring", proto, eff)
    base = C.BASE_LATENCY["Ring"][proto]
    out = []
    for c, (rg, seg) in enumerate(zip(rings, _segments(system, rings, blocks))):
        order = np.asarray(rg.order, dtype=np.int64)
        p = len(order)
        facts = [hops(stops, rg.flow) for stops in rg.stops]
        fd = None
        if first_deps is not None:
            fd = [np.asarray([first_deps[r] for r in order], dtype=np.int64)]
        wait = [lat_scale * f[2] for f in facts] if waits is None else waits[c]
        ids = ring_pass(b, order, seg[:, None], steps_of(p), offset, phases(p), first_deps=fd,
                        route=[f[0] for f in facts], scale=[f[1] for f in facts],
                        hop_compute=wait, start_compute=lat_scale * base, ordered=False)
        out.append(ids)
    return out


def _segments(system: NcclSystem, rings: list, blocks) -> list:
    """Per channel, the payload bytes of its share of each rank's block, in its ring's order."""
    per_channel = split_each(np.asarray(blocks, dtype=np.int64), len(rings))     # (C, ranks)
    index = {r: i for i, r in enumerate(system.ranks)}
    return [per_channel[c][[index[int(r)] for r in rg.order]] for c, rg in enumerate(rings)]


def ring_sizes(system: NcclSystem, rings: list, op: str, blocks, proto: str,
               eff: float) -> np.ndarray:
    """The bytes of the transfers :func:`ring` adds for ``blocks``, in the order it adds them
    (channel by channel): what a ring schedule of the same channels needs to be
    :meth:`~emulator.Schedule.resized` to another size."""
    steps_of, offset, _ = RING_OPS[op]
    hops = _Hops(None, system, "Ring", proto, eff)
    out = [ring_pass_sizes(seg[:, None], steps_of(len(rg.order)), offset,
                           [hops.facts(stops, rg.flow)[1] for stops in rg.stops])
           for rg, seg in zip(rings, _segments(system, rings, blocks)) if len(rg.order) >= 2]
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def ring_compute(system: NcclSystem, rings: list, op: str, proto: str, waits,
                 lat_scale: float = 1.0) -> np.ndarray:
    """The seconds each transfer :func:`ring` adds with ``waits`` waits, in its order (step,
    position; channel by channel): a ring schedule :meth:`~emulator.Schedule.resized` to
    another size takes its new handshake waits from here."""
    steps_of = RING_OPS[op][0]
    base = lat_scale * C.BASE_LATENCY["Ring"][proto]
    out = []
    for c, rg in enumerate(rings):
        p = len(rg.order)
        if p < 2:
            continue
        comp = np.broadcast_to(np.asarray(waits[c], dtype=float)[None, :],
                               (steps_of(p), p)).copy()
        comp[0] += base
        out.append(comp.reshape(-1))
    return np.concatenate(out) if out else np.empty(0)


def broadcast(b: Builder, system: NcclSystem, rings: list, nbytes: int, proto: str,
              eff: float) -> None:
    """NCCL's ring broadcast from the first rank: a pipelined chain along each channel's ring,
    starting at the root, chunks of the protocol's step size."""
    hops = _Hops(b, system, "Ring", proto, eff)
    root = system.ranks[0]
    for c, (rg, share) in enumerate(zip(rings, split(nbytes, len(rings)))):
        order = list(rg.order)
        k = order.index(root)
        order = order[k:] + order[:k]
        stops = list(rg.stops[k:] + rg.stops[:k])
        sizes = split(int(share), _chunks(int(share), proto))
        prev = np.full(len(sizes), -1, dtype=np.int64)
        for h in range(len(order) - 1):
            route, scale, wait = hops(stops[h], rg.flow)
            base = b.count
            conn = np.where(np.arange(len(sizes)) > 0, base + np.arange(len(sizes)) - 1, -1)
            wire = np.ceil(sizes * scale).astype(np.int64)
            comp = np.zeros(len(sizes))
            comp[0] = wait + (C.BASE_LATENCY["Ring"][proto] if h == 0 else 0.0)
            prev = b.add(order[h], order[h + 1], wire, [prev, conn], "broadcast", comp, route)


def _chunks(nbytes: int, proto: str) -> int:
    return int(min(MAX_CHUNKS, max(1, math.ceil(nbytes / C.CHUNK_BYTES[proto]))))


# -- trees --------------------------------------------------------------------------------------
def tree_allreduce(b: Builder, system: NcclSystem, rings: list, nbytes: int, proto: str,
                   eff: float) -> None:
    """NCCL's tree allreduce: per channel, half the bytes up and down each of its two trees
    (double binary tree between nodes, chains inside), pipelined in chunks."""
    hops = _Hops(b, system, "Tree", proto, eff)
    base = C.BASE_LATENCY["Tree"][proto]
    for c, (rg, share) in enumerate(zip(rings, split(nbytes, len(rings)))):
        for tree, half in zip(channel_trees(system, rg), split(int(share), 2)):
            _tree_pass(b, tree, split(int(half), _chunks(int(half), proto)), hops, base)


def _top_down(tree) -> list:
    """The tree's ranks, root first, then by depth (ties by rank)."""
    depth: dict = {}

    def d(r):
        if r not in depth:
            depth[r] = 0 if tree.parent[r] < 0 else d(tree.parent[r]) + 1
        return depth[r]

    return sorted(tree.parent, key=lambda r: (d(r), r))


def _tree_pass(b: Builder, tree, sizes: np.ndarray, hops: _Hops, base: float) -> None:
    """Up the tree (leaves first, reducing towards the root), then back down from the root,
    each edge ``c`` chunks in order; one :meth:`Builder.add` per phase, the ids of edge ``k``
    being ``start + k c + chunk``."""
    c = len(sizes)
    order = _top_down(tree)
    gpu = hops.system.gpu
    chunk = np.arange(c)

    def edge(a, b_, stops_key):
        stops = tree.stops[stops_key]
        if stops[0] != gpu(a):
            stops = tuple(reversed(stops))
        return hops(stops, tree.flow)

    def add(edges, deps_of, tag, first_wait):
        """``edges``: (src, dst); ``deps_of(k)``: edge indices (of this batch or id arrays
        earlier) chunk j of edge k waits for."""
        start = b.count
        n = len(edges)
        if not n:
            return np.empty((0, c), dtype=np.int64)
        facts = [edge(x, y, key) for x, y, key in edges]
        ids = start + np.arange(n)[:, None] * c + chunk[None, :]
        deps = [deps_of(k, ids) for k in range(n)]
        width = max((len(d) for d in deps), default=0)
        cols = np.full((width + 1, n, c), -1, dtype=np.int64)
        for k, dk in enumerate(deps):
            for i, d in enumerate(dk):
                cols[i, k] = d
        cols[width] = np.where(chunk > 0, ids - 1, -1)    # the edge's previous chunk
        comp = np.zeros((n, c))
        comp[:, 0] = [f[2] + first_wait(x) for f, (x, _, _) in zip(facts, edges)]
        scale = np.array([f[1] for f in facts])
        nbytes = np.ceil(sizes[None, :] * scale[:, None]).astype(np.int64)
        b.add(np.repeat([x for x, _, _ in edges], c), np.repeat([y for _, y, _ in edges], c),
              nbytes.ravel(), [col.ravel() for col in cols], tag, comp.ravel(),
              np.repeat([f[0] for f in facts], c))
        return ids

    ups = [(x, tree.parent[x], (tree.parent[x], x)) for x in reversed(order) if tree.parent[x] >= 0]
    up_k = {x: k for k, (x, _, _) in enumerate(ups)}
    up = add(ups, lambda k, ids: [ids[up_k[ch]] for ch in tree.children[ups[k][0]]], "reduce",
             lambda x: base if not tree.children[x] else 0.0)
    downs = [(x, ch, (x, ch)) for x in order for ch in tree.children[x]]
    into = {ch: k for k, (_, ch, _) in enumerate(downs)}

    def down_deps(k, ids):
        x = downs[k][0]
        if x == tree.root:
            return [up[up_k[ch]] for ch in tree.children[x]]
        return [ids[into[x]]]

    add(downs, down_deps, "broadcast", lambda x: 0.0)


# -- NVLS ---------------------------------------------------------------------------------------
def _nvls_scale(system: NcclSystem, a: int, b_: int) -> float:
    """Wire bytes per payload byte of NVLS traffic from rank ``a`` to rank ``b_``: the hop's
    inflation over NVLS's efficiency. Worked out once per kind of machine and position pair
    where the hop comes from the kind's template (the same on every copy: 57,000 pairs on
    8,192 GPUs), else once per pair."""
    ga, gb = system.gpu(a), system.gpu(b_)
    pa, pb = system.place(ga), system.place(gb)
    kind = (("nvls_scale", id(pa[0]), pa[2], pb[2])
            if pa is not None and pb is not None and pa[1] is pb[1] else None)
    hit = system.memo.get(kind) if kind is not None else None
    if hit is None:                         # not yet, or no template: per pair
        pair = ("nvls_scale", a, b_)
        hit = system.memo.get(pair)
        if hit is None:
            hit = system.memo[pair] = (system.hop((ga, gb)).inflation
                                       / C.NVLS_EFFICIENCY[system.arch])
            if kind is not None and system.hop_template(ga, gb) is not None:
                system.memo[kind] = hit
    return hit


def _exchange(b: Builder, system: NcclSystem, group, nbytes_pair: int, wait: float, tag: str,
              deps_of=None, conn=None):
    """Every GPU of ``group`` sends ``nbytes_pair`` payload bytes to every other (NVLS's
    traffic); returns {(src, dst): id}."""
    out = {}
    for x in group:
        for y in group:
            if x == y:
                continue
            scale = _nvls_scale(system, x, y)
            deps = []
            if deps_of is not None:
                deps.extend(deps_of(x))
            if conn is not None and (x, y) in conn:
                deps.append(conn[(x, y)])
            out[(x, y)] = b.add_one(x, y, int(math.ceil(nbytes_pair * scale)), deps, tag, wait)
    return out


def nvls_allreduce(b: Builder, system: NcclSystem, nbytes: int) -> None:
    """Single-node NVLS allreduce: ``n (1 + 1/p)`` bytes each way on every GPU's link."""
    group = list(system.ranks)
    p = len(group)
    if p < 2:
        return
    pair = math.ceil(nbytes * (1 + 1 / p) / (p - 1))
    _exchange(b, system, group, pair, C.HOP_LATENCY["nvlink"]["NVLS"]["Simple"], "nvls")


def nvls_tree_allreduce(b: Builder, system: NcclSystem, rings: list, nbytes: int) -> None:
    """NVLS inside nodes, trees between them (NCCL's NVLSTree), pipelined in chunks.

    Chunk i: NVLS reduce-scatter inside each node (half the NVLS traffic), then the shard of
    local GPU j is allreduced across nodes along rail j by the channel's double binary tree, then
    the NVLS all-gather (the other half) brings every GPU the whole reduced chunk.
    """
    g = system.ppn
    nodes = [list(n) for n in system.nodes]
    chunks = split(nbytes, _chunks(math.ceil(nbytes / g), "Simple"))
    intra = C.HOP_LATENCY["nvlink"]["NVLSTree"]["Simple"]
    hops = _Hops(b, system, "NVLSTree", "Simple", 1.0)
    prev_rs, prev_ag = {}, {}
    prev_tree: dict = {}
    for i, chunk in enumerate(chunks):
        pair = math.ceil(int(chunk) * (1 + 1 / g) / 2 / max(g - 1, 1))
        rs = {}
        for grp in nodes:
            if g > 1:
                rs.update(_exchange(b, system, grp, pair, intra if i == 0 else 0.0, "nvls_rs",
                                    conn=prev_rs))
        prev_rs = rs
        into: dict = {}                 # rank -> its reduce-scatter arrivals, in rs's order
        for (x, y), v in rs.items():
            into.setdefault(y, []).append(v)
        done = {}
        for j in range(g):
            rail = [grp[j] for grp in nodes]
            shard = math.ceil(int(chunk) / g)
            for t, half in enumerate(split(shard, 2)):
                tree = channel_trees(system, rail_ring(system, rings, j, t))[t]
                sub = _rail_tree(system, tree, rail, nodes)
                arrived = _tree_once(b, sub, int(half), hops, into, nodes, j, prev_tree, (i, j, t))
                for r, ids in arrived.items():
                    done.setdefault(r, []).extend(ids)
        ag = {}
        for grp in nodes:
            if g > 1:
                ag.update(_exchange(b, system, grp, pair, 0.0, "nvls_ag",
                                    deps_of=lambda x: done.get(x, []),
                                    conn=prev_ag))
        prev_ag = ag


def rail_ring(system: NcclSystem, rings: list, j: int, t: int):
    """The channel that enters node 0 at local GPU ``j`` (the ``t``-th such when a GPU has
    several), else one whose NIC is among ``j``'s nearest: each GPU's shard crosses nodes
    through a NIC next to it."""
    gpu = system.nodes[0][j]
    mine = [rg for rg in rings if rg.order[0] == gpu]
    if not mine:
        mine = [rg for rg in rings if rg.nics[0] is not None and gpu in system.near[rg.nics[0]][:2]]
    mine = mine or rings
    return mine[t % len(mine)]


def _rail_tree(system, tree, rail, nodes):
    """The node-level tree of ``tree`` restricted to the GPUs of ``rail`` (one per node)."""
    node_of = {r: h for h, grp in enumerate(nodes) for r in grp}
    head = {node_of[r]: r for r in rail}
    parent, children, stops = {}, {r: [] for r in rail}, {}
    for r in tree.parent:
        if tree.parent[r] >= 0 and node_of[tree.parent[r]] != node_of[r]:
            hc, hp = node_of[r], node_of[tree.parent[r]]
            a, b_ = head[hp], head[hc]
            parent[b_] = a
            children[a].append(b_)
            st = tree.stops[(tree.parent[r], r)]
            stops[(a, b_)] = (system.gpu(a), *st[1:-1], system.gpu(b_))
    root = head[node_of[tree.root]]
    parent[root] = -1
    for r in rail:
        parent.setdefault(r, -1)
    return type(tree)(root, parent, children, stops, tree.flow)


def _tree_once(b, tree, nbytes, hops, into, nodes, j, prev, key):
    """One chunk up and down a rail tree; ``into[rank]`` the reduce-scatter transfers into
    each rank; returns {rank: arrival ids it waits for}."""
    order = _top_down(tree)
    incoming = {r: into.get(r, []) for r in order}
    up = {}
    for x in reversed(order):
        par = tree.parent[x]
        if par < 0:
            continue
        stops = tree.stops[(par, x)]
        route, scale, wait = hops(tuple(reversed(stops)), tree.flow)
        deps = [*incoming[x], *(up[c] for c in tree.children[x])]     # transfer ids (ints)
        pk = ("up", x, key[1], key[2])
        if pk in prev:
            deps.append(prev[pk])
        up[x] = b.add_one(x, par, int(math.ceil(nbytes * scale)), deps, "reduce",
                          wait if key[0] == 0 else 0.0, route)
        prev[pk] = up[x]
    root = tree.root
    arrived = {root: [up[c] for c in tree.children[root]] + incoming[root]}
    for x in order:
        for ch in tree.children[x]:
            stops = tree.stops[(x, ch)]
            route, scale, wait = hops(stops, tree.flow)
            deps = list(arrived[x])
            pk = ("down", ch, key[1], key[2])
            if pk in prev:
                deps.append(prev[pk])
            got = b.add_one(x, ch, int(math.ceil(nbytes * scale)), deps, "broadcast",
                            wait if key[0] == 0 else 0.0, route)
            prev[pk] = got
            arrived[ch] = [got]
    return arrived
