"""NCCL's all-to-all on a regular cluster from per-machine aggregates (no per-pair table).

:func:`.p2p.time` times every ordered pair's send from a table of its legs: 67 million pairs
on 8,192 GPUs. On a regular cluster (one kind of machine, the same GPUs, NICs and proxies at
the same positions on every machine, each NIC on one fabric switch) the sends of one pair of
positions differ only in the fabric between the two machines, and every send crosses links
whose loads can be counted in aggregate:

- inside a machine (NVLink to the PXN proxy, the proxy's PCIe link to the NIC, the NIC's
  link to the receiver, direct sends between local GPUs), exactly: a machine's links carry
  its own sends, ``(H - 1)`` times those to one other machine;
- a NIC's links to its switch, exactly: ``g x m_r`` sends to each of the ``H - 1`` other
  machines' NICs on rail ``r`` (``m_r`` GPUs per machine use rail ``r``);
- between switches, in expectation: the sends between two switches split evenly over the
  equal-cost next hops at every switch (what the router's per-flow hash does on average),
  from the fabric's distance table (:class:`topologies.fabric.FabricRoutes`).

A send's time is then :func:`.p2p.time`'s ``wait + latency + wire bytes / shared rate`` with
the fabric leg at its worst: the longest fabric latency between switches that exchange
sends and the most loaded switch-to-switch link. Hash collisions (several flows on one link
where the average puts fewer) are what this leaves out; its error against the engine is
measured by ``benchmarks/alltoall_error.py`` (:data:`emulator.fastpath.ERROR_BOUND`).
"""
from __future__ import annotations

import numpy as np

from .system import NcclSystem

__all__ = ["regular", "classes"]


def regular(system: NcclSystem):
    """The layout the aggregate form needs, or None where ``system`` is not a regular
    cluster: ``(g, rails, gpus of machine 0, its NICs, proxy position per rail, leaf
    switch (fabric index) per node and rail, the router's FabricRoutes)``. Kept in the memo.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_a100x4,fabric=rail"), range(32))
    >>> regular(s)[:2]
    (8, 8)
    >>> regular(NcclSystem.of(topologies.from_spec("dgx_a100"), range(8))) is None
    True
    """
    hit = system.memo.get("p2p_regular", False)
    if hit is False:
        hit = system.memo["p2p_regular"] = _regular(system)
    return hit


def _regular(system: NcclSystem):
    nodes = system.nodes
    H = len(nodes)
    if H < 2 or not system.plain_p2p or len({len(n) for n in nodes}) != 1:
        return None
    rails = min((len(n) for n in system.nics), default=0)
    if rails == 0:
        return None
    g = len(nodes[0])
    place = system.place
    first = [place(system.gpu(r)) for r in nodes[0]] + [place(n) for n in system.nics[0][:rails]]
    if any(x is None for x in first):
        return None
    kind = first[0][0]
    positions = tuple(x[2] for x in first)
    proxy = tuple(nodes[0].index(system.near[n][0]) for n in system.nics[0][:rails])
    router = system.router
    fab = router._fabric_of(router._index[system.nics[0][0]],
                            router._index[system.nics[1][0]]) if H > 1 else None
    if fab is None:
        return None
    fr = fab[0]
    leaf = np.empty((H, rails), dtype=np.int64)
    for h, grp in enumerate(nodes):
        here = [place(system.gpu(r)) for r in grp] + [place(n) for n in system.nics[h][:rails]]
        if any(x is None or x[0] is not kind for x in here) or \
                tuple(x[2] for x in here) != positions or \
                tuple(grp.index(system.near[n][0]) for n in system.nics[h][:rails]) != proxy:
            return None
        for r, nic in enumerate(system.nics[h][:rails]):
            ex = fr.exits.get(router._index[nic])
            if ex is None or len(ex) != 1:
                return None
            leaf[h, r] = fr.index[ex[0][0]]
    return (g, rails, tuple(system.gpu(r) for r in nodes[0]), tuple(system.nics[0][:rails]),
            proxy, leaf, fr)


def classes(system: NcclSystem, per_destination) -> tuple | None:
    """The sends of an all-to-all whose bytes depend on the receiver only
    (``per_destination[j]`` bytes to ``system.ranks[j]``), as one row per pair of positions
    in a machine: ``(net, latency, inflation, rate, bytes)`` arrays, each row the worst of
    its sends (the most bytes, the longest fabric latency, the most loaded fabric link);
    None where :func:`regular` is.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_a100x4,fabric=rail"), range(32))
    >>> net, lat, infl, rate, n = classes(s, np.full(32, 1 << 20))
    >>> len(net), int(net.sum())          # 8 x 7 local pairs, 8 x 8 across machines
    (120, 64)
    """
    lay = regular(system)
    if lay is None:
        return None
    g, k, gpus, nics, proxy, leaf, fr = lay
    H = len(system.nodes)
    n_to = np.asarray(per_destination, dtype=np.int64)
    local = np.array([system.nodes[h].index(r) for h in range(H)
                      for r in system.nodes[h]], dtype=np.int64)
    ranks_by_node = [r for grp in system.nodes for r in grp]
    pos = {r: i for i, r in enumerate(system.ranks)}
    n_by_local = np.zeros(g, dtype=np.int64)
    np.maximum.at(n_by_local, local, n_to[[pos[r] for r in ranks_by_node]])
    m = np.bincount(np.arange(g) % k, minlength=k)          # GPUs per machine on each rail
    # -- machine 0's links: every leg with the sends crossing it --------------------------
    count: dict = {}
    legs: dict = {}

    def use(a, b, flow, times):
        leg = legs.get((a, b, flow))
        if leg is None:
            leg = legs[(a, b, flow)] = system.leg(a, b, flow)
        for c in leg[0]:
            count[c] = count.get(c, 0) + times
        return leg

    for x in range(g):
        for y in range(g):
            if x != y:
                use(gpus[x], gpus[y], 0, 1)
    for r in range(k):
        d = (H - 1) * int(m[r])                  # sends from one GPU on rail r
        for x in range(g):
            if proxy[r] != x:
                use(gpus[x], gpus[proxy[r]], r, d)
        use(gpus[proxy[r]], nics[r], r, g * d)
        for y in range(g):
            if y % k == r:
                use(nics[r], gpus[y], r, (H - 1) * g)
    # -- the fabric: NIC links exactly, switch links in expectation -------------------------
    nic_leg = [system.leg(nics[r], _peer_nic(system, r), r) for r in range(k)]
    out_load = [g * (H - 1) * int(m[r]) for r in range(k)]      # sends out of one NIC
    flows = np.zeros((len(fr.nodes), len(fr.nodes)))
    for r in range(k):
        a = np.bincount(leaf[:, r], minlength=len(fr.nodes)).astype(float)
        f = np.outer(a, a)
        f[np.diag_indices_from(f)] -= a                         # no sends to itself
        flows += g * int(m[r]) * f
    load, DF = _expected_loads(system, fr, flows)
    U, V, C, BW = fr_links(system, fr)
    busy = load > 0
    fab_rate = float((BW[busy] / load[busy]).min()) if busy.any() else np.inf
    fab_raw = float(BW[busy].min()) if busy.any() else np.inf
    pairs = flows > 0
    np.fill_diagonal(pairs, False)
    far = float(DF[pairs].max()) if pairs.any() else 0.0
    HOP = _hop()
    rows = {"net": [], "lat": [], "infl": [], "rate": [], "n": []}

    def rate_of(leg):
        return min(bw / count[c] for c, bw in zip(leg[0], leg[2]))

    for x in range(g):
        for y in range(g):
            if x == y:
                continue
            leg = legs[(gpus[x], gpus[y], 0)]
            rows["net"].append(leg[4])
            rows["lat"].append(leg[1])
            rows["infl"].append(min(leg[2]) / min(leg[3]))
            rows["rate"].append(rate_of(leg))
            rows["n"].append(n_by_local[y])
    for x in range(g):
        for y in range(g):
            r = y % k
            mine = ([legs[(gpus[x], gpus[proxy[r]], r)]] if proxy[r] != x else []) + \
                [legs[(gpus[proxy[r]], nics[r], r)], legs[(nics[r], gpus[y], r)]]
            nl = nic_leg[r]
            # the NIC's links out and in (first and last of its leg) carry exact counts
            out_bw, in_bw = nl[2][0], nl[2][-1]
            in_load = (H - 1) * g * int(m[r])
            raw = min(min(min(l[2]) for l in mine), out_bw, in_bw, fab_raw)
            usable = min(min(min(l[3]) for l in mine), out_bw, in_bw, fab_raw)
            rate = min(min(rate_of(l) for l in mine), out_bw / out_load[r], in_bw / in_load,
                       fab_rate)
            ends = nl[0][0], nl[0][-1]
            edge_lat = sum(system.G.edges[c]["latency"] for c in ends)
            fabric_lat = edge_lat + (far // HOP) * 1e-12
            rows["net"].append(True)
            rows["lat"].append(sum(l[1] for l in mine) + fabric_lat)
            rows["infl"].append(raw / usable)
            rows["rate"].append(rate)
            rows["n"].append(n_by_local[y])
    return (np.array(rows["net"], dtype=bool), np.array(rows["lat"]), np.array(rows["infl"]),
            np.array(rows["rate"]), np.array(rows["n"], dtype=np.int64))


def _hop() -> int:
    from topologies.routing import HOP

    return HOP


def _peer_nic(system: NcclSystem, r: int):
    """Rail ``r``'s NIC of another machine (machine 1): a NIC-to-NIC leg's end links."""
    return system.nics[1][r]


def fr_links(system: NcclSystem, fr) -> tuple:
    """The fabric's directed switch-to-switch links: ``(from, to, cost, bandwidth)`` arrays
    over fabric indices (kept in the system's memo)."""
    hit = system.memo.get("p2p_fabric_links")
    if hit is None:
        names = fr.router._names
        edges = system.G.edges
        U, V, C, BW = [], [], [], []
        for i, x in enumerate(fr.nodes):
            for v, c in fr._adj[i]:
                U.append(i)
                V.append(fr.index[v])
                C.append(c)
                BW.append(float(edges[names[x], names[v]]["bandwidth"]))
        hit = system.memo["p2p_fabric_links"] = (
            np.array(U, dtype=np.int64), np.array(V, dtype=np.int64), np.array(C, dtype=float),
            np.array(BW, dtype=float))
    return hit


def _expected_loads(system: NcclSystem, fr, flows: np.ndarray, chunk: int = 64) -> tuple:
    """Per directed fabric link, the sends it carries on average when ``flows[s, d]`` sends
    go from switch ``s`` to switch ``d`` and each switch splits what passes it evenly over
    its next hops one ``DF`` step closer (:meth:`FabricRoutes.next_hops`); and ``DF``."""
    DF, _ = fr._tables()
    U, V, C, _ = fr_links(system, fr)
    n = len(fr.nodes)
    load = np.zeros(len(U))
    dests = np.flatnonzero(flows.sum(axis=0) > 0)
    for at in range(0, len(dests), chunk):
        d = dests[at:at + chunk]
        du = DF[U[:, None], d[None, :]]
        on = (DF[V[:, None], d[None, :]] + C[:, None] == du) & np.isfinite(du)
        out = np.zeros((n, len(d)))
        np.add.at(out, U, on.astype(float))
        mass = flows[:, d].copy()
        mass[d, np.arange(len(d))] = 0.0
        for _ in range(n):
            if not mass.any():
                break
            share = np.where(out[U] > 0, mass[U] / np.where(out[U] > 0, out[U], 1.0), 0.0) * on
            load += share.sum(axis=1)
            mass = np.zeros_like(mass)
            np.add.at(mass, V, share)
            mass[d, np.arange(len(d))] = 0.0
    return load, DF
