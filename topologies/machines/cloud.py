"""The 8-GPU cloud instances people rent: AWS p4d, p4de and p5, GCP A3 Mega, OCI
BM.GPU.H100.8 and Azure ND H100 v5.

Each is an NVSwitch box (:func:`.parts.nvswitch_box`) with the provider's NICs; the figures are
the providers' instance pages as of 2024-2025 (docs/hardware.md has the URLs). The NIC
``protocol`` becomes the link class of the NIC-to-fabric links in :func:`topologies.cluster`:
``efa`` (AWS Elastic Fabric Adapter, SRD over Ethernet), ``roce``, ``ib`` or ``ethernet``
(TCP, as GCP's GPUDirect-TCPXO).
"""
from __future__ import annotations

import networkx as nx

from .parts import GBIT, NDR, NVLINK3_GPU, NVLINK4_GPU, nvswitch_box


def p4d() -> nx.Graph:
    """AWS EC2 p4d.24xlarge: 8 A100 40GB SXM4 on NVSwitch, 4 x 100 Gb/s EFA, PCIe gen4.

    Sources: AWS EC2 P4 instance page (8 A100 Tensor Core GPUs, 600 GB/s NVSwitch GPU
    interconnect, 400 Gbps of Elastic Fabric Adapter networking with GPUDirect RDMA as four
    100 Gbps EFA interfaces). Each EFA interface sits on one of the four PCIe switches, next to
    two GPUs. The first EFA generation does not keep 128-byte aligned writes in order, so NCCL's
    EFA plugin runs NCCL with ``NCCL_PROTO=simple`` between p4d nodes (aws-ofi-nccl
    src/platform-aws.c: p4d and p4de forced to Simple, later versions probing the endpoint's
    ``FI_OPT_EFA_*_IN_ORDER_ALIGNED_128_BYTES``): the NICs carry ``in_order_128=False``.

    Examples
    --------
    >>> sorted(n for n, d in p4d().nodes(data=True) if d["kind"] == "nic")
    ['nic0', 'nic1', 'nic2', 'nic3']
    """
    return nvswitch_box("p4d", "A100-SXM4-40GB", NVLINK3_GPU, 100 * GBIT, 4, nics=4, protocol="efa",
                        in_order_128=False)


def p4de() -> nx.Graph:
    """AWS EC2 p4de.24xlarge: as :func:`p4d` with 8 A100 80GB (same links and 4 x 100 Gb/s EFA).

    Sources: AWS EC2 P4 instance page (p4de.24xlarge: 8 A100 80GB, 600 GB/s NVSwitch,
    400 Gbps EFA; NCCL runs Simple only between p4de nodes, as on p4d).
    """
    return nvswitch_box("p4de", "A100-SXM4-80GB", NVLINK3_GPU, 100 * GBIT, 4, nics=4, protocol="efa",
                        in_order_128=False)


def p5() -> nx.Graph:
    """AWS EC2 p5.48xlarge: 8 H100 SXM on NVSwitch, 3200 Gb/s of EFA, PCIe gen5.

    Sources: AWS EC2 P5 instance page (8 H100, 900 GB/s NVSwitch GPU interconnect, 3200 Gbps
    EFA v2 networking as 32 network cards of 100 Gbps with GPUDirect RDMA).

    Modelling choice: the four 100 Gb/s EFA devices that share a GPU's PCIe switch are one NIC
    node of 400 Gb/s (eight NICs in all), which is how NCCL's aws-ofi-nccl plugin drives them
    (one NCCL network device per GPU, striping over its four EFA rails). The total, 3200 Gb/s,
    is the datasheet's.
    """
    return nvswitch_box("p5", "H100-SXM5", NVLINK4_GPU, 400 * GBIT, 5, nics=8, protocol="efa")


def a3_mega() -> nx.Graph:
    """Google Cloud a3-megagpu-8g (A3 Mega): 8 H100 SXM on NVSwitch, 8 x 200 Gb/s GPU NICs.

    Sources: Google Cloud GPU machine types page (A3 Mega: 8 H100 80GB, NVLink 900 GB/s,
    1,800 Gbps total network bandwidth of which 8 x 200 Gbps GPUDirect-TCPXO NICs carry GPU
    traffic). TCPXO is TCP over Ethernet: link class ``ethernet``.
    """
    return nvswitch_box("a3_mega", "H100-SXM5", NVLINK4_GPU, 200 * GBIT, 5, nics=8,
                        protocol="ethernet", transport="tcpxo")


def bm_gpu_h100() -> nx.Graph:
    """Oracle Cloud BM.GPU.H100.8: 8 H100 SXM on NVSwitch, 16 x 200 Gb/s RoCE NICs, PCIe gen5.

    Sources: OCI compute shapes page (BM.GPU.H100.8: 8 H100 80GB, 3,200 Gb/s RDMA cluster
    network as 16 x 200 Gb/s ConnectX-7 RoCE v2 NICs). Four NICs per PCIe switch, two per GPU.
    """
    return nvswitch_box("bm_gpu_h100", "H100-SXM5", NVLINK4_GPU, 200 * GBIT, 5, nics=16,
                        protocol="roce")


def nd_h100_v5() -> nx.Graph:
    """Azure ND H100 v5 (Standard_ND96isr_H100_v5): 8 H100 SXM on NVSwitch, 8 x 400 Gb/s NDR IB.

    Sources: Azure ND H100 v5 series page (8 H100 80GB interconnected by NVLink 4.0, 3.2 Tb/s
    of interconnect: one 400 Gb/s NVIDIA Quantum-2 ConnectX-7 InfiniBand per GPU).
    """
    return nvswitch_box("nd_h100_v5", "H100-SXM5", NVLINK4_GPU, NDR, 5)
