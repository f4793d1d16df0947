"""Path facts of NCCL's steps: the links, latency and bottlenecks of a hop through a graph.

:class:`HopFacts` is the part of :class:`~emulator.collectives.nccl.system.NcclSystem` that
times where a step goes: a hop through stops (GPU, NIC, CPU, ...) is the routed legs between
them end to end, each leg's link facts read once; legs and hops inside a machine come from
its kind's template (:mod:`.hosts`), made once per kind and position pair, because NCCL's
trees cross hundreds of thousands of them on 8,192 GPUs. The state it reads (``memo``,
``_hops``, ``_flowless``, ``_legs``, ``_inside``, ``_place``, ``_templates``,
``_channel_ids``, ``_link_facts``, ``_router``, ``G``) is the system's own.
"""
from __future__ import annotations

from dataclasses import dataclass

from .graphfacts import INTRA_CLASSES, _link_class, topologies_local_routes

__all__ = ["Hop", "HopFacts"]


class HopFacts:
    """Hops and legs of an analysed system (mixed into ``NcclSystem``)."""

    def kept(self, kind: str, objs: tuple, make):
        """``make()``, computed once per ``kind`` and identity of the objects ``objs`` (rings,
        a tree) and kept in :attr:`memo`; the entry holds the objects, so their ids cannot be
        reused by others while it exists."""
        key = (kind, tuple(id(o) for o in objs))
        hit = self.memo.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], objs)):
            hit = self.memo[key] = (tuple(objs), make())
        return hit[1]

    def hop(self, stops: tuple, flow: int = 0) -> "Hop":
        """Path facts of a hop through node ids ``stops`` (src, via..., dst)."""
        key = (stops if type(stops) is tuple else tuple(stops), flow)
        hit = self._hops.get(key)
        if hit is None:
            hit = self._flowless.get(key[0])         # inside a machine: any flow's
            if hit is None:
                hit = self._machine_hop(key[0])
                if hit is not None:
                    self._flowless[key[0]] = hit
                else:
                    hit = self._hop(key[0], flow)
            self._hops[key] = hit
        return hit

    def brief(self, stops: tuple, flow: int = 0) -> tuple:
        """``(inflation, net)`` of :meth:`hop`: wire bytes per payload byte and whether it
        crosses a network link. Hops across machines timed in bulk (:func:`.hoptable.
        hop_table`, NCCL's trees: 33,000 on 8,192 GPUs) are kept with these two facts, and
        a hop inside a machine has its kind's (:meth:`_template_of`): neither is made again
        as a :class:`Hop` when a schedule crosses it (a Tree schedule on 8,192 GPUs crosses
        143,000)."""
        key = (stops if type(stops) is tuple else tuple(stops), flow)
        hit = self._briefs.get(key)
        if hit is None:
            tmpl = self._template_of(key[0])
            if tmpl is not None:
                return tmpl[1].inflation, tmpl[1].net
            h = self.hop(*key)
            hit = self._briefs[key] = (h.inflation, h.net)
        return hit

    def _machine_hop(self, stops: tuple):
        """The :class:`Hop` of two GPUs (or a GPU and a NIC) of one machine from its kind's
        template (:meth:`_template_of`): NCCL's trees have 7 such hops per machine and
        channel, 260,000 on 8,192 GPUs. None otherwise."""
        tmpl = self._template_of(stops)
        if tmpl is None:
            return None
        nodes = self._place[stops[0]][1]
        h = tmpl[1]
        chans = tuple((nodes[u], nodes[v]) for u, v in tmpl[0])
        return Hop(chans, h.latency, h.raw, h.usable, h.net, h.bandwidths, self._ids(chans))

    def _template_of(self, stops: tuple):
        """``(channels by position, Hop)`` of the hop through ``stops`` when they are two
        nodes of one machine whose kind's template (:meth:`_in_machine`) joins them, made
        once per kind and position pair; else None."""
        if len(stops) != 2:
            return None
        pa, pb = self._place.get(stops[0]), self._place.get(stops[1])
        if pa is None or pb is None or pa[1] is not pb[1]:
            return None
        table = self._templates.get(("hop", id(pa[0])))
        if table is None:
            table = self._templates[("hop", id(pa[0]))] = {}
        key = (pa[2], pb[2])
        tmpl = table.get(key, False)
        if tmpl is False:
            leg = self._in_machine(*stops)
            tmpl = table[key] = None if leg is None else (
                self._templates[id(pa[0])][1][key][0],
                self._hop_of([leg]))
        return tmpl

    def place(self, node):
        """``(machine description, the machine's nodes, position)`` of ``node`` when its
        machine's facts come from its kind's template (:mod:`.hosts`), else None."""
        return self._place.get(node)

    def hop_template(self, a, b):
        """``(channels by position, Hop)`` when :meth:`hop` of ``(a, b)`` (two nodes of one
        machine) comes from its kind's template: the same facts on every copy of the
        machine, its channels ``(nodes[u], nodes[v])`` for the positions ``(u, v)``; else
        None. :mod:`.hoptable` times hundreds of thousands of hops per template."""
        return self._template_of((a, b))

    def channel_ids(self, chans: tuple) -> tuple:
        """Numbers of directed channels ``(u, v)`` (:meth:`_ids`)."""
        return self._ids(chans)

    def _hop(self, stops: tuple, flow: int) -> "Hop":
        chans, lat, bws, use, net = self._joined([self.leg(a, b, flow)
                                                  for a, b in zip(stops, stops[1:])])
        return Hop(chans, lat, min(bws), min(use), net, bws, self._ids(chans))

    def _ids(self, chans: tuple) -> tuple:
        """Numbers of directed channels ``(u, v)``, given in order of first use: the cost
        model counts a link's hops by number (:func:`.cost.shared_rates`)."""
        ids = self._channel_ids
        return tuple([ids.setdefault(c, len(ids)) for c in chans])

    @classmethod
    def _hop_of(cls, legs) -> "Hop":
        chans, lat, bws, use, net = cls._joined(legs)
        return Hop(chans, lat, min(bws), min(use), net, bws)

    @staticmethod
    def _joined(legs) -> tuple:
        """``(channels, latency sum, bandwidths, usable bandwidths, crosses a network link)``
        of legs end to end (one :class:`Hop` made by the caller, not one per step)."""
        chans, lat, bandwidths, usable, net = [], 0.0, [], [], False
        for c, leg_lat, bws, use, leg_net in legs:
            chans.extend(c)
            lat += leg_lat
            bandwidths.extend(bws)
            usable.extend(use)
            net = net or leg_net
        return tuple(chans), lat, tuple(bandwidths), tuple(usable), net

    def leg(self, a, b, flow: int) -> tuple:
        """``(channels, latency sum, bandwidths, usable bandwidths, crosses a network
        link)`` of the routed path ``a -> b``: legs repeat across hops (NCCL's all-to-all
        sends every pair of nodes' GPUs over the same NIC-to-NIC legs)."""
        key = (a, b, flow)
        hit = self._legs.get(key)
        if hit is None:
            inside = self._inside.get((a, b), False)    # inside a machine: any flow's
            if inside is False:
                inside = self._inside[(a, b)] = self._in_machine(a, b)
            hit = self._legs[key] = inside or self._leg(tuple(self._router.channels(a, b, flow)))
        return hit

    def _leg(self, c: tuple) -> tuple:
        facts = self._link_facts
        lat, bws, use, net = 0, [], [], False     # the latencies summed as sum() would
        for e in c:
            f = facts.get(e)
            if f is None:                   # a fabric link: thousands of legs cross it
                d = self.G.edges[e]
                f = facts[e] = (d["bandwidth"], d["latency"],
                                d["bandwidth"] * self.usable_fraction(d),
                                _link_class(d) not in INTRA_CLASSES)
            bws.append(f[0])
            lat += f[1]
            use.append(f[2])
            net = net or f[3]
        return (c, lat, tuple(bws), tuple(use), net)

    def _in_machine(self, a, b):
        """:meth:`leg` of two nodes of one machine from its kind's template, found once per
        kind of machine and position pair, when the machine's only shortest route joins them
        (:meth:`topologies.LocalRoutes.unique_path`: the router then takes it whatever the
        flow); else None. A leg crosses the same links of every copy, position for position."""
        tmpl = self.leg_template(a, b)
        if tmpl is None:
            return None
        nodes = self._place[a][1]
        return (tuple((nodes[u], nodes[v]) for u, v in tmpl[0]),) + tmpl[1:]

    def leg_template(self, a, b):
        """``(channels by position, latency sum, bandwidths, usable bandwidths, network)``
        of :meth:`leg` ``a -> b`` when it comes from the kind of machine of both
        (:meth:`_in_machine`): the same on every copy, the channels ``(nodes[u],
        nodes[v])`` of the machine's nodes; else None. Made once per kind and position
        pair."""
        pa, pb = self._place.get(a), self._place.get(b)
        if pa is None or pb is None or pa[1] is not pb[1] or a == b:
            return None
        kind, nodes = id(pa[0]), pa[1]
        table = self._templates.get(kind)
        if table is None:
            table = self._templates[kind] = (topologies_local_routes(self.G, nodes), {})
        key = (pa[2], pb[2])
        tmpl = table[1].get(key, False)
        if tmpl is False:
            seq = table[0].unique_path(*key)
            if seq is None:
                tmpl = None
            else:
                c, lat, bws, use, net = self._leg(tuple((nodes[u], nodes[v])
                                                        for u, v in zip(seq, seq[1:])))
                tmpl = (tuple(zip(seq, seq[1:])), lat, bws, use, net)
            table[1][key] = tmpl
        return tmpl


@dataclass(frozen=True)
class Hop:
    """A route's directed links, latency (s), line-rate and usable bottleneck (bytes/s), and
    whether it crosses a network link."""

    channels: tuple
    latency: float
    raw: float
    usable: float
    net: bool
    bandwidths: tuple = ()    # of each of ``channels``, bytes/s
    ids: tuple = ()           # each channel's number in its system (NcclSystem.channel_id)

    @property
    def inflation(self) -> float:
        """Wire bytes per payload byte that make the line-rate bottleneck carry payload at the
        usable rate."""
        return self.raw / self.usable
