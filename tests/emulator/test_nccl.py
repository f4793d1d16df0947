"""Collectives as NCCL runs them: closed forms against the engine, channels on every preset,
NCCL's choice of (algorithm, protocol), overrides and errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import emulator
import topologies
from emulator.collectives import NCCL_ALGORITHMS, build_schedule, nccl
from emulator.collectives.nccl import NcclSystem, channel_rings, constants as C, parse_list
from emulator.errors import ConfigError

_GRAPHS: dict = {}


def graph(spec):
    if spec not in _GRAPHS:
        _GRAPHS[spec] = topologies.from_spec(spec)
    return _GRAPHS[spec]


def run(spec, op, name, nbytes, proto=None, channels=None, payload_bytes=None):
    G = graph(spec)
    s = build_schedule(op, name, len(topologies.gpus(G)), nbytes, graph=G, protocol=proto,
                       channels=channels, payload_bytes=payload_bytes)
    return s, emulator.simulate(G, s)


# -- closed forms ----------------------------------------------------------------------------
EXACT = [
    *[("dgx_a100", op, "nccl_ring", p, 1 << 24) for op in ("allreduce", "allgather",
                                                          "reduce_scatter", "broadcast")
      for p in nccl.PROTOCOLS],
    # one chunk per tree half (LL's step is 32 KiB): the two chains of a node cross the same
    # links in step
    *[("dgx_a100", "allreduce", "nccl_tree", p, 1 << 16 if p == "LL" else 1 << 18)
      for p in nccl.PROTOCOLS],
    *[("switch:8", "allreduce", "nccl_ring", p, 3_000_001) for p in ("LL", "Simple")],
    ("ring:6", "allgather", "nccl_ring", "Simple", 600_000),
    ("dgx_h100", "allreduce", "nccl_nvls", "Simple", 1 << 26),
    ("hgx_b200", "allreduce", "nccl_nvls", "Simple", 1 << 26),
    *[("dgx_a100", "alltoall", "nccl_p2p", p, 1 << 24) for p in ("LL", "Simple")],
    # six rings on 1- and 2-lane NVLinks: equal shares, but split() leaves a byte more on some
    # segments, so flows on a shared lane end a few ns apart
    ("dgx1_v100", "allreduce", "nccl_ring", "Simple", 1 << 24),
    ("dgx1_v100", "allreduce", "nccl_ring", "LL128", 1 << 20),
]


@pytest.mark.parametrize("spec, op, name, proto, nbytes", EXACT)
def test_closed_form_is_the_engine_on_uncongested_schedules(spec, op, name, proto, nbytes):
    s, r = run(spec, op, name, nbytes, proto)
    d = s.detail["nccl"]
    assert d["protocol"] == proto
    assert r.time_s == pytest.approx(d["predicted_s"], rel=1e-3 if spec == "dgx1_v100" else 1e-9)


@pytest.mark.parametrize("spec, name, nbytes, rel", [
    ("pcie_box:gpus=8,pcie_gen=4", "nccl_ring", 1 << 24, 0.05),
    ("cluster:dgx_a100x2", "nccl_ring", 1 << 24, 0.15),
    ("cluster:dgx_h100x2", "nccl_nvls_tree", 1 << 24, 0.20),
    ("cluster:dgx1_v100x2", "nccl_ring", 1 << 22, 0.25),
    ("cluster:p5x2", "nccl_ring", 1 << 24, 0.15),
])
def test_closed_form_bounds_congested_schedules(spec, name, nbytes, rel):
    # Channels that meet on shared links at different times: the closed form is NCCL's kind
    # of estimate (it picks the algorithm), the engine the prediction; they stay close, and
    # the closed form, which shares every link among all hops at once, is an upper bound.
    s, r = run(spec, "allreduce", name, nbytes, "Simple")
    predicted = s.detail["nccl"]["predicted_s"]
    assert predicted * (1 - rel) <= r.time_s <= predicted * (1 + 1e-9)


def test_ring_closed_form_by_hand():
    # dgx_a100, 8 GPUs on one NVSwitch (300 GB/s per GPU link, 0.6 us GPU to GPU), Simple:
    # launch 8.4 us, then 14 steps of 0.6 us (the path's) + NCCL's 3.4 us per-step latency
    # for each of a channel's loops + a segment at NCCL's 20 of 25 GB/s per NVLink, i.e. 1.25
    # wire bytes per byte at 300 GB/s. NCCL's 24 channels move 1 GiB / 24 each in loops of
    # 8 x 2 MiB chunks: 3 loops.
    n = 1 << 30
    s, r = run("dgx_a100", "allreduce", "nccl_ring", n, "Simple")
    want = 8.4e-6 + 14 * (3 * 3.4e-6 + 0.6e-6 + math.ceil(n / 8 * 1.25) / 300e9)
    assert r.time_s == pytest.approx(want, rel=1e-9)
    assert r.busbw == pytest.approx(2 * 7 / 8 * n / want)
    assert 230e9 < r.busbw < 240e9           # NCCL's own figure: 12 NVLinks x 20 GB/s


def test_every_loop_of_a_channel_pays_the_step_latency():
    # A ring channel moves its share in loops of nranks chunks (2 MiB for Simple): every loop's
    # step pays the hop's per-step latency; the kept ring resized to each size takes its waits.
    G = graph("dgx_a100")
    for n in (1 << 20, 1 << 26, 1 << 29, 1 << 20):
        loops = math.ceil(math.ceil(n / 24) / (8 << 21))
        s, r = run("dgx_a100", "allreduce", "nccl_ring", n, "Simple")
        seg = math.ceil(math.ceil(n / 8) * 1.25) / 300e9
        assert r.time_s == pytest.approx(8.4e-6 + 14 * (loops * 3.4e-6 + 0.6e-6 + seg), rel=1e-6)
        assert s.compute_s.max() == pytest.approx(8.4e-6 + loops * 3.4e-6)


def test_nvls_closed_form_by_hand():
    # dgx_h100: every GPU sends and receives n (1 + 1/8) bytes through its 450 GB/s NVSwitch
    # link, at NCCL's 20.6 of 25 GB/s per NVLink times NVLS's 0.85, after 25 us (+ 0.6 us path).
    n = 1 << 30
    s, r = run("dgx_h100", "allreduce", "nccl_nvls", n)
    pair = math.ceil(n * (1 + 1 / 8) / 7)
    want = 25e-6 + 0.6e-6 + math.ceil(pair * (25 / 20.6) / 0.85) / (450e9 / 7)
    assert r.time_s == pytest.approx(want, rel=1e-9)
    # NCCL on DGX H100: ~480 GB/s busbw (sjeaugey, NVIDIA/nccl-tests#212)
    assert 450e9 < r.busbw < 510e9


# -- channels ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(topologies.PRESETS))
def test_one_node_rings_visit_every_gpu_once(name):
    G = graph(name)
    p = len(topologies.gpus(G))
    system = NcclSystem.of(G, range(p))
    rings = channel_rings(system)
    assert len(system.nodes) == 1
    for rg in rings:
        assert sorted(rg.order) == list(range(p))
        assert len(rg.stops) == p
        for i, st in enumerate(rg.stops):
            assert st[0] == system.gpu(rg.order[i]) and st[-1] == system.gpu(rg.order[(i + 1) % p])
    if system.nvswitch or system.intra_hw == "pci":
        assert len(rings) == 1                 # a switch: further rings repeat the same links


def test_dgx1_rings_use_every_nvlink_lane_once_each_way():
    G = graph("dgx1_v100")
    system = NcclSystem.of(G, range(8))
    rings = channel_rings(system)
    assert len(rings) == 6                      # 3 lane-disjoint Hamiltonian cycles x 2 ways
    use: dict = {}
    for rg in rings:
        for st in rg.stops:
            assert len(st) == 2 and G.edges[st]["link"] == "nvlink"
            use[st] = use.get(st, 0) + 1
    for (a, b), k in use.items():
        assert k == G.edges[a, b]["lanes"]       # each direction of each lane carries one ring


@pytest.mark.parametrize("name", sorted(topologies.PRESETS))
def test_cluster_rings_are_rail_aligned(name):
    G = graph(f"cluster:{name}x2")
    p = len(topologies.gpus(G))
    system = NcclSystem.of(G, range(p))
    rings = channel_rings(system)
    nics = system.nics
    assert len(system.nodes) == 2 and len(nics[0]) >= 1
    assert len(rings) == len(nics[0])           # one channel per NIC
    for c, rg in enumerate(rings):
        assert sorted(rg.order) == list(range(p))
        kind = G.nodes
        inter = [st for st in rg.stops if any(kind[x].get("kind") == "nic" for x in st)]
        assert len(inter) == 2                   # one hop out of each node
        for st in inter:
            cards = [x for x in st if kind[x].get("kind") == "nic"]
            src, dst = cards[0], cards[-1]
            assert src in (nics[0][c], nics[1][c]) and dst in (nics[0][c], nics[1][c])
            assert src.split(".", 1)[1] == dst.split(".", 1)[1]     # same NIC index: one rail
            # the GPUs that leave and enter are the NIC's nearest
            lat = system.router.latency
            for gpu_node, nic in ((st[0], src), (st[-1], dst)):
                best = min(lat(nic, system.gpu(r)) for r in system.near[nic])
                assert lat(nic, gpu_node) == pytest.approx(best)


def test_balanced_fabric_paths_avoid_shared_spine_links():
    G = graph("cluster:dgx_a100x8")
    system = NcclSystem.of(G, range(64))
    load: dict = {}
    for rg in channel_rings(system):
        for st in rg.stops:
            if len(st) > 4:
                for e in zip(st[1:-1], st[2:-1]):
                    load[e] = load.get(e, 0) + 1
    assert load and max(load.values()) == 1


# -- NCCL's choice ----------------------------------------------------------------------------
def test_choice_is_the_fastest_candidate_and_moves_from_ll_to_simple():
    G = graph("dgx_a100")
    seen = []
    for k in range(3, 31, 3):
        p = nccl.plan(G, "allreduce", 1 << k)
        # chosen with all 24 channels counted; a small message then runs on fewer, whose
        # bigger chunks hide no less of each step's handshake
        best = min(p.candidates, key=lambda c: c[2])
        assert (p.algorithm, p.protocol) == best[:2] and p.predicted_s <= best[2] * (1 + 1e-12)
        assert (p.predicted_s == best[2]) or p.channels < 24
        seen.append(p.protocol)
    assert seen[0] == "LL" and seen[-1] == "Simple"
    order = [nccl.PROTOCOLS.index(x) for x in seen]
    assert order == sorted(order)               # latency-bound to bandwidth-bound, no going back


@pytest.mark.parametrize("spec, nbytes, algo", [
    ("dgx_h100", 1 << 30, "NVLS"),
    ("hgx_h200", 1 << 30, "NVLS"),
    ("dgx_a100", 1 << 30, "Ring"),              # no NVLS before Hopper
    ("cluster:dgx_h100x2", 1 << 30, "NVLSTree"),
    ("cluster:dgx_a100x4", 8, "Tree"),          # log-depth latency wins for tiny messages
    ("cluster:dgx_a100x4", 1 << 30, "Ring"),
])
def test_choice_per_system(spec, nbytes, algo):
    assert nccl.plan(graph(spec), "allreduce", nbytes).algorithm == algo


def test_ll128_only_over_nvlink():
    assert "LL128" in {p for _, p, _ in nccl.plan(graph("dgx_a100"), "allreduce", 1 << 20).candidates}
    assert "LL128" not in {p for _, p, _ in nccl.plan(graph("pcie_box:gpus=8,pcie_gen=4"),
                                                      "allreduce", 1 << 20).candidates}


@pytest.mark.parametrize("proto, nbytes, share", [
    ("Simple", 1 << 20, 0.5), ("Simple", 1 << 24, 0.7), ("LL128", 1 << 22, 0.8),
    ("LL", 1 << 16, 0.6), ("Simple", 1 << 29, 1.0)])
def test_trees_run_at_nccls_medium_size_share_of_their_bandwidth(proto, nbytes, share):
    # tuning.cc treeCorrectionFactor: the tree's hops carry 1 / share the wire bytes per
    # payload byte of the same tree at 1 GiB, in the engine's schedule and the closed form.
    assert C.tree_correction(proto, nbytes) == share
    G = graph("dgx_a100")
    ratio = [build_schedule("allreduce", "nccl_tree", 8, n, graph=G, protocol=proto, channels=1)
             .total_bytes / n for n in (nbytes, 1 << 30)]
    assert ratio[0] / ratio[1] == pytest.approx(1 / share, rel=2e-3)
    system = NcclSystem.of(G, range(8))
    rings = channel_rings(system)
    slow = nccl.cost.tree_time(system, rings, nbytes, proto)
    fast = nccl.cost.tree_time(system, rings, nbytes, proto,
                               nccl.cost.efficiency(system, rings, "Tree", proto))
    assert (slow > fast) == (share < 1)


def test_simple_ring_allreduce_across_nodes_pays_nccls_plateau_latency():
    from emulator.collectives.nccl import builders

    scale = nccl.cost.ring_latency_scale
    two = NcclSystem.of(graph("cluster:dgx_a100x2"), range(16))
    assert scale(two, "allreduce", "Simple", 1 << 20, 8) == 1.4
    assert scale(two, "allreduce", "Simple", 64 * 8 * 16 - 1, 8) == 1.0   # < 64 B per ch x rank
    assert scale(two, "allgather", "Simple", 1 << 20, 8) == 1.0
    assert scale(two, "allreduce", "LL128", 1 << 20, 8) == 1.0
    assert scale(NcclSystem.of(graph("dgx_a100"), range(8)), "allreduce", "Simple", 1 << 20, 8) == 1.0
    volta = NcclSystem.of(graph("cluster:dgx1_v100x2"), range(16))
    assert scale(volta, "allreduce", "Simple", 1 << 20, 12) == 1.9
    # The schedule's waits are the handshakes of a latency 1.4 times NCCL's; a message below
    # the threshold (built right after, so the kept ring would be resized if the scale were
    # not in its key) gets the unscaled ones back.
    rings = channel_rings(two, 1)
    for nbytes, factor in ((1 << 20, 1.4), (512, 1.0)):     # one channel: 64 B x 16 ranks
        s, _ = run("cluster:dgx_a100x2", "allreduce", "nccl_ring", nbytes, "Simple", channels=1)
        eff = nccl.cost.efficiency(two, rings, "Ring", "Simple")
        want = [nccl.cost.ring_waits(two, rings, "allreduce", "Simple", eff, nbytes, 1, f)
                for f in (factor, 1.0)]
        assert np.allclose(s.compute_s, builders.ring_compute(two, rings, "allreduce", "Simple",
                                                              want[0], factor), rtol=1e-12)
        assert s.compute_s.max() > 0
        assert (want[0][0] > want[1][0]).any() == (factor > 1)


def _protocols(spec, nbytes=1 << 20):
    return {p for _, p, _ in nccl.plan(graph(spec), "allreduce", nbytes).candidates}


def test_ll_and_ll128_cross_only_nics_that_keep_writes_in_order():
    # aws-ofi-nccl runs p4d / p4de with NCCL_PROTO=simple (EFA v1 reorders 128-byte writes);
    # inside one box the NICs carry nothing and every protocol runs.
    assert _protocols("cluster:p4dex2") == {"Simple"}
    assert _protocols("cluster:p4dx2", 8) == {"Simple"}
    assert _protocols("p4de") == {"LL", "LL128", "Simple"}
    assert _protocols("cluster:p5x2") == {"LL", "LL128", "Simple"}
    assert nccl.plan(graph("cluster:p4dex2"), "allreduce", 8).protocol == "Simple"
    with pytest.raises(ConfigError, match=r"protocol='LL'.* it runs: .* with Simple$"):
        nccl.plan(graph("cluster:p4dex2"), "allreduce", 8, proto="LL")
    s, _ = run("cluster:p4dex2", "alltoall", "nccl", 1 << 16)
    assert s.detail["nccl"]["protocol"] == "Simple"


def _with_nic_protocol(spec, protocol):
    G = topologies.from_spec(spec)
    for n, d in G.nodes(data=True):
        if d["kind"] == "nic":
            d["protocol"] = protocol
    return G


@pytest.mark.parametrize("algo", ["Ring", "Tree", "NVLSTree"])
def test_efa_network_steps_take_the_plugins_latency(algo):
    from emulator.collectives.nccl.builders import hop_latency

    efa = NcclSystem.of(graph("cluster:p5x2"), range(16))
    ib = NcclSystem.of(_with_nic_protocol("cluster:p5x2", "ib"), range(16))
    assert (efa.net_protocol, ib.net_protocol) == ("efa", "ib")
    protos = ("Simple",) if algo == "NVLSTree" else nccl.PROTOCOLS
    for p in protos:
        want = 23e-6 if p == "Simple" else 20e-6           # nccl_ofi_tuner.h: 20 + 3 us
        assert hop_latency(efa, True, algo, p) == pytest.approx(want)
        assert hop_latency(ib, True, algo, p) == C.HOP_LATENCY["net"][algo][p]
        assert hop_latency(efa, False, algo, p) == hop_latency(ib, False, algo, p)


def test_efa_latency_reaches_ring_predictions_per_network_crossing():
    # The ring's longest chain crosses the network 2 x nodes times (tuning.cc's nInterSteps
    # of an allreduce); each crossing costs the plugin's 23 us instead of hwLat's 14 us, times
    # the plateau factor of a Simple ring allreduce across nodes (1.4 on Hopper).
    ib = _with_nic_protocol("cluster:p5x2", "ib")
    t_efa = nccl.plan(graph("cluster:p5x2"), "allreduce", 1 << 20, algo="Ring",
                      proto="Simple").predicted_s
    t_ib = nccl.plan(ib, "allreduce", 1 << 20, algo="Ring", proto="Simple").predicted_s
    crossings = (t_efa - t_ib) / (9e-6 * 1.4)
    assert crossings == pytest.approx(4, abs=1e-6)


def test_overrides_in_nccl_algo_and_proto_syntax():
    G = graph("dgx_h100")
    assert nccl.plan(G, "allreduce", 1 << 30, algo="Ring").algorithm == "Ring"
    assert nccl.plan(G, "allreduce", 1 << 30, algo="^nvls").algorithm in ("Ring", "Tree")
    assert nccl.plan(G, "allreduce", 8, proto="^LL").protocol in ("LL128", "Simple")
    assert nccl.plan(G, "allreduce", 8, proto="simple").protocol == "Simple"
    s, _ = run("dgx_h100", "allreduce", "nccl", 1 << 20, proto="LL128")
    assert s.detail["nccl"]["protocol"] == "LL128"


def test_parse_list():
    assert parse_list("Ring,Tree", nccl.ALGOS, "algorithm") == ("Tree", "Ring")
    assert parse_list("^LL", nccl.PROTOCOLS, "protocol") == ("LL128", "Simple")
    assert parse_list(None, nccl.PROTOCOLS, "protocol") == nccl.PROTOCOLS


@pytest.mark.parametrize("call, words", [
    (lambda: nccl.plan(graph("dgx_a100"), "allreduce", 8, proto="LL64"),
     r"protocol='LL64': 'LL64' is not one of LL, LL128, Simple"),
    (lambda: nccl.plan(graph("dgx_a100"), "allreduce", 8, algo="NVLS"),
     r"leave nothing NCCL runs for allreduce on this topology; it runs: Ring, Tree"),
    (lambda: nccl.plan(graph("dgx_a100"), "allgather", 8, algo="Tree"),
     r"it runs: Ring"),
    (lambda: nccl.plan(graph("dgx_a100"), "scan", 8), r"op='scan' has no NCCL algorithm"),
    (lambda: nccl.plan(graph("cluster:dgx_h100x2"), "allreduce", 8, algo="NVLS"),
     r"it runs: NVLSTree, Ring, Tree"),
    (lambda: nccl.plan(graph("dgx_a100"), "allreduce", 8, channels=40),
     r"channels=40: this topology carries 1..32 channels"),
    (lambda: nccl.plan(graph("dgx_a100"), "allreduce", 8, channels=0),
     r"channels=0: this topology carries 1..32"),
    (lambda: nccl.plan(graph("dgx1_v100"), "allreduce", 8, channels=13),
     r"channels=13: this topology carries 1..12 channels \(twice the 6 distinct ring"),
    (lambda: build_schedule("allreduce", "ring", 4, 8, protocol="LL"),
     r"only NCCL algorithms .* take them, not algorithm='ring'"),
    (lambda: build_schedule("allreduce", "nccl", 4, 8),
     r"NCCL algorithms need graph="),
    (lambda: build_schedule("allgather", "nccl_tree", 4, 8, graph=graph("dgx_a100")),
     r"algorithm='nccl_tree' is not known for op='allgather'"),
])
def test_errors_name_the_value_and_what_is_allowed(call, words):
    with pytest.raises(ConfigError, match=words):
        call()


# -- schedules --------------------------------------------------------------------------------
def test_every_nccl_algorithm_builds_valid_schedules():
    for (op, name) in sorted(NCCL_ALGORITHMS):
        G = graph("dgx_h100" if name == "nccl_nvls" else "cluster:dgx_h100x2")
        p = len(topologies.gpus(G))
        kw = {}
        if "qsgd" in name:
            kw["payload_bytes"] = [1000 + 13 * j for j in range(p)]
        s = build_schedule(op, name, p, 1 << 20, graph=G, **kw)
        owner = np.repeat(np.arange(len(s)), np.diff(s.dep_ptr))
        assert np.all(s.dep_idx < owner)
        assert s.detail["nccl"]["algorithm"] in nccl.ALGOS + ("P2P",)
        r = emulator.simulate(G, s)
        assert r.bytes_received == r.bytes_sent > 0


def test_message_is_split_across_channels():
    # 512 kB: NCCL's 16 channels want 32 KiB each (Simple), so 15 run: on all 8 rings
    s, r = run("cluster:dgx_a100x2", "allreduce", "nccl_ring", 16 * 8 * 4000, "Simple")
    assert s.detail["nccl"]["channels"] == 15
    # every NIC carries one channel's share each way
    nic_bytes = {l.u: l.bytes for l in r.links if l.u.endswith(tuple(f"nic{j}" for j in range(8)))
                 and ("spine" in l.v or "leaf" in l.v)}
    assert len(nic_bytes) == 16 and len(set(nic_bytes.values())) == 1


@pytest.mark.parametrize("algo, proto, ranks, per_channel", [
    ("Ring", "LL", 32, 512 * 8 * 32),           # LL: 8 B per thread per rank, 512 threads
    ("Ring", "LL", 1024, 512 * 8 * 1024),
    ("Ring", "LL128", 32, 640 * 8),
    ("Ring", "Simple", 32, 512 * 64),
    ("Tree", "LL", 1024, 512 * 8),              # trees' LL threshold does not grow with ranks
    ("Tree", "Simple", 1024, 512 * 64),
])
def test_small_messages_run_on_fewer_channels(algo, proto, ranks, per_channel):
    for nc in (1, 3, 8):
        assert nccl.channels_for_size(ranks, algo, proto, nc * per_channel, 8) == nc
        if nc > 1:
            assert nccl.channels_for_size(ranks, algo, proto, nc * per_channel - 1, 8) == nc - 1
    assert nccl.channels_for_size(ranks, algo, proto, 1, 8) == 1
    assert nccl.channels_for_size(ranks, algo, proto, 1 << 40, 8) == 8
    assert nccl.channels_for_size(ranks, algo, proto, 1 << 40, 3) == 3


def test_nvls_and_all_to_all_keep_their_channels():
    assert nccl.channels_for_size(1024, "NVLS", "Simple", 1, 16) == 16
    assert nccl.channels_for_size(1024, "NVLSTree", "Simple", 1, 16) == 16
    assert nccl.channels_for_size(1024, "P2P", "Simple", 1, 8) == 8


def test_a_small_ring_runs_on_fewer_channels_and_nics():
    # 32 ranks: a ring LL channel wants 128 KiB; 3.5 of them run on 3 channels, whose rings
    # leave each node through 3 of its 8 NICs
    G = graph("cluster:dgx_a100x4")
    nbytes = 7 * 64 * 1024
    p = nccl.plan(G, "allreduce", nbytes, algo="Ring", proto="LL")
    assert p.channels == 3 and p.describe() == "NCCL Ring/LL, 3 channels"
    assert nccl.plan(G, "allreduce", 1 << 26, algo="Ring", proto="LL").channels == 16
    s, r = run("cluster:dgx_a100x4", "allreduce", "nccl_ring", nbytes, "LL")
    assert s.detail["nccl"]["channels"] == 3
    assert s.detail["nccl"]["predicted_s"] == pytest.approx(p.predicted_s)
    nics = {l.u for l in r.links if "nic" in l.u.rsplit("/", 1)[-1] and l.bytes > 0
            and ("spine" in l.v or "leaf" in l.v)}
    assert len(nics) == 3 * 4
    # the closed form of the 3 channels, as for every congested ring: an upper bound, close
    assert p.predicted_s * 0.85 <= r.time_s <= p.predicted_s * (1 + 1e-9)


def test_qsgd_transports_move_payloads_on_nccl_channels():
    # 800 kB gathered in LL, which wants 64 KiB per channel on 16 ranks: 12 of NCCL's 16
    # channels, on all 8 rings
    pb = [50_000 + 7 * j for j in range(16)]
    s, r = run("cluster:dgx_a100x2", "allreduce", "nccl_qsgd_allgather", 1 << 20, payload_bytes=pb)
    assert s.detail["payload_bytes"] == 15 * sum(pb)
    assert s.detail["nccl"]["protocol"] == "LL" and s.detail["nccl"]["channels"] == 12
    s2, r2 = run("cluster:dgx_a100x2", "allreduce", "nccl_qsgd_scatter_reduce_allgather", 1 << 20,
                 payload_bytes=pb)
    assert set(s2.tags) >= {"scatter", "reduce", "allgather"}
    net = emulator.Network(graph("cluster:dgx_a100x2"))
    assert net.algorithm == "nccl" and net.resolve("allreduce", "qsgd_allgather") == "nccl_qsgd_allgather"
    t, sent = net.collective("allreduce", "qsgd_allgather", 1 << 20, pb)
    assert t == pytest.approx(r.time_s) and sent == pytest.approx(15 * sum(pb) / 16)


def test_constants_are_ncclss():
    assert C.nvlink_efficiency(90) == pytest.approx(20.6 / 25)
    assert C.nvlink_efficiency(100) == pytest.approx(40.1 / 50)
    assert C.arch_of(70) == "volta" and C.arch_of(100) == "blackwell"
    assert C.HOP_LATENCY["net"]["Ring"]["Simple"] == pytest.approx(14e-6)


@pytest.mark.slow
@pytest.mark.parametrize("fabric", sorted(topologies.FABRICS))
@pytest.mark.parametrize("name", sorted(topologies.PRESETS))
def test_every_preset_runs_in_every_fabric(name, fabric):
    G = graph(f"cluster:{name}x3,fabric={fabric}")
    p = len(topologies.gpus(G))
    system = NcclSystem.of(G, range(p))
    plan = nccl.plan(G, "allreduce", 64 << 20, system=system)
    rings = channel_rings(system)
    assert len(rings) == len(system.nics[0]) and plan.predicted_s > 0
    if plan.algorithm in ("Ring", "Tree"):      # all of NCCL's channels, on every NIC's ring
        assert plan.channels == nccl.communicator_channels(system) >= len(rings)
    assert all(sorted(rg.order) == list(range(p)) for rg in rings)


def test_the_analysis_is_kept_with_the_graph_until_it_changes():
    """A replayed iteration builds dozens of collectives on one graph: NCCL's view of it is
    computed once, and again after a link changes (the hop facts then follow the new link)."""
    G = topologies.from_spec("cluster:dgx_a100x2")
    a = NcclSystem.of(G, range(16))
    assert NcclSystem.of(G, range(16)) is a
    assert NcclSystem.of(G, range(8)) is not a
    src, dst = a.gpu(0), a.gpu(8)
    before = a.hop((src, dst))
    assert a.hop((src, dst)) is before
    u, v = before.channels[len(before.channels) // 2]
    G.edges[u, v]["bandwidth"] /= 4
    b = NcclSystem.of(G, range(16))
    assert b is not a and b.hop((src, dst)).raw == before.raw / 4
    assert NcclSystem.of(topologies.from_spec("cluster:dgx_a100x2"), range(16)) is not b


@pytest.mark.parametrize("spec, nbytes, slack", [
    ("cluster:dgx_a100x2", 1 << 20, 0.03),
    ("cluster:dgx_a100x8", 1 << 21, 0.03),
    # tuning.cc's medium-size tree correction (0.8 for LL128 at 4 MiB) brings the engine's
    # tree within 7 % of its ring; the tree's closed form, an upper bound 23 % above the
    # engine on 8 nodes, then picks the ring
    ("cluster:dgx_a100x8", 1 << 22, 0.08),
    ("cluster:dgx_a100x8", 1 << 24, 0.03)])
def test_choice_is_the_engines_fastest_ring_or_tree(spec, nbytes, slack):
    # NCCL picks the fastest predicted (algorithm, protocol); the model's prediction of a tree
    # on several nodes must not be so pessimistic that a clearly slower ring wins (the first
    # chunk shares links only with the hops at its level, not with every hop of its phase).
    G = graph(spec)
    timed = {}
    for name in ("nccl_ring", "nccl_tree"):
        for proto in nccl.PROTOCOLS:
            s, r = run(spec, "allreduce", name, nbytes, proto)
            timed[(s.detail["nccl"]["algorithm"], proto)] = r.time_s
            if name == "nccl_tree":          # the tree's closed form stays an upper bound
                assert r.time_s <= s.detail["nccl"]["predicted_s"] * (1 + 1e-9)
    p = nccl.plan(G, "allreduce", nbytes, algo="Ring,Tree")
    assert timed[(p.algorithm, p.protocol)] <= min(timed.values()) * (1 + slack)
