"""Clusters: copies of one machine joined through a fabric by their NICs.

Ranks run node-major like ``torchrun`` (machine i, local GPU j -> rank i*g + j, g GPUs per
machine). Machine node ``x`` of machine i becomes ``n{i}.x`` with attribute ``host=i``; fabric
switches keep their own names (``leaf3``, ``spine0``, ``pod1.edge2``, ``su0.rail5``).
"""
from __future__ import annotations

import inspect
import math
from typing import Callable

import networkx as nx

from ._graph import add_link, add_node, check_int, check_link, check_positive, gpus, new_graph
from .errors import SpecError
from .fat_tree import build_fat_tree_fabric, check_k
from .leaf_spine import build_leaf_spine_fabric, uplink_for
from .machines import PRESETS
from .machines.parts import check_transport

#: Default fabric hop latency (s): a switch port-to-port traversal plus cable, the order of an
#: InfiniBand or RoCE switch hop as seen end to end.
FABRIC_LATENCY = 1e-6


def _leaf_spine(G, ends, bw, latency, link, hosts_per_leaf=32, spines=None,
                oversubscription=1.0):
    """Endpoints fill leaves in order (consecutive machines share a leaf)."""
    hosts_per_leaf = check_int("cluster", "hosts_per_leaf", hosts_per_leaf, 1)
    oversubscription = check_positive("cluster", "oversubscription", oversubscription)
    leaves = math.ceil(len(ends) / hosts_per_leaf)
    if spines is None:
        spines = 0 if leaves == 1 else math.ceil(hosts_per_leaf / oversubscription)
    else:
        spines = check_int("cluster", "spines", spines, 1)
    up = uplink_for(hosts_per_leaf, max(spines, 1), bw, oversubscription)
    slots = build_leaf_spine_fabric(G, leaves, spines, hosts_per_leaf, up, latency, link)
    return [slots[i] for i in range(len(ends))]


def _fat_tree(G, ends, bw, latency, link, k=None):
    """Endpoints fill host ports in order; k defaults to the smallest even k that fits."""
    if k is None:
        k = 2
        while k ** 3 // 4 < len(ends):
            k += 2
    k = check_k("cluster", k)
    if k ** 3 // 4 < len(ends):
        raise SpecError(f"cluster: k={k} gives {k ** 3 // 4} host ports, fewer than the "
                        f"{len(ends)} NICs")
    slots = build_fat_tree_fabric(G, k, bw, latency, link)
    return slots[:len(ends)]


def _rail(G, ends, bw, latency, link, nodes_per_unit=32, spines=None, oversubscription=1.0):
    """Rail-optimized (NVIDIA DGX SuperPOD): NIC j of every machine of a scalable unit goes
    to the unit's rail-j leaf, so same-rail traffic stays one switch hop; all leaves reach
    every spine."""
    nodes_per_unit = check_int("cluster", "nodes_per_unit", nodes_per_unit, 1)
    oversubscription = check_positive("cluster", "oversubscription", oversubscription)
    rails = max(j for _, _, j in ends) + 1
    machines = max(i for _, i, _ in ends) + 1
    units = math.ceil(machines / nodes_per_unit)
    down = min(nodes_per_unit, machines)
    if spines is None:
        spines = 0 if units * rails == 1 else math.ceil(down / oversubscription)
    else:
        spines = check_int("cluster", "spines", spines, 1)
    up = uplink_for(down, max(spines, 1), bw, oversubscription)
    for s in range(spines):
        add_node(G, f"spine{s}", "switch", tier="spine")
    for u in range(units):
        for j in range(rails):
            leaf = f"su{u}.rail{j}"
            add_node(G, leaf, "switch", tier="leaf", rail=j, unit=u)
            for s in range(spines):
                add_link(G, leaf, f"spine{s}", up, latency, link)
    return [f"su{i // nodes_per_unit}.rail{j}" for _, i, j in ends]


#: fabric name -> function(G, endpoints, bandwidth, latency, link, **options) -> leaf per
#: endpoint. Endpoints are (nic node, machine index, nic index) in node-major order.
FABRICS: dict[str, Callable] = {
    "leaf_spine": _leaf_spine,
    "fat_tree": _fat_tree,
    "rail": _rail,
}


def cluster(node="dgx_a100", nodes: int = 2, *, fabric: str = "leaf_spine",
            nic_bandwidth: float | None = None, latency: float = FABRIC_LATENCY,
            link: str | None = None, transport: str | None = None, p2p: bool | None = None,
            **fabric_options) -> nx.Graph:
    """``nodes`` copies of a machine joined through a fabric by their NICs.

    Parameters
    ----------
    node : str or nx.Graph
        A preset name (see :data:`PRESETS`) or a machine graph with at least one ``nic`` node.
    nodes : int
        Number of machines (>= 1).
    fabric : {"leaf_spine", "fat_tree", "rail"}
        ``leaf_spine``: NICs fill 32-port leaves in order (options ``hosts_per_leaf``,
        ``spines``, ``oversubscription``); ``fat_tree``: a k-ary fat tree with NICs on host
        ports (option ``k``, default the smallest that fits); ``rail``: rail-optimized, NIC j
        of each machine on rail leaf j of its scalable unit (options ``nodes_per_unit``,
        ``spines``, ``oversubscription``).
    nic_bandwidth : float, optional
        Bytes/s per direction of each NIC-to-fabric link; default the NIC's line rate (node
        attr ``bandwidth``). Switch-to-switch links are sized from it (non-blocking unless
        ``oversubscription`` > 1).
    latency : float
        Seconds per fabric link.
    link : str, optional
        Class of the fabric links; default the NICs' ``protocol`` (``"ib"`` or ``"ethernet"``).
    transport : str, optional
        The NCCL network transport every NIC runs (``"socket"``, ``"tcpx"``, ...; one its
        kind can run, :data:`.machines.parts.TRANSPORTS`); default each NIC's own.
    p2p : bool, optional
        Whether the GPUs allow peer-to-peer access over PCIe (GPU attribute ``p2p``; False on
        consumer cards); only for machines whose GPUs talk over PCIe.

    Returns
    -------
    nx.Graph
        Graph attr ``name`` = ``cluster:{node}x{nodes},fabric={fabric}``.
    """
    fam = "cluster"
    if fabric not in FABRICS:
        raise SpecError(f"{fam}: fabric={fabric!r} is not known (known: {', '.join(FABRICS)})")
    nodes = check_int(fam, "nodes", nodes, 1)
    latency = check_positive(fam, "latency", latency)
    if isinstance(node, str):
        if node not in PRESETS:
            import difflib

            close = difflib.get_close_matches(node, list(PRESETS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SpecError(f"{fam}: node={node!r} is not a preset{hint}; known: "
                            f"{', '.join(PRESETS)}")
        machine, label = PRESETS[node](), node
    elif isinstance(node, nx.Graph):
        machine, label = node, str(node.graph.get("name", "machine"))
    else:
        raise SpecError(f"{fam}: node={node!r} must be a preset name or a machine graph")
    local = gpus(machine)
    nics = [n for n, d in machine.nodes(data=True) if d.get("kind") == "nic"]
    if not nics:
        raise SpecError(f"{fam}: machine {label!r} has no 'nic' node to join to the fabric")
    if nic_bandwidth is None:
        missing = [n for n in nics if "bandwidth" not in machine.nodes[n]]
        if missing:
            raise SpecError(f"{fam}: NIC {missing[0]!r} of {label!r} has no 'bandwidth' "
                            f"attribute; pass nic_bandwidth")
        rates = [float(machine.nodes[n]["bandwidth"]) for n in nics]
    else:
        rates = [check_positive(fam, "nic_bandwidth", nic_bandwidth)] * len(nics)
    if p2p is not None:
        if not isinstance(p2p, bool):
            raise SpecError(f"{fam}: p2p={p2p!r} must be on or off (true or false)")
        nvlink = sorted({str(d.get("link")) for a, b, d in machine.edges(data=True)
                         if (a in local or b in local) and d.get("link") in ("nvlink", "nvswitch")})
        if nvlink:
            raise SpecError(f"{fam}: p2p={'on' if p2p else 'off'} applies to GPUs that talk over "
                            f"PCIe; the GPUs of {label!r} are joined by {', '.join(nvlink)}")
    if transport is not None:
        for n in nics:
            check_transport(fam, str(machine.nodes[n].get("protocol", "ib")), transport)
    if link is None:
        link = str(machine.nodes[nics[0]].get("protocol", "ib"))
    link = check_link(fam, link)
    g = len(local)
    local_rank = {n: machine.nodes[n]["rank"] for n in local}
    G = new_graph(f"cluster:{label}x{nodes},fabric={fabric}")
    ends = []
    for i in range(nodes):
        pre = f"n{i}."
        for n, d in machine.nodes(data=True):
            attrs = dict(d)
            attrs["host"] = i
            if transport is not None and d.get("kind") == "nic":
                attrs["transport"] = transport
            if p2p is not None and d.get("kind") == "gpu":
                attrs["p2p"] = p2p
            if n in local_rank:
                attrs["rank"] = i * g + local_rank[n]
            G.add_node(pre + str(n), **attrs)
        for a, b, d in machine.edges(data=True):
            G.add_edge(pre + str(a), pre + str(b), **d)
        ends.extend((pre + str(n), i, j) for j, n in enumerate(nics))
    build = FABRICS[fabric]
    known = list(inspect.signature(build).parameters)[5:]
    for key in fabric_options:
        if key not in known:
            raise SpecError(f"{fam}: option {key}={fabric_options[key]!r} is not an option of "
                            f"fabric {fabric!r} (options: {', '.join(known)})")
    leaves = build(G, ends, max(rates), latency, link, **fabric_options)
    for (nic, _, j), leaf in zip(ends, leaves):
        add_link(G, nic, leaf, rates[j], latency, link)
    return G
