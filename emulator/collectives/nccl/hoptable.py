"""Many hops' path facts as arrays, made once per kind of machine, and their shared rates.

NCCL's trees on 8,192 GPUs have 262,000 hops (16 trees, two directions), 229,000 of them
between two GPUs of one machine; their facts (latency, bottleneck, wire scale, channels by
position) are the same on every copy of a machine (:meth:`.NcclSystem.hop_template`), so a
:class:`HopTable` takes them per kind of machine and position pair and maps the channels
onto each copy in bulk; other hops (across the fabric) come from :meth:`.NcclSystem.hop`
one by one. :func:`shared_rates` is :func:`.cost.shared_rates` over a table, optionally per
group of hops (the tree's first chunk shares links level by level). The facts are those of
:meth:`.NcclSystem.hop` hop for hop, so every time computed from them is the same.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .system import NcclSystem

__all__ = ["HopTable", "hop_table", "shared_rates"]


@dataclass(frozen=True)
class HopTable:
    """Per hop: ``latency`` (s), line-rate ``raw`` and ``usable`` bottleneck (bytes/s),
    ``net`` (crosses a network link), ``lens`` (its channels); flat over the hops in order:
    ``ids`` (channel numbers, :meth:`.NcclSystem.channel_ids`) and ``bandwidths``."""

    latency: np.ndarray
    raw: np.ndarray
    usable: np.ndarray
    net: np.ndarray
    lens: np.ndarray
    ids: np.ndarray
    bandwidths: np.ndarray

    @property
    def inflation(self) -> np.ndarray:
        """Wire bytes per payload byte (:attr:`.Hop.inflation`, hop by hop)."""
        return self.raw / self.usable

    def __len__(self) -> int:
        return len(self.latency)


def hop_table(system: NcclSystem, stops: list, flows: list) -> HopTable:
    """:meth:`.NcclSystem.hop` of every ``stops[i]`` with ``flows[i]``, as a :class:`HopTable`.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_h100x2"), range(16))
    >>> st = [(s.gpu(0), s.gpu(1)), (s.gpu(9), s.gpu(8)), (s.gpu(0), s.gpu(8))]
    >>> t = hop_table(s, st, [0, 0, 0])
    >>> t.latency.tolist() == [s.hop(x).latency for x in st], t.net.tolist()
    (True, [False, False, True])
    """
    n = len(stops)
    lat, raw, use = np.empty(n), np.empty(n), np.empty(n)
    net = np.zeros(n, dtype=bool)
    lens = np.zeros(n, dtype=np.int64)
    # node -> (kind, the machine's nodes, position): the system's own table
    place = system._place.get
    # Stops recur (a machine's chain in every channel's tree, both ways round a ring):
    # each distinct sequence is classified once, its hops found through ``inv``.
    first: dict = {}
    inv = np.fromiter((first.setdefault(st, len(first)) for st in stops), dtype=np.int64,
                      count=n)
    # (kind, position, position) -> (distinct stops, their machines, one); a kind and a
    # machine by identity: a kind's description is a long tuple, too dear to hash per hop
    classes: dict = {}
    for u, st in enumerate(first):
        if len(st) == 2:
            pa, pb = place(st[0]), place(st[1])
            if pa is not None and pb is not None and pa[1] is pb[1]:
                key = (id(pa[0]), pa[2], pb[2])
                c = classes.get(key)
                if c is None:
                    c = classes[key] = ([], [], st)
                c[0].append(u)
                c[1].append(id(pa[1]))
    cls = np.full(len(first), -1, dtype=np.int64)      # class of each distinct stops
    row = np.zeros(len(first), dtype=np.int64)         # its row among the class's
    made = []                   # per class: (Hop, channel numbers per distinct stops (k, L))
    for key, (us, machines, rep) in classes.items():
        tmpl = system.hop_template(*rep)
        if tmpl is None:        # no template: hop by hop, as the others
            continue
        pairs, h = tmpl
        us = np.asarray(us, dtype=np.int64)
        cls[us], row[us] = len(made), np.arange(len(us))
        uniq, which = np.unique(np.asarray(machines, dtype=np.int64), return_inverse=True)
        table = [_channel_row(system, key, pairs, m) for m in uniq.tolist()]
        made.append((h, np.asarray(table, dtype=np.int64).reshape(-1, len(pairs))[which]))
    of_hop = cls[inv]
    generic = np.flatnonzero(of_hop < 0).tolist()
    filled = []                 # (hops, channel numbers per hop (k, L), bandwidths (L,))
    for k, (h, chans) in enumerate(made):
        idx = np.flatnonzero(of_hop == k)
        lat[idx], raw[idx], use[idx], net[idx] = h.latency, h.raw, h.usable, h.net
        lens[idx] = chans.shape[1]
        filled.append((idx, chans[row[inv[idx]]], np.asarray(h.bandwidths, dtype=float)))
    # the fabric proves NIC-to-NIC legs in bulk (topologies.Router.prove_routes)
    system.router.prove_routes([leg for i in generic if len(stops[i]) > 2
                                for leg in zip(stops[i], stops[i][1:])])
    g_lat, g_raw, g_use, g_net, g_lens, g_ids, g_bws = _joined(system, stops, flows, generic)
    if generic:
        lat[generic], raw[generic], use[generic], net[generic] = g_lat, g_raw, g_use, g_net
        lens[generic] = g_lens
        # what a schedule over the same hops asks (NcclSystem.brief), as Hop.inflation is
        system._briefs.update(zip(zip([stops[i] for i in generic], [flows[i] for i in generic]),
                                  zip([r / u for r, u in zip(g_raw, g_use)], g_net)))
    starts = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64)
    ids = np.empty(int(lens.sum()), dtype=np.int64)
    bws = np.empty(len(ids))
    for idx, chans, bw in filled:
        at = starts[idx][:, None] + np.arange(chans.shape[1])
        ids[at] = chans
        bws[at] = bw
    if generic:                 # each generic hop's channels at its own place, in one go
        g_lens = np.asarray(g_lens, dtype=np.int64)
        shift = starts[generic] - np.concatenate(([0], np.cumsum(g_lens)[:-1]))
        at = np.repeat(shift, g_lens) + np.arange(int(g_lens.sum()))
        ids[at] = g_ids
        bws[at] = g_bws
    return HopTable(lat, raw, use, net, lens, ids, bws)


def _joined(system: NcclSystem, stops: list, flows: list, which: list) -> tuple:
    """:meth:`.NcclSystem.hop` of ``stops[i]`` with ``flows[i]`` for every ``i`` of
    ``which`` (hops without a template: NCCL's hops across machines, GPU, NIC, NIC, GPU),
    leg by leg as the system joins them (:meth:`.NcclSystem.leg`), without a Hop object
    per hop: 295,000 such hops on 65,536 GPUs. A leg inside one machine comes from its
    kind's template (:meth:`.NcclSystem.leg_template`), its channel numbers kept per
    machine; any other from the router (not kept: a tree's legs across machines do not
    repeat). Per hop the latency is summed leg by leg from 0.0 and the bottlenecks are the
    least of the legs' (the same additions and minima as the Hop's).

    Returns
    -------
    tuple
        Per hop of ``which``: latencies (s), line-rate and usable bottlenecks (bytes/s),
        network flags, channel counts (lists); then the channel numbers and their
        bandwidths of every hop, end to end (lists).
    """
    place = system._place.get
    ids_of = system.channel_ids
    channels, route_leg = system.router.channels, system._leg
    inside: dict = {}           # (node, node) -> facts of its machine's leg, None: routed
    lat, raw, use, net, lens, ids, bws = [], [], [], [], [], [], []
    inf = float("inf")
    for i in which:
        st, f = stops[i], flows[i]
        t_lat, t_raw, t_use, t_net, at = 0.0, inf, inf, False, len(ids)
        for a, b in zip(st, st[1:]):
            key = (a, b)
            leg = inside.get(key, False)
            if leg is False:
                leg = None
                pa, pb = place(a), place(b)
                if pa is not None and pb is not None and pa[1] is pb[1]:
                    tmpl = system.leg_template(a, b)
                    if tmpl is not None:
                        nodes = pa[1]
                        leg = _facts(ids_of(tuple((nodes[u], nodes[v]) for u, v in tmpl[0])),
                                     *tmpl[1:])
                inside[key] = leg
            if leg is None:     # the router's, as NcclSystem.leg routes it (each once here)
                c, *rest = route_leg(tuple(channels(a, b, f)))
                leg = _facts(ids_of(c), *rest)
            t_lat += leg[1]
            if leg[2] < t_raw:
                t_raw = leg[2]
            if leg[3] < t_use:
                t_use = leg[3]
            t_net = t_net or leg[4]
            ids.extend(leg[0])
            bws.extend(leg[5])
        lat.append(t_lat)
        raw.append(t_raw)
        use.append(t_use)
        net.append(t_net)
        lens.append(len(ids) - at)
    return lat, raw, use, net, lens, ids, bws


def _facts(ids: tuple, lat: float, bws: tuple, use: tuple, net: bool) -> tuple:
    """A leg as :func:`_joined` adds it up: ``(channel numbers, latency, least bandwidth,
    least usable bandwidth, network, bandwidths)``."""
    return ids, lat, min(bws), min(use), net, bws


def _channel_row(system: NcclSystem, key: tuple, pairs: tuple, machine: int) -> tuple:
    """Channel numbers of the template hop ``key`` (kind, positions) on the machine whose
    nodes tuple has identity ``machine``: its channels by position ``pairs`` mapped onto
    that machine's nodes; kept with the system (trees and rings cross the same ones)."""
    memo = system.memo.get("hop_rows")
    if memo is None:
        memo = system.memo["hop_rows"] = ({id(p[1]): p[1] for p in system._place.values()}, {})
    nodes_of, rows = memo
    hit = rows.get((key, machine))
    if hit is None:
        nodes = nodes_of[machine]
        hit = rows[(key, machine)] = system.channel_ids(tuple((nodes[u], nodes[v])
                                                              for u, v in pairs))
    return hit


def shared_rates(tables: list, groups: list | None = None) -> list:
    """Bytes/s of each hop of ``tables`` when all hops of a group run at once: per hop the
    least of its channels' bandwidth over the hops of its group crossing the channel
    (:func:`.cost.shared_rates`, the same divisions and minima). ``groups`` gives each table
    a label per hop (None: every hop of every table in one group). One array per table.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_h100x2"), range(16))
    >>> t = hop_table(s, [(s.gpu(0), s.gpu(8)), (s.gpu(8), s.gpu(0))], [0, 0])
    >>> [r.tolist() == [s.hop((s.gpu(0), s.gpu(8))).raw] * 2 for r in shared_rates([t])]
    [True]
    """
    lens = np.concatenate([t.lens for t in tables])
    ids = np.concatenate([t.ids for t in tables])
    if not len(lens):
        return [np.empty(0) for _ in tables]
    if (lens == 0).any():
        raise ValueError("a hop without channels has no shared rate")
    bws = np.concatenate([t.bandwidths for t in tables])
    key = ids
    if groups is not None:
        g = np.repeat(np.concatenate([np.asarray(x, dtype=np.int64) for x in groups]), lens)
        g = np.unique(g, return_inverse=True)[1].ravel()
        key = g * (int(ids.max()) + 1) + ids
    key = np.unique(key, return_inverse=True)[1].ravel()
    share = bws / np.bincount(key)[key]
    rates = np.minimum.reduceat(share, np.concatenate(([0], np.cumsum(lens)[:-1])))
    cut = np.cumsum([len(t) for t in tables])[:-1]
    return np.split(rates, cut)
