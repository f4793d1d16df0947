"""PCIe boxes as people build them: NCCL's path types between their GPUs (src/graph/paths.cc),
P2P or SHM (through the receiver's host memory) as NCCL decides, the socket links, and the
pcie_box / cluster options with their errors."""
from __future__ import annotations

import pytest

import emulator
import topologies
from emulator.collectives import build_schedule, nccl
from emulator.collectives.nccl import NcclSystem
from topologies import SpecError
from topologies.machines.parts import CPU_FAMILIES


def system(spec, ranks=None):
    G = topologies.from_spec(spec)
    return NcclSystem.of(G, range(len(topologies.gpus(G))) if ranks is None else ranks)


@pytest.mark.parametrize("spec, types", [
    # switches of 4 GPUs alternating over 2 CPUs: PIX in a switch, SYS across the sockets
    ("pcie_box:gpus=8,gpus_per_switch=4", ["PIX"] * 3 + ["SYS"] * 4),
    # switches of 2 on 2 CPUs: switch 2 is on CPU 0 with switch 0 (PHB), 1 and 3 across
    ("pcie_box:gpus=8,gpus_per_switch=2", ["PIX", "SYS", "SYS", "PHB", "PHB", "SYS", "SYS"]),
    # every GPU on a root port: PHB on its CPU, SYS to the other's
    ("pcie_box:gpus=8,layout=root", ["PHB"] * 3 + ["SYS"] * 4),
    ("pcie_box:gpus=8,layout=root,sockets=1", ["PHB"] * 7),
    # p2.16xlarge: K80 boards (one switch, PIX) under host switches (PXB), two CPUs
    ("p2_16xlarge", ["PIX", "PXB", "PXB", "PHB", "PHB", "PHB", "PHB"] + ["SYS"] * 8),
    ("dgx_a100", ["NVL"] * 7),
    ("dgx1_v100", ["NVL"] * 7),
])
def test_path_types_on_each_layout(spec, types):
    s = system(spec)
    assert [s.path_type(0, b) for b in range(1, len(types) + 1)] == types
    assert all(s.path_type(a, b) == s.path_type(b, a) for a in range(4) for b in range(4))


@pytest.mark.parametrize("spec, p2p", [
    ("pcie_box:gpus=8,gpus_per_switch=4", [True] * 3 + [False] * 4),   # P2P up to PXB
    ("pcie_box:gpus=8,gpus_per_switch=4,p2p=off", [False] * 7),
    ("pcie_box:gpus=8,layout=root", [False] * 7),
    ("p2_16xlarge", [True] * 3 + [False] * 12),
    ("dgx_a100", [True] * 7),
])
def test_nccl_uses_p2p_up_to_pxb_and_where_the_driver_allows(spec, p2p):
    s = system(spec)
    assert [s.p2p_allowed(0, b) for b in range(1, len(p2p) + 1)] == p2p


def test_two_gpus_on_amd_cpus_use_p2p_across_the_sockets():
    # paths.cc: P2P up to SYS between the two GPUs of an AMD host, PXB otherwise
    two_amd = system("pcie_box:gpus=2,layout=root,cpu=zen4")
    assert two_amd.path_type(0, 1) == "SYS" and two_amd.p2p_allowed(0, 1)
    two_intel = system("pcie_box:gpus=2,layout=root,cpu=sapphire_rapids")
    assert not two_intel.p2p_allowed(0, 1)
    assert not system("pcie_box:gpus=4,layout=root,cpu=zen4").p2p_allowed(0, 3)
    assert not system("pcie_box:gpus=2,layout=root,cpu=zen4,p2p=off").p2p_allowed(0, 1)


def test_shm_steps_go_through_the_receivers_host_memory():
    s = system("pcie_box:gpus=8,gpus_per_switch=4")
    assert s.intra_stops(0, 1) == ("gpu0", "gpu1")                    # P2P in the switch
    assert s.intra_stops(3, 4) == ("gpu3", "cpu1", "gpu4")            # SYS: b's CPU
    assert s.intra_stops(4, 3) == ("gpu4", "cpu0", "gpu3")
    off = system("pcie_box:gpus=8,gpus_per_switch=4,p2p=off")
    assert off.intra_stops(0, 1) == ("gpu0", "cpu0", "gpu1")          # up the uplink and back
    ring = nccl.channel_rings(off)[0]
    assert all(len(st) == 3 and st[1].startswith("cpu") for st in ring.stops)
    # the all-to-all's sends take the same stops
    assert off.p2p_stops(0, 1) == (("gpu0", "cpu0", "gpu1"), 0)


def test_p2p_off_behind_a_switch_loads_its_uplink():
    # 4 GPUs per gen5 switch: with P2P a ring turns around inside the switch; with P2P off
    # every step climbs to host memory, so the switch's one x16 uplink carries 4 GPUs' steps
    on = emulator.run_collective(topologies.from_spec("pcie_box:gpus=8,gen=5"), "allreduce",
                                 "nccl", 128 << 20)
    off = emulator.run_collective(topologies.from_spec("pcie_box:gpus=8,gen=5,p2p=off"),
                                  "allreduce", "nccl", 128 << 20)
    assert off.time_s > 3 * on.time_s
    # on CPU root ports, P2P off changes nothing: NCCL uses SHM across the host bridge anyway
    a = emulator.run_collective(topologies.from_spec("pcie_box:gpus=8,gen=5,layout=root"),
                                "allreduce", "nccl", 128 << 20)
    b = emulator.run_collective(topologies.from_spec("pcie_box:gpus=8,gen=5,layout=root,p2p=off"),
                                "allreduce", "nccl", 128 << 20)
    assert a.time_s == pytest.approx(b.time_s, rel=1e-12)
    # a gen5 box's GPUs reach ~46 GB/s of bus bandwidth on root ports (PCIe at NCCL's 0.76 of
    # 63 GB/s) when the socket link is fast; QPI (Broadwell, 19.2 GB/s) throttles the ring
    assert 44e9 < a.busbw < 48e9
    q = emulator.run_collective(topologies.from_spec("pcie_box:gpus=8,gen=5,cpu=broadwell"),
                                "allreduce", "nccl", 128 << 20)
    assert q.busbw < 20e9


@pytest.mark.parametrize("cpu", sorted(CPU_FAMILIES))
def test_socket_links_per_cpu_family(cpu):
    G = topologies.from_spec(f"pcie_box:gpus=8,layout=root,cpu={cpu}")
    vendor, link, links, rate = CPU_FAMILIES[cpu]
    d = G.edges["cpu0", "cpu1"]
    assert (d["link"], d["bandwidth"]) == (link, links * rate)
    assert G.nodes["cpu0"]["vendor"] == vendor and G.nodes["cpu0"]["model"] == cpu


def test_closed_form_is_the_engine_on_an_uncongested_shm_ring():
    # one socket, root ports: every hop GPU -> CPU memory -> next GPU, each GPU link used once
    # each way; the engine and the closed form agree
    G = topologies.from_spec("pcie_box:gpus=4,gen=4,layout=root,sockets=1")
    s = build_schedule("allreduce", "nccl_ring", 4, 1 << 24, graph=G, protocol="Simple",
                       channels=1)
    r = emulator.simulate(G, s)
    assert r.time_s == pytest.approx(s.detail["nccl"]["predicted_s"], rel=1e-9)


@pytest.mark.parametrize("spec, words", [
    ("cluster:dgx_h100x2,p2p=off", ["p2p=off", "PCIe", "nvswitch"]),
    ("cluster:dgx1_v100x2,p2p=on", ["p2p=on", "nvlink"]),
    ("dgx_h100:p2p=off", ["'p2p'", "not known"]),
    ("pcie_box:p2p=sometimes", ["p2p='sometimes'", "on or off"]),
    ("pcie_box:layout=mesh", ["layout='mesh'", "switch, root"]),
    ("pcie_box:cpu=m2", ["cpu='m2'", "zen4"]),
    ("pcie_box:gpus=8,sockets=3", ["sockets=3", "1 or 2"]),
    ("pcie_box:gpus=2,layout=root,nics=3", ["nics=3", "GPUs (2)"]),
])
def test_pcie_options_errors(spec, words):
    with pytest.raises(SpecError) as e:
        topologies.from_spec(spec)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and all(w in msg for w in words), msg


def test_pcie_box_keeps_its_keywords():
    G = topologies.pcie_box(8, gpus_per_switch=2, pcie_gen=4, nic_bandwidth=25e9, nics=2)
    assert G.edges["nic1", "pcie1"]["bandwidth"] == 31.5e9
    assert G.nodes["nic0"]["bandwidth"] == 25e9
    assert topologies.from_spec("cluster:pcie_boxx2,p2p=off").nodes["n1.gpu3"]["p2p"] is False
