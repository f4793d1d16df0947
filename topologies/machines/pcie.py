"""GPU servers without NVLink: the generic PCIe box and the QSGD paper's p2.16xlarge."""
from __future__ import annotations

import networkx as nx

from .._graph import add_link, add_node, check_int, check_positive, new_graph
from ..errors import SpecError
from .parts import CPU_FAMILIES, EDR, PCIE_GPUS, PCIE_LATENCY, PCIE_X16, QPI, SOCKET_LATENCY, gpu, nic


#: pcie_box layouts: GPUs behind PCIe switches, or straight on the CPUs' root ports.
LAYOUTS = ("switch", "root")
#: The CPU family a pcie_box gets by default, by PCIe generation: a platform of that era.
DEFAULT_CPU = {3: "broadwell", 4: "icelake", 5: "sapphire_rapids"}


def pcie_box(gpus: int = 8, *, gpus_per_switch: int = 4, pcie_gen: int = 3,
             nic_bandwidth: float = EDR, nics: int = 1, layout: str = "switch",
             sockets: int | None = None, cpu: str | None = None, p2p: bool = True,
             gpu_model: str = "L40S", nic_protocol: str = "ib") -> nx.Graph:
    """A PCIe-only GPU server, as people build them.

    ``layout="switch"`` (the usual 8-GPU 4U server: 8 x V100 PCIe, L40S, ...): PCIe switches
    with ``gpus_per_switch`` GPUs each, one x16 uplink per switch, switches alternating
    between the CPUs. ``layout="root"`` (workstation boards, consumer builds): every GPU on a
    CPU root port of its own, the first half on the first CPU. Two CPUs are joined by their
    family's socket links (:data:`.parts.CPU_FAMILIES`: QPI, UPI or xGMI at the vendors'
    rates); ``nics`` NICs hang off the switches (or root ports) in turn. ``p2p=False`` marks
    GPUs whose driver turns peer-to-peer access off (consumer cards): NCCL then goes through
    host memory between every pair (GPU attribute ``p2p``). NCCL's path types between the
    GPUs (PIX through one switch, PHB through a CPU, SYS across the sockets) decide P2P or
    host memory (docs/nccl.md). Sources: PCI Express base specification rates (gen3 8 GT/s,
    gen4 16, gen5 32, 128b/130b coding, x16); CPU vendors' socket-link figures.

    Parameters
    ----------
    gpus : int
        GPUs (a multiple of ``gpus_per_switch`` with switches).
    gpus_per_switch : int
        GPUs behind one PCIe switch (``layout="switch"``).
    pcie_gen : int
        3, 4 or 5 (15.75, 31.5, 63 GB/s per x16 link per direction).
    nic_bandwidth : float
        Line rate of each NIC (bytes/s); default EDR 100 Gb/s.
    nics : int
        Number of NICs (>= 1, at most one per switch or GPU).
    layout : {"switch", "root"}
    sockets : int, optional
        1 or 2 CPUs; default 2 when there are two or more switches (root ports: GPUs).
    cpu : str, optional
        CPU family (a key of :data:`.parts.CPU_FAMILIES`); default the PCIe generation's era
        (:data:`DEFAULT_CPU`: Broadwell, Ice Lake, Sapphire Rapids).
    p2p : bool
        Whether the GPUs allow peer-to-peer access.
    gpu_model : str
        The cards (:data:`~topologies.machines.parts.PCIE_GPUS`; default the L40S, NVIDIA's
        PCIe data-centre card of the Ada generation), which the compute model times.
    nic_protocol : str
        The NICs' protocol (:func:`~topologies.machines.parts.nic`): ``"ib"`` by default,
        ``"ethernet"`` for plain Ethernet (NCCL's socket transport).

    Examples
    --------
    >>> G = pcie_box(8, pcie_gen=5)
    >>> G.edges["gpu0", "pcie0"]["bandwidth"], G.edges["cpu0", "cpu1"]["link"]
    (63000000000.0, 'upi')
    >>> G = pcie_box(8, pcie_gen=5, layout="root", cpu="zen4", p2p=False)
    >>> G.edges["gpu0", "cpu0"]["bandwidth"], G.nodes["gpu0"]["p2p"], G.nodes["cpu1"]["vendor"]
    (63000000000.0, False, 'amd')
    """
    fam = "pcie_box"
    gpus = check_int(fam, "gpus", gpus, 1)
    gpus_per_switch = check_int(fam, "gpus_per_switch", gpus_per_switch, 1)
    if layout not in LAYOUTS:
        raise SpecError(f"{fam}: layout={layout!r} must be one of {', '.join(LAYOUTS)}")
    if pcie_gen not in PCIE_X16:
        raise SpecError(f"{fam}: pcie_gen={pcie_gen!r} must be one of {sorted(PCIE_X16)}")
    if layout == "switch" and gpus % gpus_per_switch:
        raise SpecError(f"{fam}: gpus={gpus} is not a multiple of gpus_per_switch="
                        f"{gpus_per_switch}")
    if cpu is None:
        cpu = DEFAULT_CPU[pcie_gen]
    if cpu not in CPU_FAMILIES:
        raise SpecError(f"{fam}: cpu={cpu!r} must be one of {', '.join(CPU_FAMILIES)}")
    if not isinstance(p2p, bool):
        raise SpecError(f"{fam}: p2p={p2p!r} must be on or off (true or false)")
    nic_bandwidth = check_positive(fam, "nic_bandwidth", nic_bandwidth)
    if gpu_model not in PCIE_GPUS:
        raise SpecError(f"{fam}: gpu={gpu_model!r} must be one of {list(PCIE_GPUS)}")
    groups = gpus // gpus_per_switch if layout == "switch" else gpus
    if sockets is None:
        sockets = 2 if groups >= 2 else 1
    sockets = check_int(fam, "sockets", sockets, 1)
    if sockets > 2 or sockets > groups:
        raise SpecError(f"{fam}: sockets={sockets} must be 1 or 2 (and at most the "
                        f"{groups} {'switches' if layout == 'switch' else 'GPUs'})")
    nics = check_int(fam, "nics", nics, 1)
    if nics > groups:
        raise SpecError(f"{fam}: nics={nics} must be <= the number of "
                        f"{'PCIe switches' if layout == 'switch' else 'GPUs'} ({groups})")
    bw = PCIE_X16[pcie_gen]
    vendor, link, links, link_bw = CPU_FAMILIES[cpu]
    G = new_graph(f"pcie_box:gpus={gpus}")
    for c in range(sockets):
        add_node(G, f"cpu{c}", "cpu", model=cpu, vendor=vendor)
    if sockets == 2:
        add_link(G, "cpu0", "cpu1", links * link_bw, SOCKET_LATENCY, link)
    if layout == "switch":
        for s in range(groups):
            add_node(G, f"pcie{s}", "switch", fabric="pcie")
            add_link(G, f"pcie{s}", f"cpu{s % sockets}", bw, PCIE_LATENCY, "pcie")
            if s < nics:
                nic(G, f"nic{s}", nic_bandwidth, nic_protocol)
                add_link(G, f"nic{s}", f"pcie{s}", bw, PCIE_LATENCY, "pcie")
        home = [f"pcie{g // gpus_per_switch}" for g in range(gpus)]
    else:
        half = -(-gpus // sockets)
        home = [f"cpu{g // half}" for g in range(gpus)]
        for n in range(nics):
            nic(G, f"nic{n}", nic_bandwidth, nic_protocol)
            add_link(G, f"nic{n}", home[n * gpus // nics], bw, PCIE_LATENCY, "pcie")
    for g in range(gpus):
        gpu(G, f"gpu{g}", g, gpu_model)
        if not p2p:
            G.nodes[f"gpu{g}"]["p2p"] = False
        add_link(G, f"gpu{g}", home[g], bw, PCIE_LATENCY, "pcie")
    return G


def rtx4090_box() -> nx.Graph:
    """A consumer-card training server: 8 RTX 4090 on the CPU root ports of a dual-socket
    AMD EPYC (Zen 4) board, PCIe gen4 x16 each, P2P off, one 25 GbE NIC (NCCL's socket
    transport).

    The build people make of GeForce cards: a 4U chassis whose board gives every double-width
    GPU a CPU root port (no PCIe switch), the two sockets joined by xGMI. NVIDIA's driver
    ships peer-to-peer access turned off on GeForce cards, so NCCL moves every intra-node byte
    through host memory (SHM); an Ethernet NIC makes NCCL use its socket transport. Sources:
    PCI Express base specification (gen4 x16, 31.5 GB/s), the RTX 4090 (Ada whitepaper
    appendix A: PCIe 4.0 x16), AMD's Zen 4 xGMI figures (:data:`.parts.CPU_FAMILIES`).

    Examples
    --------
    >>> G = rtx4090_box()
    >>> sorted({d["model"] for _, d in G.nodes(data=True) if d["kind"] == "gpu"}), G.nodes["gpu0"]["p2p"]
    (['RTX4090'], False)
    """
    G = pcie_box(8, pcie_gen=4, layout="root", cpu="zen4", p2p=False, gpu_model="RTX4090",
                 nic_bandwidth=25e9 / 8, nic_protocol="ethernet")
    G.graph["name"] = "rtx4090_box"
    return G


def p2_16xlarge() -> nx.Graph:
    """Amazon EC2 p2.16xlarge: 16 K80 GPUs (8 boards) on PCIe gen3; the QSGD paper's machine.

    Sources: AWS EC2 P2 instance page (16 NVIDIA K80 GPUs, i.e. 8 dual-GK210 boards, GPUDirect
    peer-to-peer, 2 Xeon E5-2686 v4, 25 Gb/s networking -- verify the figure for the exact
    generation); NVIDIA K80 datasheet (two GK210 behind an on-board PCIe gen3 switch).

    Modelling choice: each K80 board is a PCIe switch ``k80_{b}`` with its two GPUs and one x16
    uplink; two host PCIe switches per socket carry two boards each; the sockets are joined
    by QPI. The single NIC (ENA, 25 Gb/s = 3.125e9 bytes/s) hangs off ``cpu0``.
    """
    G = new_graph("p2_16xlarge")
    bw = PCIE_X16[3]
    for c in range(2):
        add_node(G, f"cpu{c}", "cpu")
    add_link(G, "cpu0", "cpu1", QPI, SOCKET_LATENCY, "qpi")
    nic(G, "nic0", 25e9 / 8, protocol="ethernet")
    add_link(G, "nic0", "cpu0", bw, PCIE_LATENCY, "pcie")
    for s in range(4):
        add_node(G, f"pcie{s}", "switch", fabric="pcie")
        add_link(G, f"pcie{s}", f"cpu{s // 2}", bw, PCIE_LATENCY, "pcie")
    for b in range(8):
        add_node(G, f"k80_{b}", "switch", fabric="pcie")
        add_link(G, f"k80_{b}", f"pcie{b // 2}", bw, PCIE_LATENCY, "pcie")
        for j in range(2):
            g = 2 * b + j
            gpu(G, f"gpu{g}", g, "K80-GK210")
            add_link(G, f"gpu{g}", f"k80_{b}", bw, PCIE_LATENCY, "pcie")
    return G
