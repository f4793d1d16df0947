"""Datasheet figures and building blocks shared by the machine presets.

Bandwidths are per direction in bytes/s, latencies in seconds. Each figure names its source;
docs/hardware.md gathers them in one table.

- NVLink: 25 GB/s per direction per link for NVLink 2, 3 and 4 (V100, A100 and H100
  datasheets: 6 links = 300 GB/s, 12 links = 600 GB/s, 18 links = 900 GB/s, all
  bidirectional); NVLink 5 doubles it to 50 GB/s (B200 datasheet: 18 links = 1.8 TB/s).
- PCIe x16 per direction: gen3 8 GT/s, gen4 16 GT/s, gen5 32 GT/s with 128b/130b coding
  (PCI Express base specification): 15.75, 31.5 and 63 GB/s.
- NICs at their line rate: EDR 100 Gb/s, HDR 200 Gb/s, NDR 400 Gb/s InfiniBand; 100, 200 and
  400 Gb/s Ethernet (RoCE, EFA, TCPXO).
- QPI at 9.6 GT/s (Xeon E5 v4): 19.2 GB/s per direction.

Latencies are modelling choices of the right order, not datasheet figures: a GPU-to-GPU NVLink
hop costs 0.6 us (two 0.3 us links through an NVSwitch), a PCIe link 0.5 us and a socket link
0.5 us, so that shortest-latency routing prefers NVLink to PCIe exactly as NCCL does. NCCL's
own per-hop figures (src/graph/tuning.cc) are applied by the emulator's NCCL model, not here.
"""
from __future__ import annotations

import networkx as nx

from .._graph import add_gpu, add_link, add_node, new_graph

NVLINK_LANE = 25e9          # bytes/s per direction of one NVLink (gen 2, 3 and 4 alike)
NVLINK5_LANE = 50e9         # NVLink 5 (Blackwell)
NVLINK3_GPU = 12 * NVLINK_LANE
NVLINK4_GPU = 18 * NVLINK_LANE
NVLINK5_GPU = 18 * NVLINK5_LANE
PCIE_X16 = {3: 15.75e9, 4: 31.5e9, 5: 63e9}
GBIT = 1e9 / 8              # bytes/s of 1 Gb/s
EDR, HDR, NDR = 100 * GBIT, 200 * GBIT, 400 * GBIT
QPI = 19.2e9
#: The socket link between the two CPUs of a server, per CPU family: (vendor, link class,
#: links, bytes/s per direction of one link), from the vendors' specifications: Xeon E5 v4
#: (Broadwell) QPI at 9.6 GT/s x 2 bytes (modelled as one link, as the presets always had);
#: Xeon Scalable 3rd gen (Ice Lake) 3 UPI links at 11.2 GT/s; 4th gen (Sapphire Rapids) 4 UPI
#: 2.0 links at 16 GT/s; EPYC 7003 (Milan, Zen 3) 4 xGMI-2 x16 links at 18 Gb/s per lane;
#: EPYC 9004 (Genoa, Zen 4) 4 xGMI-3 x16 links at 32 Gb/s per lane.
CPU_FAMILIES = {
    "broadwell": ("intel", "qpi", 1, QPI),
    "icelake": ("intel", "upi", 3, 22.4e9),
    "sapphire_rapids": ("intel", "upi", 4, 32e9),
    "zen3": ("amd", "xgmi", 4, 36e9),
    "zen4": ("amd", "xgmi", 4, 64e9),
}

NVLINK_LATENCY = 0.6e-6     # a direct GPU-GPU NVLink hop
NVSWITCH_LATENCY = 0.3e-6   # GPU to the NVSwitch fabric: GPU-GPU = 0.6 us, like a direct hop
PCIE_LATENCY = 0.5e-6
SOCKET_LATENCY = 0.5e-6

#: CUDA compute capability x 10 of each GPU model the presets use (NVIDIA CUDA GPUs list);
#: the NCCL model reads it to pick its per-architecture constants.
COMPUTE_CAPABILITY = {
    "K80-GK210": 37, "V100-SXM2": 70, "A100-SXM4": 80, "A100-SXM4-40GB": 80, "A100-SXM4-80GB": 80,
    "H100-SXM5": 90, "H200-SXM": 90, "B200-SXM": 100,
    # PCIe cards (pcie_box's ``gpu``)
    "V100-PCIe": 70, "T4": 75, "A10": 86, "RTX3090": 86, "L40S": 89, "RTX4090": 89,
    "H100-PCIe": 90, "RTX5090": 120,
}
#: The PCIe cards a :func:`~topologies.machines.pcie.pcie_box` can hold.
PCIE_GPUS = ("V100-PCIe", "T4", "A10", "RTX3090", "L40S", "RTX4090", "H100-PCIe", "RTX5090")


#: NIC wire protocol -> the NCCL network transports it can carry: verbs on InfiniBand and
#: RoCE NICs (NCCL's net_ib), aws-ofi-nccl on EFA, Google's GPUDirect-TCPX/-TCPXO plugins on
#: their Ethernet GPU NICs, and NCCL's socket transport over TCP on any NIC with an IP
#: interface (IPoIB included). The NCCL model (emulator.collectives.nccl.transports) says
#: what each changes.
TRANSPORTS = {
    "ib": ("ib", "socket"),
    "roce": ("roce", "socket"),
    "efa": ("efa", "socket"),
    "ethernet": ("socket", "tcpx", "tcpxo"),
}
#: The transport NCCL runs on a NIC of each wire protocol unless told otherwise.
DEFAULT_TRANSPORT = {"ib": "ib", "roce": "roce", "efa": "efa", "ethernet": "socket"}


def check_transport(where: str, protocol: str, transport: str) -> str:
    """``transport`` if a NIC of wire ``protocol`` can run it.

    Raises
    ------
    SpecError
        Naming the transport, the NIC kind and the transports that kind runs.

    Examples
    --------
    >>> check_transport("nic", "efa", "socket")
    'socket'
    >>> check_transport("nic", "ib", "efa")
    Traceback (most recent call last):
    ...
    topologies.errors.SpecError: nic: transport='efa' cannot run on a NIC of kind 'ib' (it runs: ib, socket)
    """
    from ..errors import SpecError

    allowed = TRANSPORTS.get(protocol)
    if allowed is None:
        raise SpecError(f"{where}: NIC kind {protocol!r} is not known (known: "
                        f"{', '.join(TRANSPORTS)})")
    if transport not in allowed:
        raise SpecError(f"{where}: transport={transport!r} cannot run on a NIC of kind "
                        f"{protocol!r} (it runs: {', '.join(allowed)})")
    return transport


def nic(G: nx.Graph, node: str, bandwidth: float, protocol: str = "ib", *,
        in_order_128: bool = True, transport: str | None = None) -> None:
    """A NIC with its line rate (bytes/s) and wire protocol ("ib", "roce", "efa", "ethernet").

    ``in_order_128=False`` marks a NIC that may deliver the 128-byte aligned stores of one
    write out of order (attribute ``in_order_128``, absent means True): NCCL's LL and LL128
    protocols cannot cross it. ``transport`` is the NCCL network transport run over it
    (attribute ``transport``, one of :data:`TRANSPORTS` for the protocol; absent means
    :data:`DEFAULT_TRANSPORT`).
    """
    attrs = {} if in_order_128 else {"in_order_128": False}
    if transport is not None:
        attrs["transport"] = check_transport(f"nic {node}", protocol, transport)
    add_node(G, node, "nic", bandwidth=float(bandwidth), protocol=protocol, **attrs)


def gpu(G: nx.Graph, node: str, rank: int, model: str) -> None:
    """A GPU of ``model``, with its compute capability when the model is known."""
    attrs = {"model": model}
    if model in COMPUTE_CAPABILITY:
        attrs["sm"] = COMPUTE_CAPABILITY[model]
    add_gpu(G, node, rank, **attrs)


def nvswitch_box(name: str, model: str, gpu_bw: float, nic_bw: float, pcie_gen: int, *,
                 nics: int = 8, protocol: str = "ib", in_order_128: bool = True,
                 transport: str | None = None) -> nx.Graph:
    """8 GPUs on one NVSwitch fabric; 4 PCIe switches, each with 2 GPUs and ``nics/4`` NICs.

    The NVSwitch chips are one switch node ``nvswitch`` with a ``gpu_bw`` link per GPU: each GPU
    spreads its NVLinks over all the chips and the chips are non-blocking, so any traffic a GPU's
    links can carry is carried; one node is exact for bandwidth and keeps routing simple. NIC
    ``n`` sits on PCIe switch ``n * 4 // nics``, next to GPUs ``2s`` and ``2s + 1`` of that
    switch ``s`` (the layout of the DGX A100/H100 system architecture documents). The
    CPU-to-CPU link is not modelled: GPU and NIC traffic never needs it. ``protocol``,
    ``in_order_128`` and ``transport`` are the NICs' (:func:`nic`).
    """
    if nics % 4:
        raise ValueError(f"nvswitch_box: nics={nics} must be a multiple of 4 (one share per "
                         f"PCIe switch)")
    G = new_graph(name)
    add_node(G, "nvswitch", "switch", fabric="nvswitch")
    for c in range(2):
        add_node(G, f"cpu{c}", "cpu")
    for p in range(4):
        add_node(G, f"pcie{p}", "switch", fabric="pcie")
        add_link(G, f"pcie{p}", f"cpu{p // 2}", PCIE_X16[pcie_gen], PCIE_LATENCY, "pcie")
    for g in range(8):
        gpu(G, f"gpu{g}", g, model)
        add_link(G, f"gpu{g}", "nvswitch", gpu_bw, NVSWITCH_LATENCY, "nvswitch")
        add_link(G, f"gpu{g}", f"pcie{g // 2}", PCIE_X16[pcie_gen], PCIE_LATENCY, "pcie")
    for n in range(nics):
        nic(G, f"nic{n}", nic_bw, protocol, in_order_128=in_order_128, transport=transport)
        add_link(G, f"nic{n}", f"pcie{n * 4 // nics}", PCIE_X16[pcie_gen], PCIE_LATENCY, "pcie")
    return G
