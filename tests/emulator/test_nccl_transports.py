"""The network transports NCCL runs (emulator.collectives.nccl.transports): which NICs run
which, what each changes (per-step latency, protocols, host-memory copies, channels), and
their closed forms against the engine on uncongested graphs."""
from __future__ import annotations

import math

import pytest

import emulator
import topologies
from emulator.collectives import build_schedule, nccl
from emulator.collectives.nccl import NcclSystem, constants as C
from emulator.collectives.nccl.transports import TRANSPORTS
from topologies import SpecError
from topologies._graph import add_link, add_node, new_graph
from topologies.machines.parts import DEFAULT_TRANSPORT, TRANSPORTS as NIC_TRANSPORTS, gpu, nic

GB = 1e9


def one_gpu_machine(protocol: str, bw: float = 12.5 * GB):
    """A GPU and a NIC on one CPU's PCIe gen4 root ports."""
    G = new_graph("one")
    add_node(G, "cpu0", "cpu")
    gpu(G, "gpu0", 0, "A100-SXM4")
    nic(G, "nic0", bw, protocol)
    add_link(G, "gpu0", "cpu0", 31.5 * GB, 0.5e-6, "pcie")
    add_link(G, "nic0", "cpu0", 31.5 * GB, 0.5e-6, "pcie")
    return G


def pair(protocol: str, transport: str | None = None, bw: float = 12.5 * GB):
    G = topologies.cluster(one_gpu_machine(protocol, bw), 2, transport=transport)
    return topologies.validate_topology(G)


def test_every_nic_transport_is_modelled():
    assert set(TRANSPORTS) == {t for ts in NIC_TRANSPORTS.values() for t in ts}
    assert all(DEFAULT_TRANSPORT[k] in v for k, v in NIC_TRANSPORTS.items())


@pytest.mark.parametrize("protocol, transport", [
    ("ib", "efa"), ("ib", "tcpxo"), ("efa", "ib"), ("roce", "tcpx"), ("ethernet", "ib")])
def test_a_transport_a_nic_kind_cannot_run_is_refused(protocol, transport):
    with pytest.raises(SpecError) as e:
        pair(protocol, transport)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert f"transport={transport!r}" in msg and f"kind {protocol!r}" in msg
    assert ", ".join(NIC_TRANSPORTS[protocol]) in msg
    with pytest.raises(SpecError, match="transport='efa' cannot run on a NIC of kind 'ib'"):
        topologies.from_spec("cluster:dgx_h100x2,transport=efa")
    G = topologies.from_spec("cluster:dgx_a100x2")
    G.nodes["n0.nic0"]["transport"] = "tcpx"
    with pytest.raises(topologies.ValidationError, match="transport='tcpx' cannot run"):
        topologies.validate_topology(G)


def test_the_spec_sets_every_nics_transport():
    G = topologies.from_spec("cluster:p5x2,transport=socket")
    s = NcclSystem.of(G, range(16))
    assert s.transport.name == "socket" and s.transport.host_memory
    assert NcclSystem.of(topologies.from_spec("cluster:p5x2"), range(16)).transport.name == "efa"
    assert NcclSystem.of(topologies.from_spec("cluster:a3_megax2"), range(16)).transport.name == \
        "tcpxo"
    assert NcclSystem.of(topologies.from_spec("cluster:p2_16xlargex2"), range(32)).transport.name \
        == "socket"                                # ENA: plain TCP


@pytest.mark.parametrize("protocol, transport, protos", [
    ("ib", None, ("LL", "LL128", "Simple")),
    ("roce", None, ("LL", "LL128", "Simple")),
    ("efa", None, ("LL", "LL128", "Simple")),
    ("ib", "socket", ("LL", "Simple")),          # no GPUDirect path: no LL128
    ("ethernet", None, ("LL", "Simple")),        # socket by default
    ("ethernet", "tcpx", ("Simple",)),           # unpacking device: Simple's primitives only
    ("ethernet", "tcpxo", ("Simple",)),
])
def test_protocols_that_cross_each_transport(protocol, transport, protos):
    G = topologies.cluster("dgx_h100", 2, transport=transport) if protocol == "ib" else None
    if G is None:
        G = {"roce": "cluster:bm_gpu_h100x2", "efa": "cluster:p5x2",
             "ethernet": "cluster:a3_megax2"}[protocol]
        G = topologies.from_spec(G + (f",transport={transport}" if transport else
                                      ",transport=socket" if protocol == "ethernet" else ""))
    got = {p for _, p, _ in nccl.plan(G, "allreduce", 1 << 20).candidates}
    assert got == set(protos)


@pytest.mark.parametrize("protocol, transport, proto, latency", [
    ("ib", None, "Simple", C.HOP_LATENCY["net"]["Ring"]["Simple"]),
    ("ib", None, "LL", C.HOP_LATENCY["net"]["Ring"]["LL"]),
    ("roce", None, "Simple", C.HOP_LATENCY["net"]["Ring"]["Simple"]),
    ("efa", None, "Simple", 23e-6),              # aws-ofi-nccl: 20 us + 3 us for Simple
    ("efa", None, "LL", 20e-6),
    ("efa", "socket", "Simple", C.HOP_LATENCY["net"]["Ring"]["Simple"]),
    ("ethernet", "tcpxo", "Simple", C.HOP_LATENCY["net"]["Ring"]["Simple"]),
    ("ethernet", "socket", "LL", C.HOP_LATENCY["net"]["Ring"]["LL"]),
])
def test_closed_form_of_each_transport_is_the_engine(protocol, transport, proto, latency):
    # Two one-GPU machines: each ring hop crosses its own direction of the network, one
    # channel each way, nothing shared: the engine is the closed form, and the closed form is
    # the launch + 2 steps of (the transport's per-step latency + path + bytes at the NIC rate)
    G = pair(protocol, transport)
    n = 1 << 24
    s = build_schedule("allreduce", "nccl_ring", 2, n, graph=G, protocol=proto, channels=1)
    r = emulator.simulate(G, s)
    assert r.time_s == pytest.approx(s.detail["nccl"]["predicted_s"], rel=1e-9)
    system = NcclSystem.of(G, (0, 1))
    rings = nccl.channel_rings(system, 1)
    hop = system.hop(rings[0].stops[0])
    eff = nccl.cost.efficiency(system, rings, "Ring", proto)
    seg = math.ceil(math.ceil(n / 2) * hop.inflation / eff)
    scale = nccl.cost.ring_latency_scale(system, "allreduce", proto, n, 1)   # NCCL's plateau
    loops = nccl.pipeline.ring_chunking("allreduce", proto, n, 2).loops
    want = scale * C.BASE_LATENCY["Ring"][proto] + 2 * (loops * scale * latency + hop.latency
                                                         + seg / hop.raw)
    assert r.time_s == pytest.approx(want, rel=1e-6)


def test_socket_steps_cross_both_hosts_memory():
    # The socket transport takes host pointers only: a network step goes GPU -> its CPU's
    # memory -> NIC -> NIC -> CPU memory -> GPU; with GPUDirect RDMA the CPU is not on the way
    # (here the NIC and GPU share the CPU's root complex, so the links are the same; the
    # route names the host memory)
    rdma = NcclSystem.of(pair("roce"), (0, 1))
    sock = NcclSystem.of(pair("roce", "socket"), (0, 1))
    assert nccl.channel_rings(rdma)[0].stops[0] == ("n0.gpu0", "n0.nic0", "n1.nic0", "n1.gpu0")
    st = nccl.channel_rings(sock)[0].stops[0]
    assert st[0] == "n0.gpu0" and st[1] == "n0.cpu0" and st[-2] == "n1.cpu0"
    # on a DGX A100 the socket's copies load each GPU's PCIe link to its CPU and back down to
    # the NIC: both directions of the PCIe switch's uplink carry the step
    G = topologies.from_spec("cluster:dgx_a100x2,transport=socket")
    s = NcclSystem.of(G, range(16))
    st = next(st for st in nccl.channel_rings(s)[0].stops if len(st) > 2)
    assert st[1].endswith("cpu0") or st[1].endswith("cpu1")
    links = set(s.hop(st).channels)
    assert any(u.endswith("cpu0") or u.endswith("cpu1") for u, _ in links)
    # and the all-to-all's sends take the same way (no PXN without GPUDirect)
    stops, flow = s.p2p_stops(0, 9)
    assert stops[1] == s.cpu_of(0) and stops[-2] == s.cpu_of(9) and flow == 0


def test_an_unpacking_transport_doubles_small_channel_counts():
    # NCCL_NET_DEVICE_UNPACK doubles a communicator's channels across nodes while under 16
    four = topologies.cluster(topologies.dgx_a100(), 2, nic_bandwidth=12.5 * GB)
    for n in four.nodes:
        if four.nodes[n].get("kind") == "nic" and not n.endswith(("nic0", "nic1", "nic2",
                                                                   "nic3")):
            four.nodes[n]["kind"] = "switch"      # keep 4 NICs a node
    a = NcclSystem.of(four, range(16))
    assert nccl.communicator_channels(a) == 8
    for n, d in four.nodes(data=True):
        if d.get("kind") == "nic":
            d["protocol"], d["transport"] = "ethernet", "tcpx"
    b = NcclSystem.of(four, range(16))
    assert b.unpack and nccl.communicator_channels(b) == 16
