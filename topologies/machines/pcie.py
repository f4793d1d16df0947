"""GPU servers without NVLink: the generic PCIe box and the QSGD paper's p2.16xlarge."""
from __future__ import annotations

import networkx as nx

from .._graph import add_link, add_node, check_int, check_positive, new_graph
from ..errors import SpecError
from .parts import EDR, PCIE_GPUS, PCIE_LATENCY, PCIE_X16, QPI, SOCKET_LATENCY, gpu, nic


def pcie_box(gpus: int = 8, *, gpus_per_switch: int = 4, pcie_gen: int = 3,
             nic_bandwidth: float = EDR, nics: int = 1, gpu_model: str = "L40S") -> nx.Graph:
    """A PCIe-only GPU server: two sockets, PCIe switches with ``gpus_per_switch`` GPUs each.

    The usual 8-GPU PCIe layout (e.g. 8 x V100 PCIe, L40S or RTX cards in a 4U server): PCIe
    switches alternate between the two CPUs, the CPUs are joined by QPI (19.2 GB/s), so GPU
    pairs on different sockets pay the socket link. ``nics`` NICs hang off the PCIe switches in
    turn. Sources: PCI Express base specification rates (gen3 8 GT/s, gen4 16, gen5 32,
    128b/130b coding, x16); Intel Xeon E5 v4 datasheet for QPI at 9.6 GT/s.

    Parameters
    ----------
    gpus : int
        GPUs, a multiple of ``gpus_per_switch``.
    gpus_per_switch : int
        GPUs behind one PCIe switch (the switch has one x16 uplink to its CPU).
    pcie_gen : int
        3, 4 or 5 (15.75, 31.5, 63 GB/s per x16 link per direction).
    nic_bandwidth : float
        Line rate of each NIC (bytes/s); default EDR 100 Gb/s.
    nics : int
        Number of NICs (>= 1, at most one per switch).
    gpu_model : str
        The cards (:data:`~topologies.machines.parts.PCIE_GPUS`; default the L40S, NVIDIA's
        PCIe data-centre card of the Ada generation), which the compute model times.

    Examples
    --------
    >>> G = pcie_box(8, pcie_gen=5)
    >>> G.edges["gpu0", "pcie0"]["bandwidth"]
    63000000000.0
    """
    fam = "pcie_box"
    gpus = check_int(fam, "gpus", gpus, 1)
    gpus_per_switch = check_int(fam, "gpus_per_switch", gpus_per_switch, 1)
    if gpus % gpus_per_switch:
        raise SpecError(f"{fam}: gpus={gpus} is not a multiple of gpus_per_switch="
                        f"{gpus_per_switch}")
    if pcie_gen not in PCIE_X16:
        raise SpecError(f"{fam}: pcie_gen={pcie_gen!r} must be one of {sorted(PCIE_X16)}")
    nic_bandwidth = check_positive(fam, "nic_bandwidth", nic_bandwidth)
    if gpu_model not in PCIE_GPUS:
        raise SpecError(f"{fam}: gpu={gpu_model!r} must be one of {list(PCIE_GPUS)}")
    switches = gpus // gpus_per_switch
    nics = check_int(fam, "nics", nics, 1)
    if nics > switches:
        raise SpecError(f"{fam}: nics={nics} must be <= the number of PCIe switches ({switches})")
    bw = PCIE_X16[pcie_gen]
    G = new_graph(f"pcie_box:gpus={gpus}")
    cpus = 2 if switches >= 2 else 1
    for c in range(cpus):
        add_node(G, f"cpu{c}", "cpu")
    if cpus == 2:
        add_link(G, "cpu0", "cpu1", QPI, SOCKET_LATENCY, "qpi")
    for s in range(switches):
        add_node(G, f"pcie{s}", "switch", fabric="pcie")
        add_link(G, f"pcie{s}", f"cpu{s % cpus}", bw, PCIE_LATENCY, "pcie")
        if s < nics:
            nic(G, f"nic{s}", nic_bandwidth)
            add_link(G, f"nic{s}", f"pcie{s}", bw, PCIE_LATENCY, "pcie")
    for g in range(gpus):
        gpu(G, f"gpu{g}", g, gpu_model)
        add_link(G, f"gpu{g}", f"pcie{g // gpus_per_switch}", bw, PCIE_LATENCY, "pcie")
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
