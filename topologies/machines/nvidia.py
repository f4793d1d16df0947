"""NVIDIA's own 8-GPU systems: DGX-1 (V100), DGX A100, DGX H100, HGX H200, HGX B200.

Figures come from the vendor documents named in each docstring (docs/hardware.md gathers
them); the shared figures (NVLink lane, PCIe, NIC rates) are in :mod:`.parts`.
"""
from __future__ import annotations

import networkx as nx

from .._graph import add_link, add_node, new_graph
from .parts import (EDR, HDR, NDR, NVLINK3_GPU, NVLINK4_GPU, NVLINK5_GPU, NVLINK_LANE,
                    NVLINK_LATENCY, PCIE_LATENCY, PCIE_X16, QPI, SOCKET_LATENCY, gpu, nic,
                    nvswitch_box)


def dgx_a100() -> nx.Graph:
    """NVIDIA DGX A100: 8 A100 SXM4 on NVSwitch, 8 HDR NICs, PCIe gen4.

    Sources: DGX A100 system architecture white paper and user guide (6 NVSwitches, 4 PCIe
    gen4 switches each serving 2 GPUs and 2 ConnectX-6 HDR 200 Gb/s NICs, 2 AMD EPYC 7742);
    A100 datasheet for NVLink3 (12 x 25 GB/s per direction).

    Returns
    -------
    nx.Graph
        8 GPUs (``sm`` 80), 8 NICs (each 25e9 bytes/s line rate in node attr ``bandwidth``),
        5 switches, 2 CPUs; 28 links.

    Examples
    --------
    >>> G = dgx_a100()
    >>> G.edges["gpu0", "nvswitch"]["bandwidth"]
    300000000000.0
    """
    return nvswitch_box("dgx_a100", "A100-SXM4", NVLINK3_GPU, HDR, 4)


def dgx_h100() -> nx.Graph:
    """NVIDIA DGX H100: 8 H100 SXM5 on NVSwitch (NVLink4), 8 NDR NICs, PCIe gen5.

    Sources: DGX H100 user guide (4 third-generation NVSwitches, 8 ConnectX-7 NDR 400 Gb/s
    compute NICs, 2 Intel Xeon 8480C); H100 datasheet for NVLink4 (18 x 25 GB/s = 450 GB/s per
    direction). The PCIe layout (two GPUs and two NICs per gen5 switch) follows the DGX A100
    layout, a simplification to verify against ``nvidia-smi topo -m`` on a real system.
    """
    return nvswitch_box("dgx_h100", "H100-SXM5", NVLINK4_GPU, NDR, 5)


def hgx_h200() -> nx.Graph:
    """An HGX H200 8-GPU server: 8 H200 SXM on NVSwitch (NVLink4), 8 NDR NICs, PCIe gen5.

    Sources: H200 datasheet (NVLink 900 GB/s bidirectional, i.e. 18 x 25 GB/s per direction;
    PCIe gen5 x16); the HGX H200 reference design pairs each GPU with one ConnectX-7 400 Gb/s
    NIC, as the DGX H100 does. The H200 is an H100 with more and faster HBM (4.8 TB/s): the
    links, and so this graph, are those of :func:`dgx_h100`.
    """
    return nvswitch_box("hgx_h200", "H200-SXM", NVLINK4_GPU, NDR, 5)


def hgx_b200() -> nx.Graph:
    """An HGX/DGX B200 8-GPU server: 8 B200 on NVSwitch (NVLink5), 8 NDR NICs, PCIe gen5.

    Sources: DGX B200 datasheet (8 B200, NVLink 5 with 1.8 TB/s per GPU bidirectional, i.e.
    18 x 50 GB/s per direction; 2 fifth-generation NVSwitch trays; 8 single-port ConnectX-7
    VPI at 400 Gb/s for the compute fabric). Host PCIe gen5 x16 per GPU and NIC.
    """
    return nvswitch_box("hgx_b200", "B200-SXM", NVLINK5_GPU, NDR, 5)


#: NVLink lanes between GPU pairs of the DGX-1 with V100 (hybrid cube-mesh): two fully
#: connected quads {0..3}, {4..7} plus i <-> i+4, with six lanes per GPU in all
#: (DGX-1 with Tesla V100 system architecture white paper, figure of the NVLink topology;
#: ``nvidia-smi topo -m`` shows NV1/NV2 exactly as here).
DGX1_NVLINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}


def dgx1_v100() -> nx.Graph:
    """NVIDIA DGX-1 with 8 V100 SXM2: hybrid cube-mesh NVLink2, 4 EDR NICs, PCIe gen3.

    Sources: DGX-1 with Tesla V100 system architecture white paper (hybrid cube-mesh, 6 NVLink2
    per GPU at 25 GB/s per direction each, four PCIe gen3 switches each with two GPUs and one
    EDR 100 Gb/s InfiniBand NIC, two Xeon E5-2698 v4 joined by QPI).

    Each GPU pair with NVLink gets one edge whose ``lanes`` attribute is the number of NVLinks
    (1 or 2) and whose bandwidth is lanes x 25e9 bytes/s.

    Returns
    -------
    nx.Graph
        8 GPUs (``sm`` 70), 4 NICs, 4 PCIe switches, 2 CPUs; 16 NVLink + 8 + 4 + 4 PCIe + 1
        QPI = 33 links.

    Examples
    --------
    >>> G = dgx1_v100()
    >>> G.edges["gpu0", "gpu3"]["lanes"], G.edges["gpu0", "gpu1"]["lanes"]
    (2, 1)
    """
    G = new_graph("dgx1_v100")
    for c in range(2):
        add_node(G, f"cpu{c}", "cpu")
    add_link(G, "cpu0", "cpu1", QPI, SOCKET_LATENCY, "qpi")
    for p in range(4):
        add_node(G, f"pcie{p}", "switch", fabric="pcie")
        add_link(G, f"pcie{p}", f"cpu{p // 2}", PCIE_X16[3], PCIE_LATENCY, "pcie")
        nic(G, f"nic{p}", EDR)
        add_link(G, f"nic{p}", f"pcie{p}", PCIE_X16[3], PCIE_LATENCY, "pcie")
    for g in range(8):
        gpu(G, f"gpu{g}", g, "V100-SXM2")
        add_link(G, f"gpu{g}", f"pcie{g // 2}", PCIE_X16[3], PCIE_LATENCY, "pcie")
    for (a, b), lanes in DGX1_NVLINKS.items():
        add_link(G, f"gpu{a}", f"gpu{b}", lanes * NVLINK_LANE, NVLINK_LATENCY, "nvlink",
                 lanes=lanes)
    return G
