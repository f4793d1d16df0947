"""Multi-GPU machines as presets, with the numbers of their datasheets.

Bandwidths are per direction (bytes/s). Sources (shared/REFERENCES.md gathers them):

- NVLink2 (V100 SXM2): 6 links x 25 GB/s = 150 GB/s per GPU (NVIDIA Tesla V100 datasheet,
  "300 GB/s" bidirectional).
- NVLink3 (A100 SXM4): 12 links x 25 GB/s = 300 GB/s per GPU (A100 datasheet, "600 GB/s").
- NVLink4 (H100 SXM5): 18 links x 25 GB/s = 450 GB/s per GPU (H100 datasheet, "900 GB/s").
- PCIe x16 per direction: gen3 15.75 GB/s (8 GT/s, 128b/130b), gen4 31.5, gen5 63.
- NICs: EDR InfiniBand 100 Gb/s = 12.5 GB/s, HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s;
  DGX-1 has 4 EDR NICs, DGX A100 8 HDR compute NICs, DGX H100 8 NDR compute NICs.
- QPI at 9.6 GT/s (Xeon E5 v4, DGX-1 and p2.16xlarge): 19.2 GB/s per direction.

Latencies are modelling choices of the right order, not datasheet figures: NCCL's tuning
model (src/graph/tuning.cc) uses per-step hardware latencies of about 0.6 us over NVLink and
several us over the network. Here a GPU-to-GPU NVLink hop costs 0.6 us (two 0.3 us links
through an NVSwitch), a PCIe link 0.5 us and a socket link 0.5 us, so that shortest-latency
routing prefers NVLink to PCIe exactly as NCCL does.
"""
from __future__ import annotations

import networkx as nx

from ._graph import add_gpu, add_link, add_node, check_int, check_positive, new_graph
from .errors import SpecError

NVLINK_LANE = 25e9          # bytes/s per direction of one NVLink (gen 2, 3 and 4 alike)
NVLINK3_GPU = 12 * NVLINK_LANE
NVLINK4_GPU = 18 * NVLINK_LANE
PCIE_X16 = {3: 15.75e9, 4: 31.5e9, 5: 63e9}
EDR, HDR, NDR = 12.5e9, 25e9, 50e9
QPI = 19.2e9

NVLINK_LATENCY = 0.6e-6     # a direct GPU-GPU NVLink hop
NVSWITCH_LATENCY = 0.3e-6   # GPU to the NVSwitch fabric: GPU-GPU = 0.6 us, like a direct hop
PCIE_LATENCY = 0.5e-6
SOCKET_LATENCY = 0.5e-6


def _nic(G, node, bandwidth, protocol="ib"):
    add_node(G, node, "nic", bandwidth=float(bandwidth), protocol=protocol)


def _nvswitch_box(name: str, model: str, gpu_bw: float, nic_bw: float, gen: int) -> nx.Graph:
    """8 GPUs on one NVSwitch fabric; 4 PCIe switches with 2 GPUs and 2 NICs each; 2 CPUs."""
    G = new_graph(name)
    add_node(G, "nvswitch", "switch", fabric="nvswitch")
    for c in range(2):
        add_node(G, f"cpu{c}", "cpu")
    for p in range(4):
        add_node(G, f"pcie{p}", "switch", fabric="pcie")
        add_link(G, f"pcie{p}", f"cpu{p // 2}", PCIE_X16[gen], PCIE_LATENCY, "pcie")
    for g in range(8):
        add_gpu(G, f"gpu{g}", g, model=model)
        add_link(G, f"gpu{g}", "nvswitch", gpu_bw, NVSWITCH_LATENCY, "nvswitch")
        add_link(G, f"gpu{g}", f"pcie{g // 2}", PCIE_X16[gen], PCIE_LATENCY, "pcie")
    for n in range(8):
        _nic(G, f"nic{n}", nic_bw)
        add_link(G, f"nic{n}", f"pcie{n // 2}", PCIE_X16[gen], PCIE_LATENCY, "pcie")
    return G


def dgx_a100() -> nx.Graph:
    """NVIDIA DGX A100: 8 A100 SXM4 on NVSwitch, 8 HDR NICs, PCIe gen4.

    Sources: DGX A100 system architecture white paper and user guide (6 NVSwitches, 4 PCIe
    gen4 switches each serving 2 GPUs and 2 ConnectX-6 HDR 200 Gb/s NICs, 2 AMD EPYC 7742);
    A100 datasheet for NVLink3 (12 x 25 GB/s).

    Modelling choice: the six NVSwitch chips are one switch node ``nvswitch`` with a
    300 GB/s link per GPU. Each GPU spreads its 12 NVLinks over all six chips (2 each) and the
    chips are non-blocking, so any traffic pattern that a GPU's 12 links can carry is carried:
    one node is exact for bandwidth and keeps routing simple. The CPU-to-CPU (xGMI) link is not
    modelled; GPU and NIC traffic never needs it.

    Returns
    -------
    nx.Graph
        8 GPUs, 8 NICs (each 25e9 bytes/s line rate in node attr ``bandwidth``), 5 switches,
        2 CPUs; 28 links.
    """
    return _nvswitch_box("dgx_a100", "A100-SXM4", NVLINK3_GPU, HDR, 4)


def dgx_h100() -> nx.Graph:
    """NVIDIA DGX H100: 8 H100 SXM5 on NVSwitch (NVLink4), 8 NDR NICs, PCIe gen5.

    Sources: DGX H100 user guide (4 third-generation NVSwitches, 8 ConnectX-7 NDR 400 Gb/s
    compute NICs, 2 Intel Xeon 8480C); H100 datasheet for NVLink4 (18 x 25 GB/s = 450 GB/s).
    The NVSwitches are one node, as in :func:`dgx_a100`; the PCIe layout (two GPUs and two NICs
    per gen5 switch) follows the DGX A100 layout, a simplification to verify against
    ``nvidia-smi topo -m`` on a real system.
    """
    return _nvswitch_box("dgx_h100", "H100-SXM5", NVLINK4_GPU, NDR, 5)


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
        8 GPUs, 4 NICs, 4 PCIe switches, 2 CPUs; 16 NVLink + 8 + 4 + 4 PCIe + 1 QPI = 33 links.
    """
    G = new_graph("dgx1_v100")
    for c in range(2):
        add_node(G, f"cpu{c}", "cpu")
    add_link(G, "cpu0", "cpu1", QPI, SOCKET_LATENCY, "qpi")
    for p in range(4):
        add_node(G, f"pcie{p}", "switch", fabric="pcie")
        add_link(G, f"pcie{p}", f"cpu{p // 2}", PCIE_X16[3], PCIE_LATENCY, "pcie")
        _nic(G, f"nic{p}", EDR)
        add_link(G, f"nic{p}", f"pcie{p}", PCIE_X16[3], PCIE_LATENCY, "pcie")
    for g in range(8):
        add_gpu(G, f"gpu{g}", g, model="V100-SXM2")
        add_link(G, f"gpu{g}", f"pcie{g // 2}", PCIE_X16[3], PCIE_LATENCY, "pcie")
    for (a, b), lanes in DGX1_NVLINKS.items():
        add_link(G, f"gpu{a}", f"gpu{b}", lanes * NVLINK_LANE, NVLINK_LATENCY, "nvlink",
                 lanes=lanes)
    return G


def pcie_box(gpus: int = 8, *, gpus_per_switch: int = 4, pcie_gen: int = 3,
             nic_bandwidth: float = EDR, nics: int = 1) -> nx.Graph:
    """A PCIe-only GPU server: two sockets, PCIe switches with ``gpus_per_switch`` GPUs each.

    The usual 8-GPU PCIe layout (e.g. 8 x V100 PCIe or T4 in a 4U server): PCIe switches
    alternate between the two CPUs, the CPUs are joined by QPI (19.2 GB/s), so GPU pairs on
    different sockets pay the socket link. ``nics`` NICs hang off the PCIe switches in turn.
    Sources: PCI Express base specification rates (gen3 8 GT/s, gen4 16, gen5 32, 128b/130b
    coding, x16); Intel Xeon E5 v4 datasheet for QPI at 9.6 GT/s.

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
            _nic(G, f"nic{s}", nic_bandwidth)
            add_link(G, f"nic{s}", f"pcie{s}", bw, PCIE_LATENCY, "pcie")
    for g in range(gpus):
        add_gpu(G, f"gpu{g}", g, model="PCIe-GPU")
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
    _nic(G, "nic0", 25e9 / 8, protocol="ethernet")
    add_link(G, "nic0", "cpu0", bw, PCIE_LATENCY, "pcie")
    for s in range(4):
        add_node(G, f"pcie{s}", "switch", fabric="pcie")
        add_link(G, f"pcie{s}", f"cpu{s // 2}", bw, PCIE_LATENCY, "pcie")
    for b in range(8):
        add_node(G, f"k80_{b}", "switch", fabric="pcie")
        add_link(G, f"k80_{b}", f"pcie{b // 2}", bw, PCIE_LATENCY, "pcie")
        for j in range(2):
            g = 2 * b + j
            add_gpu(G, f"gpu{g}", g, model="K80-GK210")
            add_link(G, f"gpu{g}", f"k80_{b}", bw, PCIE_LATENCY, "pcie")
    return G


#: preset name -> builder (no required argument).
PRESETS = {
    "dgx1_v100": dgx1_v100,
    "dgx_a100": dgx_a100,
    "dgx_h100": dgx_h100,
    "pcie_box": pcie_box,
    "p2_16xlarge": p2_16xlarge,
}
