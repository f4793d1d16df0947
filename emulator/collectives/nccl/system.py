"""What NCCL's topology detection sees in a graph: nodes, link types, NICs, architecture.

NCCL (src/graph/topo.cc, paths.cc) groups ranks by host, classifies the paths between GPUs of
a host (NVLink, PCI) and between a GPU and its NICs, and reads the GPUs' compute capability.
:class:`NcclSystem` does the same on a topology graph:

- a *node* is a host: the ``host`` attribute that :func:`topologies.cluster` sets, or else the
  GPUs joined by intra-machine links (NVLink, NVSwitch, PCIe, socket links); GPUs of a generic
  graph (``switch:16``) are then one node each, as single-GPU hosts on a network;
- the intra-node hardware is ``"nvlink"`` when every pair of a node's GPUs is joined over
  NVLink or NVSwitch links only, else ``"pci"``;
- a node's NICs, each with its local GPUs ordered by path latency (the GPUs on the NIC's PCIe
  switch first: the ones NCCL pairs with that NIC);
- the usable bandwidth of a link: NCCL drives an NVLink at its topo.h figure (20 GB/s of the
  25 GB/s line rate on sm80, ...) and a PCIe link at 0.76 of its line rate; network links at
  their line rate. :meth:`NcclSystem.inflation` turns that into wire bytes per payload byte.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import networkx as nx

from ...errors import ConfigError
from . import constants as C
from .hosts import host_facts

#: Link classes inside one machine; every other class is a network link.
INTRA_CLASSES = frozenset({"nvlink", "nvswitch", "pcie", "qpi", "upi", "xgmi", "socket", "c2c"})
NVLINK_CLASSES = frozenset({"nvlink", "nvswitch"})


#: graph -> (fingerprint, {ranks: NcclSystem}); weak, so a graph's analyses go with it.
_SYSTEMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _fingerprint(G: nx.Graph) -> int:
    """What the analysis reads: every link's ends, class, bandwidth and latency, and every
    node's attributes (kind, fabric, compute capability, ...)."""
    return hash((tuple((u, v, d.get("link"), d.get("bandwidth"), d.get("latency"))
                       for u, v, d in G.edges(data=True)),
                 tuple((n, repr(sorted(d.items()))) for n, d in G.nodes(data=True))))


def _link_class(d: dict) -> str:
    return str(d.get("link") or "default")


@dataclass
class NcclSystem:
    """The NCCL view of ``ranks`` on graph ``G`` (build with :meth:`of`).

    Attributes
    ----------
    ranks : tuple of int
        Participating ranks, in order.
    nodes : tuple of tuple of int
        Ranks per node (host), nodes in order of their lowest rank.
    sm : int or None
        Smallest compute capability x 10 among the GPUs (None when the graph does not say).
    intra_hw : str
        ``"nvlink"`` or ``"pci"``: NCCL's intra-node hardware row.
    nvswitch : bool
        Every node's GPUs share an NVSwitch (NVLS needs it, and Hopper or newer).
    nics : tuple of tuple of str
        NIC node ids of each node (empty for a node with none).
    near : dict
        NIC node id -> local ranks of its node, nearest first.
    net_protocol : str or None
        The NICs' ``protocol`` (``"ib"``, ``"efa"``, ...) when they all share one, which picks
        the network plugin NCCL loads; None without NICs or with several kinds.
    ll_over_net : bool
        Every NIC delivers 128-byte aligned writes in order (NIC attribute ``in_order_128``,
        default True). LL and LL128 need it across nodes: aws-ofi-nccl sets
        ``NCCL_PROTO=simple`` on EFA endpoints without it (src/platform-aws.c).
    """

    G: nx.Graph
    ranks: tuple
    nodes: tuple
    sm: int | None
    intra_hw: str
    nvswitch: bool
    nics: tuple
    near: dict
    net_protocol: str | None = None
    ll_over_net: bool = True
    _router: object = field(default=None, repr=False)
    _gpu: list = field(default_factory=list, repr=False)
    _node_of: dict = field(default_factory=dict, repr=False)
    _lat: dict = field(default_factory=dict, repr=False, compare=False)
    #: node -> (its machine's description, the machine's nodes, its position among them)
    _place: dict = field(default_factory=dict, repr=False, compare=False)
    #: per kind of machine (by identity: one object per kind in :attr:`_place`)
    _templates: dict = field(default_factory=dict, repr=False, compare=False)
    _channel_ids: dict = field(default_factory=dict, repr=False, compare=False)
    _flowless: dict = field(default_factory=dict, repr=False, compare=False)
    _hops: dict = field(default_factory=dict, repr=False, compare=False)
    _legs: dict = field(default_factory=dict, repr=False, compare=False)
    #: (node, node) -> :meth:`_in_machine` of the pair (None: not from a template)
    _inside: dict = field(default_factory=dict, repr=False, compare=False)
    #: directed link -> (bandwidth, latency, usable bandwidth, network link) for :meth:`_leg`
    _link_facts: dict = field(default_factory=dict, repr=False, compare=False)
    #: derived facts the builders and the cost model reuse across collectives (keyed by kind)
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def of(cls, G: nx.Graph, ranks) -> "NcclSystem":
        """Analyse ``G`` for the participating ``ranks`` (a sequence of distinct ints).

        The analysis is kept with the graph for the next collective on the same ranks (a
        replayed iteration builds dozens), and done again when the graph's links or machines
        have changed since.

        Examples
        --------
        >>> import topologies
        >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_a100x2"), range(16))
        >>> len(s.nodes), s.intra_hw, s.arch, len(s.nics[0])
        (2, 'nvlink', 'ampere', 8)
        """
        if G is None:
            raise ConfigError("NCCL algorithms need graph= (the topology the ranks run on)")
        ranks = tuple(int(r) for r in ranks)
        fp = _fingerprint(G)
        kept = _SYSTEMS.get(G)
        if kept is None or kept[0] != fp:
            kept = _SYSTEMS[G] = (fp, {})
        if ranks not in kept[1]:
            kept[1][ranks] = cls._analyse(G, ranks)
        return kept[1][ranks]

    @classmethod
    def _analyse(cls, G: nx.Graph, ranks: tuple) -> "NcclSystem":
        import topologies

        gpus = topologies.gpus(G)
        bad = [r for r in ranks if r >= len(gpus)]
        if bad:
            raise ConfigError(f"ranks {bad[:5]} are not in the graph {G.graph.get('name', '')!r} "
                              f"({len(gpus)} GPUs)")
        comp: dict = {}

        def machines() -> dict:
            if not comp:
                comp.update(_machines(G))
            return comp

        groups = _group_by_node(G, gpus, ranks, machines)
        sms = [G.nodes[gpus[r]].get("sm") for r in ranks]
        sm = None if any(s is None for s in sms) else int(min(sms))
        router = topologies.router_of(G)
        nics, near, lat = [], {}, {}
        node_of = {}
        nic_memo: dict = {}
        for i, grp in enumerate(groups):
            for r in grp:
                node_of[r] = i
            nics.append(tuple(_nics_of(G, gpus, grp, machines, nic_memo)))
        # Per machine, from its own subgraph, once per kind of machine (.hosts).
        facts = host_facts(G, gpus, groups, nics, router, machines, NVLINK_CLASSES,
                           _link_class)
        intra_hw = "nvlink"
        nvswitch = True
        place = {}
        # One object per kind of machine: the templates key on its identity (a description
        # is a long tuple; hashing it per hop cost seconds on 8,192 GPUs).
        interned: dict = {}
        for grp, fact in zip(groups, facts):
            near.update(fact.near)
            lat.update(fact.latency)
            if fact.kind is not None:
                kind = interned.setdefault(fact.kind, fact.kind)
                for k, n in enumerate(fact.nodes):
                    place[n] = (kind, fact.nodes, k)
            if len(grp) < 2:
                continue
            if not fact.nvlink:
                intra_hw = "pci"
            if not _nvswitch_joins(G, [gpus[r] for r in grp]):
                nvswitch = False
        if all(len(g) < 2 for g in groups):
            nvswitch = False
            intra_hw = "pci" if sm is None else "nvlink"
        cards = [G.nodes[n] for n in near]
        kinds = {str(d.get("protocol", "ib")) for d in cards}
        return cls(G=G, ranks=ranks, nodes=tuple(tuple(g) for g in groups), sm=sm,
                   intra_hw=intra_hw, nvswitch=nvswitch, nics=tuple(nics), near=near,
                   net_protocol=kinds.pop() if len(kinds) == 1 else None,
                   ll_over_net=all(d.get("in_order_128", True) for d in cards),
                   _router=router, _gpu=gpus, _node_of=node_of, _lat=lat, _place=place)

    # -- facts ------------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        """NCCL's architecture row: ``volta``, ``ampere``, ``hopper`` or ``blackwell``."""
        return C.arch_of(self.sm)

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def ppn(self) -> int:
        """Ranks per node (the smallest node's count)."""
        return min(len(g) for g in self.nodes)

    def gpu(self, rank: int) -> str:
        """Node id of ``rank``'s GPU."""
        return self._gpu[rank]

    def node_of(self, rank: int) -> int:
        return self._node_of[rank]

    @property
    def router(self):
        return self._router

    @property
    def buffers(self):
        """NCCL's connection buffers (:class:`.pipeline.Buffers`): NCCL_BUFFSIZE from the
        graph's ``nccl_buffsize`` attribute (bytes) when set, else NCCL's defaults."""
        from .pipeline import Buffers

        size = self.G.graph.get("nccl_buffsize")
        key = ("buffers", size)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = Buffers() if size is None else Buffers(simple=size)
        return hit

    def latency(self, a, b) -> float:
        """Path latency (s) from node ``a`` to node ``b``: a NIC's to its machine's GPUs from
        the per-machine analysis, anything else from the router."""
        hit = self._lat.get((a, b))
        return self._router.latency(a, b) if hit is None else hit

    def ll128_enabled(self) -> bool:
        """tuning.cc: LL128 only over NVLink inside nodes, on Volta or newer GPUs of one kind."""
        return self.intra_hw == "nvlink" and self.sm is not None and self.sm >= 70

    def protocol_enabled(self, proto: str) -> bool:
        """Whether NCCL runs ``proto`` here: LL128 per :meth:`ll128_enabled`; across nodes LL
        and LL128 only where the NICs keep 128-byte writes in order (:attr:`ll_over_net`) and
        the network transport carries them (:attr:`transport`)."""
        if proto != "Simple" and self.n_nodes > 1 and not self.ll_over_net:
            return False
        net = self.transport
        if self.n_nodes > 1 and net is not None and proto not in net.protocols:
            return False
        return proto != "LL128" or self.ll128_enabled()

    def nvls_enabled(self) -> bool:
        """NVLS needs NVSwitch and Hopper or newer (search.cc; nvls.cc nvlsEfficiency > 0)."""
        return self.nvswitch and C.NVLS_EFFICIENCY[self.arch] > 0

    # -- links --------------------------------------------------------------------------------
    def usable_fraction(self, d: dict) -> float:
        """Fraction of a link's line rate NCCL moves data at (topo.h figures)."""
        k = _link_class(d)
        if k in NVLINK_CLASSES:
            return C.nvlink_efficiency(self.sm)
        if k == "pcie":
            return C.PCI_EFFICIENCY
        return 1.0

    def p2p_stops(self, x: int, y: int) -> tuple:
        """``(stops, flow)`` of a send from rank ``x`` to rank ``y`` as NCCL's p2p routes it:
        inside a node as its steps go (:meth:`intra_stops`: P2P or through host memory);
        between nodes through the NIC of the destination's rail, reached over NVLink first
        (PXN, NCCL 2.12+), so the network leg stays on one rail; a transport that copies
        through host memory has no PXN: the sender's own rail, via both CPUs."""
        hx, hy = self.node_of(x), self.node_of(y)
        k = self.memo.get("rails")
        if k is None:                   # rails every node has (a million sends ask)
            k = self.memo["rails"] = min((len(n) for n in self.nics), default=0)
        if hx == hy:
            return self.intra_stops(x, y), 0
        if not k:
            return (self.gpu(x), self.gpu(y)), 0
        net = self.transport
        if net is not None and net.host_memory:     # no PXN without GPUDirect: own rail's NIC
            j = self.nodes[hx].index(x) % k
            return self.net_stops(x, y, self.nics[hx][j], self.nics[hy][j]), j
        j = self.nodes[hy].index(y) % k
        nic_x, nic_y = self.nics[hx][j], self.nics[hy][j]
        proxy = self.near[nic_x][0]
        via = ((self.gpu(proxy),) if proxy != x else ()) + (nic_x, nic_y)
        return (self.gpu(x), *via, self.gpu(y)), j

    @property
    def nic_nodes(self) -> frozenset:
        """Node ids of the graph's NICs (``kind`` ``"nic"``), kept: NCCL's ring search asks
        it of every stop (600,000 on 65,536 GPUs)."""
        hit = self.memo.get("nic_nodes")
        if hit is None:
            hit = self.memo["nic_nodes"] = frozenset(
                n for n, d in self.G.nodes(data=True) if d.get("kind") == "nic")
        return hit

    # -- transports and NCCL's path types ----------------------------------------------------
    @property
    def transport(self):
        """The network transport the NICs run (:class:`.transports.Transport`; the NICs'
        ``transport`` attribute, else their wire protocol's default), None without NICs or
        when they run several."""
        hit = self.memo.get("transport", False)
        if hit is False:
            import topologies.machines.parts as parts

            from .transports import transport

            names = {d.get("transport") or parts.DEFAULT_TRANSPORT.get(str(d.get("protocol", "ib")),
                                                                      "ib")
                     for d in (self.G.nodes[n] for n in self.near)}
            hit = self.memo["transport"] = transport(names.pop()) if len(names) == 1 else None
        return hit

    @property
    def unpack(self) -> bool:
        """The network transport is an unpacking device (GPUDirect-TCPX/O)."""
        return self.transport is not None and self.transport.unpack

    def cpu_of(self, rank: int):
        """The CPU node nearest ``rank``'s GPU (its host memory), or None without one."""
        key = ("cpu_of", rank)
        if key not in self.memo:
            g = self.gpu(rank)
            cpus = self.memo.get("cpus")
            if cpus is None:
                cpus = self.memo["cpus"] = [n for n, d in self.G.nodes(data=True)
                                            if d.get("kind") == "cpu"]
            host = self.G.nodes[g].get("host")
            mine = [c for c in cpus if self.G.nodes[c].get("host") == host]
            self.memo[key] = min(mine, key=lambda c: (self._router.latency(g, c), _natural(c)),
                                 default=None)
        return self.memo[key]

    def path_type(self, a: int, b: int) -> str:
        """NCCL's path type between ranks ``a`` and ``b`` of one node (src/graph/paths.cc):
        ``NVL`` over NVLink (or NVSwitch) only, ``PIX`` through one PCIe switch, ``PXB``
        through several, ``PHB`` through a CPU's host bridge, ``SYS`` across the CPUs' socket
        link (UPI, xGMI, QPI).

        Examples
        --------
        >>> import topologies
        >>> s = NcclSystem.of(topologies.from_spec("pcie_box:gpus=8,gpus_per_switch=4"), range(8))
        >>> s.path_type(0, 1), s.path_type(0, 4)
        ('PIX', 'SYS')
        """
        key = ("path_type", min(a, b), max(a, b))
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = _path_type(self.G, self._router.path(self.gpu(a),
                                                                        self.gpu(b)))
        return hit

    def p2p_allowed(self, a: int, b: int) -> bool:
        """Whether NCCL moves data between ranks ``a`` and ``b`` of one node by P2P (GPU to
        GPU) rather than SHM (through host memory): paths.cc ``ncclTopoCheckP2p`` allows P2P
        up to PXB (up to SYS between the two GPUs of an AMD host), and only where both GPUs
        allow peer access (GPU attribute ``p2p``, False where the driver turns it off, as on
        consumer cards)."""
        off = self.memo.get("p2p_off")
        if off is None:
            off = self.memo["p2p_off"] = frozenset(
                r for r in self.ranks if self.G.nodes[self.gpu(r)].get("p2p", True) is False)
        if a in off or b in off:
            return False
        if self.intra_hw == "nvlink":           # NVL paths: P2P (a rank's node is all NVLink)
            return True
        level = _PATH_ORDER["PXB"]
        cpu = self.cpu_of(a)
        if (cpu is not None and self.G.nodes[cpu].get("vendor") == "amd"
                and len(self.nodes[self.node_of(a)]) <= 2):
            level = _PATH_ORDER["SYS"]
        return _PATH_ORDER[self.path_type(a, b)] <= level

    @property
    def plain_p2p(self) -> bool:
        """Every send goes GPU to GPU inside nodes and by GPUDirect between them: the
        all-to-all's per-pair facts can be worked out over arrays (:mod:`.p2p`)."""
        hit = self.memo.get("plain_p2p")
        if hit is None:
            net = self.transport
            hit = not (net is not None and net.host_memory) and all(
                self.p2p_allowed(a, b) for grp in self.nodes for a in grp for b in grp if a < b)
            self.memo["plain_p2p"] = hit
        return hit

    def intra_stops(self, a: int, b: int) -> tuple:
        """The stops of ``a``'s steps to ``b`` inside a node: GPU to GPU (P2P), or through the
        host memory of ``b``'s CPU (NCCL's SHM transport keeps the buffer on the receiver's
        side: shm.cc ``NCCL_SHM_LOCALITY``), each step crossing both GPUs' PCIe links."""
        key = ("intra_stops", a, b)
        hit = self.memo.get(key)
        if hit is None:
            cpu = None if self.p2p_allowed(a, b) else self.cpu_of(b)
            hit = self.memo[key] = ((self.gpu(a), self.gpu(b)) if cpu is None
                                    else (self.gpu(a), cpu, self.gpu(b)))
        return hit

    def net_stops(self, a: int, b: int, nic_a, nic_b) -> tuple:
        """The stops of a network step from rank ``a`` through ``nic_a`` and ``nic_b`` to rank
        ``b``: GPU, NIC, NIC, GPU with GPUDirect RDMA; through each side's host memory (its
        CPU) when the transport copies steps through it (:attr:`transport`, the socket
        transport)."""
        net = self.transport
        if net is not None and net.host_memory:
            ca, cb = self.cpu_of(a), self.cpu_of(b)
            return (self.gpu(a), *((ca,) if ca is not None else ()), nic_a, nic_b,
                    *((cb,) if cb is not None else ()), self.gpu(b))
        return (self.gpu(a), nic_a, nic_b, self.gpu(b))

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

    def _machine_hop(self, stops: tuple):
        """The :class:`Hop` of two GPUs (or a GPU and a NIC) of one machine from its kind's
        template (:meth:`_in_machine`), made once per kind and position pair: NCCL's trees
        have 7 such hops per machine and channel, 260,000 on 8,192 GPUs. None otherwise."""
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
        if tmpl is None:
            return None
        nodes = pa[1]
        h = tmpl[1]
        chans = tuple((nodes[u], nodes[v]) for u, v in tmpl[0])
        return Hop(chans, h.latency, h.raw, h.usable, h.net, h.bandwidths, self._ids(chans))

    def place(self, node):
        """``(machine description, the machine's nodes, position)`` of ``node`` when its
        machine's facts come from its kind's template (:mod:`.hosts`), else None."""
        return self._place.get(node)

    def hop_template(self, a, b):
        """``(channels by position, Hop)`` when :meth:`hop` of ``(a, b)`` (two nodes of one
        machine) comes from its kind's template: the same facts on every copy of the
        machine, its channels ``(nodes[u], nodes[v])`` for the positions ``(u, v)``; else
        None. :mod:`.hoptable` times hundreds of thousands of hops per template."""
        if self._machine_hop((a, b)) is None:
            return None
        pa, pb = self._place[a], self._place[b]
        return self._templates[("hop", id(pa[0]))][(pa[2], pb[2])]

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


def topologies_local_routes(G, nodes):
    import topologies

    return topologies.LocalRoutes(G, nodes)


def _nvswitch_joins(G, nodes) -> bool:
    """An NVSwitch is a neighbour of every one of ``nodes`` (it is one of the first's)."""
    return any(G.nodes[n].get("kind") == "switch" and G.nodes[n].get("fabric") == "nvswitch"
               and all(G.has_edge(n, g) for g in nodes[1:]) for n in G.neighbors(nodes[0]))


def _machines(G) -> dict:
    """Node id -> machine index, for graphs without ``host`` attributes: a machine is what
    intra-machine links (NVLink, PCIe, sockets) join."""
    H = nx.Graph()
    H.add_nodes_from(G.nodes)
    H.add_edges_from((u, v) for u, v, d in G.edges(data=True) if _link_class(d) in INTRA_CLASSES)
    comp = {}
    for i, part in enumerate(nx.connected_components(H)):
        for n in part:
            comp[n] = i
    return comp


def _group_by_node(G, gpus, ranks, machines) -> list:
    """Ranks grouped per machine; ``machines()`` gives :func:`_machines` of ``G`` on demand."""
    hosts = [G.nodes[gpus[r]].get("host") for r in ranks]
    if all(h is not None for h in hosts):
        groups: dict = {}
        for r, h in zip(ranks, hosts):
            groups.setdefault(h, []).append(r)
        return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])
    comp = machines()
    groups = {}
    for r in ranks:
        groups.setdefault(comp[gpus[r]], []).append(r)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


def _nics_by(G, key) -> dict:
    """``key(nic, attrs)`` -> that machine's NIC node ids, in natural name order."""
    found: dict = {}
    for n, d in G.nodes(data=True):
        if d.get("kind") == "nic":
            found.setdefault(key(n, d), []).append(n)
    return {k: sorted(v, key=_natural) for k, v in found.items()}


def _nics_of(G, gpus, grp, machines, memo) -> list:
    """NIC node ids of the machine holding ranks ``grp``, in natural name order: the NICs of
    its ``host`` or, without one, those its intra-machine links reach. ``memo`` keeps the
    per-machine tables across the groups of one analysis."""
    g = gpus[grp[0]]
    host = G.nodes[g].get("host")
    if host is not None:
        if "host" not in memo:
            memo["host"] = _nics_by(G, lambda n, d: d.get("host"))
        return list(memo["host"].get(host, ()))
    comp = machines()
    if "comp" not in memo:
        memo["comp"] = _nics_by(G, lambda n, d: comp[n])
    return list(memo["comp"].get(comp[g], ()))


def _natural(name: str):
    """Sort key that orders nic2 before nic10."""
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(name))]


def log2i(n: int) -> int:
    """floor(log2 n) for n >= 1 (NCCL's log2i)."""
    return int(math.floor(math.log2(n))) if n >= 1 else 0


#: NCCL's path types, nearest first (src/graph/topo.h PATH_NVL .. PATH_SYS).
_PATH_ORDER = {"NVL": 1, "PIX": 3, "PXB": 4, "PHB": 8, "SYS": 9}


def _path_type(G, path) -> str:
    """NCCL's type of a routed path between two GPUs (nodes in order)."""
    links = [_link_class(G.edges[u, v]) for u, v in zip(path, path[1:])]
    if links and all(k in NVLINK_CLASSES for k in links):
        return "NVL"
    kinds = [G.nodes[n] for n in path[1:-1]]
    cpus = sum(d.get("kind") == "cpu" for d in kinds)
    if cpus >= 2:
        return "SYS"
    if cpus == 1:
        return "PHB"
    bridges = sum(d.get("kind") == "switch" and d.get("fabric") == "pcie" for d in kinds)
    return "PXB" if bridges > 1 else "PIX"
