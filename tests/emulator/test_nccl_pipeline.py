"""NCCL's per-channel pipeline (emulator.collectives.nccl.pipeline): buffers, chunk and slice
sizes at the boundaries of NCCL's own formulas (src/enqueue.cc calcCollChunking, the device's
loops in src/device/all_reduce.h, src/device/prims_simple.h's slices), the communicator's
channel count (src/graph/search.cc, connect.cc), the slots in flight, and their use in the
schedules and closed forms."""
from __future__ import annotations

import math

import pytest

import emulator
import topologies
from emulator.collectives import build_schedule, nccl
from emulator.collectives.nccl import NcclSystem, pipeline as P
from emulator.errors import ConfigError

MIB = 1 << 20


# -- buffers ----------------------------------------------------------------------------------
def test_default_buffers_are_nccls():
    b = P.Buffers()
    # 8 LL lines x 512 threads x 8 steps x 16 B; 120 x 640 threads x 8 steps x 8 B; 4 MiB
    assert (b.ll, b.ll128, b.simple) == (524288, 4915200, 4194304)
    assert (b.step("LL"), b.step("LL128"), b.step("Simple")) == (65536, 614400, 524288)


@pytest.mark.parametrize("field, env, proto", [
    ("simple", "NCCL_BUFFSIZE", "Simple"), ("ll", "NCCL_LL_BUFFSIZE", "LL"),
    ("ll128", "NCCL_LL128_BUFFSIZE", "LL128")])
def test_a_buffer_below_its_protocols_minimum_is_refused(field, env, proto):
    low = P.min_buffsize(proto)
    assert P.Buffers(**{field: low}).of(proto) == low
    with pytest.raises(ConfigError) as e:
        P.Buffers(**{field: low - 1})
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert f"{env}={low - 1}" in msg and f"minimum of {low} bytes" in msg
    with pytest.raises(ConfigError, match=f"{env}='4MiB'"):
        P.Buffers(**{field: "4MiB"})
    assert (P.min_buffsize("Simple"), P.min_buffsize("LL"), P.min_buffsize("LL128")) == \
        (8 * 512, 8 * 32, 8 * 2048)


def test_the_graphs_nccl_buffsize_sets_the_simple_buffer():
    G = topologies.from_spec("dgx_a100")
    G.graph["nccl_buffsize"] = 8 * MIB
    s = NcclSystem.of(G, range(8))
    assert s.buffers.simple == 8 * MIB and s.buffers.ll == P.DEFAULT_BUFFSIZE["LL"]
    # a 4 MiB chunk (4 steps of 1 MiB): 1 GiB / 24 channels takes 2 loops of 8 x 4 MiB
    assert nccl.plan(G, "allreduce", 1 << 30, algo="Ring", proto="Simple").loops == 2
    G.graph["nccl_buffsize"] = 100
    with pytest.raises(ConfigError, match="NCCL_BUFFSIZE=100 is below Simple's minimum"):
        nccl.plan(G, "allreduce", 1 << 20)


# -- chunks and slices ------------------------------------------------------------------------
@pytest.mark.parametrize("op, proto, chunk", [
    ("allreduce", "Simple", 4 * 524288),        # CHUNKSTEPS 4 of 512 KiB steps
    ("allgather", "Simple", 4 * 524288),
    ("reduce_scatter", "Simple", 4 * 524288),
    ("broadcast", "Simple", 524288),            # BROADCAST_CHUNKSTEPS 1
    ("allreduce", "LL", 32768),                 # a 64 KiB step of 16-byte lines, 8 B of data
    ("allreduce", "LL128", 576000),             # 614400 B, 120 of every 128 (1920 B grains)
])
def test_ring_chunk_is_calccollchunkings(op, proto, chunk):
    c = P.ring_chunking(op, proto, 1 << 34, 8)
    assert c.chunk_bytes == chunk and c.chunk_bytes % P.GRAIN[proto] == 0
    assert c.window == (4 if proto == "Simple" and op != "broadcast" else 8)
    assert c.slices_per_chunk == (2 if proto == "Simple" and op != "broadcast" else 1)


@pytest.mark.parametrize("nranks", [2, 8, 16, 1024])
def test_ring_loops_at_their_boundary(nranks):
    chunk = 2 * MIB
    full = nranks * chunk
    c = P.ring_chunking("allreduce", "Simple", full, nranks)
    assert (c.loops, c.last_chunk, c.steps()) == (1, chunk, [(chunk, 1)])
    c = P.ring_chunking("allreduce", "Simple", full + 1, nranks)
    # the device's last loop: ceil(remainder / nranks), 16-byte aligned
    assert (c.loops, c.last_chunk, c.steps()) == (2, 16, [(chunk, 1), (16, 1)])
    c = P.ring_chunking("allreduce", "Simple", full - 1, nranks)
    assert c.loops == 1 and c.last_chunk == chunk
    c = P.ring_chunking("allreduce", "Simple", 1000, nranks)
    assert c.last_chunk == math.ceil(math.ceil(1000 / nranks) / 16) * 16


@pytest.mark.parametrize("chunk, first", [
    (1000, 1000), (32768, 32768),           # at most sliceSize / 32 = 32 KiB: one slice
    (65536, 32768), (65552, 32784),         # two slices of ceil(n / 32) x 16 bytes
    (2 * MIB, MIB)])
def test_simple_slices_are_prims_simples(chunk, first):
    c = P.ring_chunking("allreduce", "Simple", 1 << 30, 8)
    assert c.slice_bytes == 2 * 524288
    assert c.first_slice(chunk) == first
    ll = P.ring_chunking("allreduce", "LL128", 1 << 30, 8)
    assert ll.first_slice(chunk) == min(chunk, 1920)      # LL128 forwards line by line


def test_tree_ll128_chunks_halve_for_medium_messages():
    # nsteps = 1 + log2(nodes) + ppn / 10; halve from 576000 while share // chunk is below
    # nsteps x 64 / ppn (down to 128 KiB), then below nsteps x 16 / ppn (down to 32 KiB)
    nodes, ppn = 4, 8
    nsteps = 1 + 2 + 0.8
    for share in (1 << 26, 1 << 22, 1 << 20, 1 << 16, 1000):
        chunk = 576000
        while share // chunk < nsteps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while share // chunk < nsteps * 16 / ppn and chunk > 32768:
            chunk //= 2
        want = chunk // 1920 * 1920
        assert P.tree_chunking("LL128", share, nodes * ppn, nodes).chunk_bytes == want
    assert P.tree_chunking("Simple", 1 << 20, 16, 2).chunk_bytes == 524288
    assert P.tree_chunking("LL", 1 << 20, 16, 2).chunk_bytes == 32768


@pytest.mark.parametrize("heads", [4, 8])
def test_nvls_chunks_at_their_thresholds(heads):
    # 128 KiB, then 64, 32, 16 KiB below 64, 8 and 2 loops of `heads` chunks of the size before
    k = 1024
    for share, chunk in ((64 * heads * 128 * k, 128 * k), (64 * heads * 128 * k - 1, 64 * k),
                         (8 * heads * 64 * k, 64 * k), (8 * heads * 64 * k - 1, 32 * k),
                         (2 * heads * 32 * k, 32 * k), (2 * heads * 32 * k - 1, 16 * k),
                         (1, 16 * k)):
        assert P.nvls_chunking("NVLS", share, heads).chunk_bytes == chunk, share
    for share, chunk in ((32 * heads * 256 * k, 256 * k), (32 * heads * 256 * k - 1, 256 * k),
                         (heads * 64 * k - 1, 32 * k)):
        assert P.nvls_chunking("NVLSTree", share, heads, 256 * k).chunk_bytes == chunk, share
    assert P.nvls_channels("hopper", 1) == 16 and P.nvls_channels("blackwell", 1) == 24
    assert P.nvls_channels("blackwell", 2, 50e9) == 32
    assert P.nvls_channels("blackwell", 4, 50e9) == 24


def test_p2p_chunks_follow_the_path_and_the_size():
    k = 1024
    assert P.p2p_chunking(16 * k, "net", network=True).proto == "LL"       # <= 16 KiB / channel
    assert P.p2p_chunking(16 * k + 1, "net", network=True).proto == "Simple"
    for n, chunk in ((128 * k - 1, 32 * k), (128 * k, 64 * k), (8 * 128 * k - 1, 64 * k),
                     (8 * 128 * k, 128 * k)):
        assert P.p2p_chunking(n, "net", network=True).chunk_bytes == chunk, n
    assert P.p2p_chunking(MIB, "net", network=False).chunk_bytes == 128 * k  # inside a node
    assert P.p2p_chunking(MIB, "nvlink", network=False).chunk_bytes == 512 * k
    small = P.Buffers(simple=8 * 64 * k)                     # NCCL caps it at a Simple step
    assert P.p2p_chunking(16 * MIB, "nvlink", network=False, buffers=small).chunk_bytes == 64 * k


# -- slots in flight --------------------------------------------------------------------------
def test_window_wait_is_the_slot_round_trip_beyond_the_bytes():
    c = P.p2p_chunking(8 * MIB, "net", network=True)           # 64 chunks of 128 KiB
    rate, lat = 50e9, 20e-6
    t = c.chunk_bytes / rate
    assert P.window_wait(c, lat, rate) == pytest.approx(63 * ((2 * lat + t) / 8 - t))
    assert P.window_wait(c, 1e-6, rate) == 0.0                 # slots back before they are needed
    one = P.p2p_chunking(100_000, "net", network=True)
    assert one.loops > 1 and P.window_wait(P.p2p_chunking(20_000, "pci", network=False), lat,
                                           rate) == 0.0


def test_a_sends_slots_bind_on_a_slow_handshake():
    # one GPU per p5 node (EFA: 23 us per Simple step, aws-ofi-nccl): a 64 MiB send moves 512
    # chunks of 128 KiB at most 8 per 46 us + a chunk's 2.6 us, about 21.5 of the NIC's
    # 50 GB/s; the engine and the closed form agree
    G = topologies.from_spec("cluster:p5x2")
    n = 64 * MIB
    s = build_schedule("alltoall", "nccl_p2p", [0, 8], 2 * n, graph=G, protocol="Simple")
    r = emulator.simulate(G, s)
    assert r.time_s == pytest.approx(s.detail["nccl"]["predicted_s"], rel=1e-9)
    system = NcclSystem.of(G, (0, 8))
    t = nccl.p2p.table(system)
    rate = float(t.rate[0] / t.inflation[0])
    chunk = 128 * 1024
    tc = chunk / rate
    slot = (2 * 23e-6 + tc) / 8
    assert slot > tc
    assert r.time_s == pytest.approx(23e-6 + float(t.latency[0]) + (n / chunk - 1) * (slot - tc)
                                     + math.ceil(n * t.inflation[0]) / t.rate[0], rel=1e-9)
    assert n / r.time_s < 0.5 * 50e9


# -- channels ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, comm", [
    ("dgx_a100", 24),            # speed 40 of 240 GB/s: 6, doubled, doubled
    ("dgx_h100", 24),            # 60 of 370.8: 6, doubled (>= 50 GB/s), doubled
    ("hgx_b200", 32),            # 90 of 721.8: 8, doubled, doubled
    ("dgx1_v100", 12),           # 6 rings at an NVLink's 20 GB/s: doubled once
    ("pcie_box:gpus=8,pcie_gen=4", 2),
    ("cluster:dgx_a100x2", 16),  # a channel per HDR NIC at 24 GB/s, doubled
    ("cluster:dgx_h100x2", 16),  # 45 GB/s per NDR NIC (PCIe gen5's 48 GB/s bound): not past 4
    ("cluster:hgx_b200x2", 16),
    ("cluster:p4dex2", 8),       # 4 EFA NICs at 12 GB/s
    ("cluster:bm_gpu_h100x2", 32),   # 16 RoCE NICs: the search's 16, doubled
])
def test_communicator_channels_are_nccls(spec, comm):
    G = topologies.from_spec(spec)
    s = NcclSystem.of(G, range(len(topologies.gpus(G))))
    assert nccl.communicator_channels(s) == comm
    rings = nccl.channel_rings(s)
    assert comm % len(rings) == 0


def test_search_speed_and_duplication_rules():
    cc = P.communicator_channels
    # below 25 GB/s a speed is not duplicated; Hopper keeps > 4 channels under 50 GB/s
    assert cc("ampere", nodes=2, nvswitch=True, gpu_bw=24e9, nic_bws=[25e9] * 4) == 8
    assert cc("hopper", nodes=2, nvswitch=True, gpu_bw=48e9, nic_bws=[50e9] * 4) == 16
    # ... but duplicates up to 4: 2 NICs at 45 GB/s give 4 channels at 22.5, then 8
    assert cc("hopper", nodes=2, nvswitch=True, gpu_bw=48e9, nic_bws=[50e9] * 2) == 8
    assert cc("hopper", nodes=2, nvswitch=True, gpu_bw=48e9, nic_bws=[50e9] * 8,
              unpack=True) == 16
    # an unpacking network device (TCPX/O) doubles while under 16
    assert cc("hopper", nodes=2, nvswitch=True, gpu_bw=24e9, nic_bws=[25e9] * 4) == 8
    assert cc("hopper", nodes=2, nvswitch=True, gpu_bw=24e9, nic_bws=[25e9] * 4,
              unpack=True) == 16
    # two channels fit a NIC twice the speed
    assert cc("ampere", nodes=2, nvswitch=True, gpu_bw=48e9, nic_bws=[50e9] * 2) == 8


def test_plans_report_nccls_channels_and_a_rings_loops():
    G = topologies.from_spec("cluster:dgx_h100x2")
    p = nccl.plan(G, "allgather", 1 << 30, algo="Ring", proto="Simple")
    # 1 GiB / 16 channels = 64 MiB, loops of 16 ranks x 2 MiB
    assert (p.channels, p.loops) == (16, 2)
    assert p.to_dict()["loops"] == 2
    assert nccl.plan(G, "allgather", MIB, algo="Ring", proto="Simple").loops == 1
    assert nccl.plan(G, "allreduce", 1 << 30, algo="NVLSTree").loops == 1


def test_simulate_takes_nccl_buffsize(capsys):
    from qsgd_emu.cli import main

    assert main(["simulate", "--topology", "dgx_a100", "--bytes", "1GiB", "--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--topology", "dgx_a100", "--bytes", "1GiB", "--json",
                 "--nccl-buffsize", "16MiB"]) == 0
    e = json.loads(capsys.readouterr().out)
    # 8 MiB chunks: 1 GiB / 24 channels is one loop instead of three, 28 handshakes fewer
    assert e["time_s"] < d["time_s"]
    assert main(["simulate", "--topology", "dgx_a100", "--bytes", "1GiB",
                 "--nccl-buffsize", "1000"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NCCL_BUFFSIZE=1000" in err[0] and "4096" in err[0]


@pytest.mark.parametrize("spec, algo, channels", [
    ("dgx_h100", "NVLS", 16), ("hgx_b200", "NVLS", 24),
    ("cluster:dgx_h100x2", "NVLSTree", 16), ("cluster:hgx_b200x2", "NVLSTree", 32),
    ("cluster:hgx_b200x4", "NVLSTree", 24)])
def test_nvls_plans_report_nvls_channels(spec, algo, channels):
    p = nccl.plan(topologies.from_spec(spec), "allreduce", 1 << 28, algo=algo)
    assert (p.algorithm, p.channels) == (algo, channels)
