"""The network transports NCCL runs between nodes, and what each changes in the model.

A NIC's ``transport`` attribute (topologies: ``nic(..., transport=)``, ``cluster:...,
transport=``) names what NCCL drives over it; its default follows the NIC's wire protocol
(:data:`topologies.machines.parts.DEFAULT_TRANSPORT`), and the NIC kinds each can run are
topologies' :data:`~topologies.machines.parts.TRANSPORTS`. Per transport (sources in
docs/nccl.md):

- ``ib``, ``roce``: NCCL's own verbs transport (src/transport/net_ib), GPUDirect RDMA into GPU
  memory; tuning.cc's ``hwLat`` network figures describe it.
- ``efa``: aws-ofi-nccl on AWS EFA (SRD): its tuner's per-step latency (20 us, + 3 us of
  completions for Simple; include/nccl_ofi_tuner.h) replaces ``hwLat``; a NIC with
  ``in_order_128=False`` keeps LL and LL128 off (src/platform-aws.c).
- ``tcpx``, ``tcpxo``: Google's GPUDirect-TCPX / -TCPXO plugins, an unpacking network device
  (``NCCL_NET_DEVICE_UNPACK``): the NIC writes received data into GPU pages the kernel
  gathers, which only the Simple protocol's primitives do (src/device/prims_simple.h), and
  NCCL doubles the channels of such a device across nodes (src/graph/connect.cc). The
  plugins publish no per-step latency: ``hwLat`` applies.
- ``socket``: NCCL's socket transport over TCP (src/transport/net_socket.cc): the plugin
  takes host pointers only (``NCCL_PTR_HOST``), so every network step is copied through host
  memory: the sender's GPU writes the step into a host buffer and the receiver's GPU reads it
  from one, each crossing its PCIe link to its CPU (the network hop's route goes through both
  CPUs). LL128 needs GPUDirect paths (tuning.cc ``isLL128Enabled``: a GPU-NIC path no worse
  than PXB), so only LL and Simple cross. ``hwLat`` applies.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import constants as C


@dataclass(frozen=True)
class Transport:
    """What NCCL's network transport ``name`` changes in the model.

    Attributes
    ----------
    name : str
    source : str
        Where NCCL's behaviour comes from.
    step_latency : tuple of float or None
        ``(per-step latency, extra for Simple)`` in seconds from the plugin's own tuner, or
        None for tuning.cc's ``hwLat`` network figures.
    host_memory : bool
        Steps are copied through host memory (no GPUDirect RDMA).
    protocols : tuple of str
        Protocols that may cross it.
    unpack : bool
        An unpacking network device (NCCL doubles its channels across nodes).
    """

    name: str
    source: str
    step_latency: tuple | None = None
    host_memory: bool = False
    protocols: tuple = C.PROTOCOLS
    unpack: bool = False


#: Transport name -> :class:`Transport` (registered, not branched on).
TRANSPORTS: dict[str, Transport] = {
    "ib": Transport("ib", "NCCL net_ib verbs, GPUDirect RDMA"),
    "roce": Transport("roce", "NCCL net_ib verbs over RoCE, GPUDirect RDMA"),
    "efa": Transport("efa", "aws-ofi-nccl over EFA SRD",
                     step_latency=C.PLUGIN_NET_LATENCY["efa"]),
    "tcpx": Transport("tcpx", "GPUDirect-TCPX plugin (unpacking device)",
                      protocols=("Simple",), unpack=True),
    "tcpxo": Transport("tcpxo", "GPUDirect-TCPXO plugin (unpacking device)",
                       protocols=("Simple",), unpack=True),
    "socket": Transport("socket", "NCCL net_socket over TCP, through host memory",
                        host_memory=True, protocols=("LL", "Simple")),
}


def transport(name: str | None) -> Transport | None:
    """The :class:`Transport` called ``name`` (None for None: no network, or NICs that do not
    share one transport).

    Examples
    --------
    >>> transport("socket").protocols, transport("tcpxo").unpack
    (('LL', 'Simple'), True)
    """
    return None if name is None else TRANSPORTS[name]
