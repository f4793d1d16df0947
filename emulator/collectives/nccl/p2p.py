"""NCCL's all-to-all: grouped send/recv between every pair of ranks at once, and its closed form.

Inside a node a send takes the direct path; between nodes it goes through the NIC of the
destination's rail, reached over NVLink first (PXN, NCCL 2.12+), so that the network leg stays
on one rail (:meth:`.NcclSystem.p2p_stops`). A 1024-GPU all-to-all is a million sends whose
routes, wire-byte scales, waits and shared rates depend on the pairs, not on the bytes, so they
are worked out once per system (:func:`table`) and every all-to-all after that, schedule or
closed form, is array arithmetic over them.

Sizes are a ``(p, p)`` matrix over the system's ranks in their order: ``sizes[i, j]`` payload
bytes from ``system.ranks[i]`` to ``system.ranks[j]`` (the diagonal is ignored).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._builder import Builder
from .._schedule import Route
from . import constants as C
from . import p2pform, pipeline
from .builders import hop_latency
from .system import NcclSystem

__all__ = ["Table", "table", "alltoall", "time", "uniform", "slot_waits", "TABLE_MAX",
           "aggregated"]

#: Ranks up to which :func:`time` times every pair (a million sends at 1,024 GPUs); beyond,
#: the per-pair table is 4 million sends at 2,048 GPUs and 67 million at 8,192.
TABLE_MAX = 1024


def aggregated(system: NcclSystem) -> bool:
    """Whether :func:`time` of uniform sizes on ``system`` takes the aggregate form."""
    return len(system.ranks) > TABLE_MAX and p2pform.regular(system) is not None


@dataclass(frozen=True)
class Table:
    """Every ordered pair's send (``src != dst``), in increasing order of (src rank, dst rank).

    Attributes
    ----------
    i, j : ndarray of int
        Positions of the sender and the receiver in ``system.ranks``.
    latency : ndarray of float
        Path latency (s).
    inflation : ndarray of float
        Wire bytes per payload byte before the protocol's efficiency.
    net : ndarray of bool
        Whether the path crosses a network link.
    rate : ndarray of float
        Bytes/s when every pair sends at once (bottleneck bandwidth / flows crossing it).
    route : ndarray of int
        Index into ``routes`` (first appearance order).
    routes : tuple of Route
    """

    i: np.ndarray
    j: np.ndarray
    latency: np.ndarray
    inflation: np.ndarray
    net: np.ndarray
    rate: np.ndarray
    route: np.ndarray
    routes: tuple


def table(system: NcclSystem) -> Table:
    """The :class:`Table` of ``system``'s ranks, worked out once and kept in its memo.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_a100x2"), range(16))
    >>> t = table(s)
    >>> len(t.i), int(t.net.sum())          # 16 * 15 sends, 2 * 8 * 8 between the nodes
    (240, 128)
    """
    kept = system.memo.get("p2p_table")
    if kept is None:
        kept = system.memo["p2p_table"] = _make_table(system)
    return kept


def _make_table(system: NcclSystem) -> Table:
    """Per send only its legs (the routed paths between its stops) are looked up: the facts
    of a send are those of its legs combined (latencies summed in route order, bottlenecks
    and rates the least of the legs'), so a million sends cost array operations over a few
    thousand distinct legs, with the same numbers as :meth:`.NcclSystem.hop` and
    :func:`.cost.shared_rates` give send by send. The sends' stops are
    :meth:`.NcclSystem.p2p_stops`' rule over arrays (``_stops``)."""
    if not system.plain_p2p:
        return _make_table_by_send(system)
    ii, jj, L, route, routes, legs = _stops(system)
    facts = [system.leg(*key) for key in legs]
    pad = len(facts)                    # a leg of no links, no latency: pads shorter sends
    L = np.where(L < 0, pad, L)
    lat = np.array([f[1] for f in facts] + [0.0])
    raw = np.array([min(f[2], default=np.inf) for f in facts] + [np.inf])
    usable = np.array([min(f[3], default=np.inf) for f in facts] + [np.inf])
    net = np.array([f[4] for f in facts] + [False])
    # Flows on a channel: every send counts each of its legs' channels once per crossing.
    uses = np.bincount(L.ravel(), minlength=pad + 1)
    count: dict = {}
    for leg, f in enumerate(facts):
        for c in f[0]:
            count[c] = count.get(c, 0) + int(uses[leg])
    rate = np.array([min((bw / count[c] for c, bw in zip(f[0], f[2])), default=np.inf)
                     for f in facts] + [np.inf])
    latency = lat[L[:, 0]]
    for k in range(1, L.shape[1]):     # in route order, as a float sum along the route adds
        latency = latency + lat[L[:, k]]
    return Table(i=ii, j=jj, latency=latency, inflation=raw[L].min(axis=1) / usable[L].min(axis=1),
                 net=net[L].any(axis=1), rate=rate[L].min(axis=1), route=route, routes=routes)


def _make_table_by_send(system: NcclSystem) -> Table:
    """:func:`_make_table` send by send from :meth:`.NcclSystem.p2p_stops`, for systems whose
    sends go through host memory (SHM inside a node, a socket transport between nodes): the
    array rule of :func:`_stops` knows only GPU-to-GPU and GPUDirect routes. Such systems are
    PCIe boxes and Ethernet clusters of a few nodes, where a loop over the pairs is cheap."""
    ranks = system.ranks
    order = sorted(range(len(ranks)), key=lambda k: ranks[k])
    sends, routes, route_of = [], [], {}
    for a in order:
        for b in order:
            if a == b:
                continue
            stops, flow = system.p2p_stops(ranks[a], ranks[b])
            r = Route(via=tuple(stops[1:-1]), flow=flow if len(stops) > 2 else 0)
            if r not in route_of:
                route_of[r] = len(routes)
                routes.append(r)
            sends.append((a, b, [system.leg(u, v, flow) for u, v in zip(stops, stops[1:])],
                          route_of[r]))
    count: dict = {}
    for _, _, legs, _ in sends:
        for leg in legs:
            for c in leg[0]:
                count[c] = count.get(c, 0) + 1
    cols = {"i": [], "j": [], "latency": [], "inflation": [], "net": [], "rate": [], "route": []}
    for a, b, legs, r in sends:
        chans = [(c, bw) for leg in legs for c, bw in zip(leg[0], leg[2])]
        cols["i"].append(a)
        cols["j"].append(b)
        cols["latency"].append(sum(leg[1] for leg in legs))
        cols["inflation"].append(min((x for leg in legs for x in leg[2]), default=np.inf)
                                 / min((x for leg in legs for x in leg[3]), default=np.inf))
        cols["net"].append(any(leg[4] for leg in legs))
        cols["rate"].append(min((bw / count[c] for c, bw in chans), default=np.inf))
        cols["route"].append(r)
    return Table(i=np.array(cols["i"], dtype=np.int64), j=np.array(cols["j"], dtype=np.int64),
                 latency=np.array(cols["latency"]), inflation=np.array(cols["inflation"]),
                 net=np.array(cols["net"], dtype=bool), rate=np.array(cols["rate"]),
                 route=np.array(cols["route"], dtype=np.int64), routes=tuple(routes))


def _stops(system: NcclSystem) -> tuple:
    """Every send's legs, as :meth:`.NcclSystem.p2p_stops` routes it, over arrays: inside a
    node (or without rails) the direct leg; between nodes, on the destination's rail ``r``,
    [sender -> proxy GPU of the rail's NIC, if another GPU], -> NIC, NIC -> NIC, NIC ->
    receiver, each leg with ECMP label ``r``.

    Returns ``(i, j, legs, route, routes, keys)``: sender and receiver positions in
    ``system.ranks`` (sends in increasing (src rank, dst rank) order), per send its leg ids in
    route order (-1 past its last leg), its route index and the routes in order of first
    appearance, and the (node, node, label) key of every leg id."""
    ranks = system.ranks
    p = len(ranks)
    order = np.array(sorted(range(p), key=lambda k: ranks[k]), dtype=np.int64)
    a = np.repeat(order, p)
    b = np.tile(order, p)
    keep = a != b
    a, b = a[keep], b[keep]
    rails = min((len(n) for n in system.nics), default=0)
    # Node ids as integers: GPUs 0..p-1 (by position), then every NIC.
    names = [system.gpu(r) for r in ranks]
    nic_id: dict = {}
    for node_nics in system.nics:
        for nic in node_nics:
            nic_id.setdefault(nic, len(names) + len(nic_id))
    names += list(nic_id)
    n_names = len(names)
    host = np.array([system.node_of(r) for r in ranks], dtype=np.int64)
    cross = host[a] != host[b] if rails else np.zeros(len(a), dtype=bool)
    legs = np.full((len(a), 4), -1, dtype=np.int64)          # leg codes, then ids
    flow = np.zeros(len(a), dtype=np.int64)
    route_code = np.full(len(a), -1, dtype=np.int64)           # -1: the direct route

    def code(u, v, f):
        return (u * n_names + v) * max(rails, 1) + f

    direct = ~cross
    legs[direct, 0] = code(a[direct], b[direct], 0)
    if cross.any():
        pos = {r: k for k, r in enumerate(ranks)}
        local = np.zeros(p, dtype=np.int64)                 # a GPU's rail: its place in its node
        for grp in system.nodes:
            for k, r in enumerate(grp):
                local[pos[r]] = k % rails
        nic = np.array([[nic_id[n] for n in node_nics[:rails]] for node_nics in system.nics],
                       dtype=np.int64)                       # (hosts, rails)
        proxy = np.array([[pos[system.near[n][0]] for n in node_nics[:rails]]
                          for node_nics in system.nics], dtype=np.int64)
        x, y = a[cross], b[cross]
        r = local[y]
        nx, ny = nic[host[x], r], nic[host[y], r]
        px = proxy[host[x], r]
        via = px != x                                        # through another GPU first
        first = np.where(via, px, x)
        rows = np.flatnonzero(cross)
        cols = np.where(via, 1, 0)
        legs[rows[via], 0] = code(x[via], px[via], r[via])
        legs[rows, cols] = code(first, nx, r)
        legs[rows, cols + 1] = code(nx, ny, r)
        legs[rows, cols + 2] = code(ny, y, r)
        flow[rows] = r
        route_code[rows] = ((np.where(via, px, -1) + 1) * n_names + nx) * n_names * rails + \
            ny * rails + r
    used = legs >= 0
    keys, ids = np.unique(legs[used], return_inverse=True)
    legs[used] = np.ravel(ids)
    width = int(used.sum(axis=1).max()) if len(a) else 1
    per_leg = max(rails, 1)
    leg_keys = [(names[k // per_leg // n_names], names[k // per_leg % n_names], int(k % per_leg))
                for k in keys.tolist()]
    # routes in order of first appearance, as the sends list them
    uniq, first_at, inverse = np.unique(route_code, return_index=True, return_inverse=True)
    rank_of = np.empty(len(uniq), dtype=np.int64)
    rank_of[np.argsort(first_at, kind="stable")] = np.arange(len(uniq))
    routes = []
    for c in uniq[np.argsort(first_at, kind="stable")].tolist():
        if c < 0:
            routes.append(Route(via=(), flow=0))
            continue
        rest, r = divmod(c, rails)
        rest, ny = divmod(rest, n_names)
        px, nx = divmod(rest, n_names)
        via = ((names[px - 1],) if px else ()) + (names[nx], names[ny])
        routes.append(Route(via=via, flow=r))
    return (a, b, legs[:, :max(width, 1)], rank_of[np.ravel(inverse)], tuple(routes), leg_keys)


def uniform(system: NcclSystem, per_destination) -> np.ndarray:
    """The size matrix of sends whose bytes depend on the receiver only:
    ``per_destination[j]`` bytes to ``system.ranks[j]`` from every rank.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("switch:3"), range(3))
    >>> uniform(s, [10, 20, 30]).tolist()
    [[10, 20, 30], [10, 20, 30], [10, 20, 30]]
    """
    v = np.asarray(per_destination, dtype=np.int64)
    return np.broadcast_to(v, (len(system.ranks), len(v)))


def _waits(system: NcclSystem, t: Table, proto: str) -> np.ndarray:
    """NCCL's per-step latency of each send (s): it depends on the network flag alone."""
    return np.where(t.net, hop_latency(system, True, "Ring", proto),
                    hop_latency(system, False, "Ring", proto))


def slot_waits(system: NcclSystem, t: Table, n: np.ndarray, proto: str, eff: float) -> np.ndarray:
    """Per send of ``n`` payload bytes, the seconds its chunks wait for the connection's slots
    beyond their bytes (:func:`.pipeline.window_wait`, over arrays): a send moves
    ``p2pChunkSize`` chunks (512 KiB on all-NVLink nodes, 128 KiB on PCIe and between nodes,
    a quarter or half of it for a send below one or eight chunks over the network; LL's
    32 KiB steps up to 16 KiB), at most ``NCCL_STEPS`` in flight, each slot back a handshake
    each way after its chunk left (src/enqueue.cc, src/init.cc). One channel per peer.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_a100x2"), range(16))
    >>> t = table(s)
    >>> w = slot_waits(s, t, np.full(len(t.i), 1 << 24), "Simple", 1.0)
    >>> float(w.max())        # every pair sends at once: a chunk's bytes outlast its slot
    0.0
    """
    bufs = system.buffers
    if proto == "LL":
        chunk = np.full(len(n), bufs.step("LL") // 2, dtype=np.int64)
    else:
        path = ("net" if system.n_nodes > 1 else
                "nvlink" if system.intra_hw == "nvlink" else "pci")
        step = min(pipeline.P2P_CHUNK[path], bufs.simple // pipeline.NCCL_STEPS)
        chunk = np.full(len(n), step, dtype=np.int64)
        chunk = np.where(t.net & (n < step), step // 4,
                         np.where(t.net & (n < 8 * step), step // 2, chunk))
    count = np.ceil(np.maximum(n, 1) / chunk)
    tc = chunk / (t.rate * eff / t.inflation)
    lat = _waits(system, t, proto)
    per = np.maximum(0.0, (2 * lat + tc) / pipeline.NCCL_STEPS - tc)
    return np.maximum(count - 1, 0) * per


def time(system: NcclSystem, sizes, proto: str = "Simple", form: str = "auto") -> float:
    """Seconds of :func:`alltoall` with every send at once: the slowest
    ``wait + latency + wire bytes / shared rate`` (wire bytes at the protocol's efficiency;
    the wait is the per-step latency and the slots' :func:`slot_waits`).

    ``form``: ``"table"`` times every pair (:func:`table`); ``"aggregate"`` the pairs of
    positions of a regular cluster with link loads counted in aggregate
    (:mod:`.p2pform`: no per-pair table; measured against the engine in
    :data:`emulator.fastpath.ERROR_BOUND`); ``"auto"`` the table up to :data:`TABLE_MAX`
    ranks, beyond it the aggregate form for sizes that depend on the receiver only
    (:func:`uniform`) on a regular cluster.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_a100x2"), range(16))
    >>> round(time(s, uniform(s, [1 << 20] * 16)) * 1e6, 1)       # us, 1 MiB per pair
    573.4
    """
    sizes = np.asarray(sizes)
    if form == "aggregate" or (form == "auto" and len(system.ranks) > TABLE_MAX
                               and sizes.ndim == 2 and sizes.strides[0] == 0):
        rows = p2pform.classes(system, sizes[0])
        if rows is not None:
            net, lat, infl, rate, n = rows
            none = np.zeros(len(net), dtype=np.int64)
            t = Table(none, none, lat, infl, net, rate, none, ())
            return _slowest(system, t, n, proto)
        if form == "aggregate":
            raise ValueError("the aggregate all-to-all needs a regular cluster "
                             "(p2pform.regular)")
    t = table(system)
    if not len(t.i):
        return 0.0
    return _slowest(system, t, sizes[t.i, t.j].astype(np.int64), proto)


def _slowest(system: NcclSystem, t: Table, n: np.ndarray, proto: str) -> float:
    """The slowest of ``t``'s sends of ``n`` bytes each (:func:`time`)."""
    eff = C.PROTOCOL_EFFICIENCY[proto]
    scale = t.inflation / eff
    wait = _waits(system, t, proto) + slot_waits(system, t, n, proto, eff)
    return float(np.max(wait + t.latency + np.ceil(n * scale) / t.rate))


def alltoall(b: Builder, system: NcclSystem, sizes, proto: str = "Simple", tag="alltoall",
             eff: float | None = None) -> np.ndarray:
    """Add NCCL's all-to-all of ``sizes`` (the module's matrix, bytes) to ``b``, one transfer
    per ordered pair in increasing (src, dst) order; returns the ``(p, p)`` matrix of
    transfer ids (-1 on the diagonal). ``eff`` is the payload share of the bandwidth
    (default: the protocol's).

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("switch:3"), range(3))
    >>> b = Builder()
    >>> alltoall(b, s, uniform(s, [100, 100, 100])).tolist()
    [[-1, 0, 1], [2, -1, 3], [4, 5, -1]]
    """
    t = table(system)
    p = len(system.ranks)
    ids = np.full((p, p), -1, dtype=np.int64)
    if not len(t.i):
        return ids
    eff = C.PROTOCOL_EFFICIENCY[proto] if eff is None else eff
    n = np.asarray(sizes)[t.i, t.j].astype(np.int64)
    wire = np.ceil(n * (t.inflation / eff)).astype(np.int64)
    route_ids = np.array([b.route(r) for r in t.routes], dtype=np.int64)
    ranks = np.asarray(system.ranks, dtype=np.int64)
    wait = _waits(system, t, proto) + slot_waits(system, t, n, proto, eff)
    ids[t.i, t.j] = b.add(ranks[t.i], ranks[t.j], wire, (), tag, wait, route_ids[t.route])
    return ids
