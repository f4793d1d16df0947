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

import weakref
from dataclasses import dataclass, field

import networkx as nx

from ...errors import ConfigError
from . import constants as C
from .graphfacts import (NVLINK_CLASSES, _PATH_ORDER, _group_by_node, _link_class, _machines,
                         _natural, _nics_of, _nvswitch_joins, _path_type)
from .hops import HopFacts
from .hosts import host_facts

#: graph -> (fingerprint, {ranks: NcclSystem}); weak, so a graph's analyses go with it.
_SYSTEMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass
class NcclSystem(HopFacts):
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
    #: (stops, flow) -> (inflation, network) of hops timed in bulk (:meth:`brief`)
    _briefs: dict = field(default_factory=dict, repr=False, compare=False)
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
        import topologies

        if G is None:
            raise ConfigError("NCCL algorithms need graph= (the topology the ranks run on)")
        ranks = tuple(int(r) for r in ranks)
        fp = topologies.fingerprint(G)   # what the analysis reads: links and node attributes
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
