"""NCCL's all-to-all from its per-pair table: the same facts as the send-by-send analysis."""
import numpy as np
import pytest

import emulator
import topologies
from emulator.collectives import build_schedule
from emulator.collectives._builder import Builder
from emulator.collectives.nccl import NcclSystem, p2p
from emulator.collectives.nccl.cost import shared_rates


@pytest.mark.parametrize("spec,ranks", [
    ("cluster:dgx_a100x2", range(16)), ("cluster:p4dx2", range(16)),
    ("cluster:dgx_h100x3,fabric=leaf_spine", range(24)), ("cluster:dgx_a100x4", (17, 3, 9, 30, 22, 8)),
    ("pcie_box:gpus=8,pcie_gen=4", range(8)), ("switch:6", range(6))])
def test_the_table_is_the_send_by_send_analysis(spec, ranks):
    system = NcclSystem.of(topologies.from_spec(spec), ranks)
    t = p2p.table(system)
    pairs = [(x, y) for x in sorted(system.ranks) for y in sorted(system.ranks) if x != y]
    assert [(system.ranks[i], system.ranks[j]) for i, j in zip(t.i, t.j)] == pairs
    hops = [system.hop(*system.p2p_stops(x, y)) for x, y in pairs]
    # exact: the legs combine in route order to the very floats of the whole hops
    assert t.latency.tolist() == [h.latency for h in hops]
    assert t.inflation.tolist() == [h.inflation for h in hops]
    assert t.net.tolist() == [h.net for h in hops]
    assert t.rate.tolist() == shared_rates(system, hops)
    for (x, y), r in zip(pairs, t.route):
        stops, flow = system.p2p_stops(x, y)
        assert t.routes[r] == emulator.Route(via=tuple(stops[1:-1]), flow=flow)


def test_alltoall_adds_one_transfer_per_pair_and_returns_their_ids():
    system = NcclSystem.of(topologies.from_spec("cluster:dgx_a100x2"), range(16))
    b = Builder()
    sizes = np.arange(16 * 16, dtype=np.int64).reshape(16, 16) * 1000
    ids = p2p.alltoall(b, system, sizes, "Simple")
    assert (np.diag(ids) == -1).all() and (ids[~np.eye(16, dtype=bool)] >= 0).all()
    s = b.build(system.ranks, "alltoall", "nccl_p2p", int(sizes.sum()))
    t = p2p.table(system)
    assert s.src[ids[3, 12]] == 3 and s.dst[ids[3, 12]] == 12
    # wire bytes: the payload at the protocol's efficiency, rounded up
    k = int(np.flatnonzero((t.i == 3) & (t.j == 12))[0])
    assert s.size[ids[3, 12]] == int(np.ceil(sizes[3, 12] * t.inflation[k]))


def test_closed_form_is_the_engine_for_an_alltoall_on_one_switch():
    # every pair's flows share only their own ports, all start together: the closed form is exact
    G = topologies.from_spec("switch:6")
    sched = build_schedule("alltoall", "nccl_p2p", list(range(6)), 6 << 20, graph=G)
    res = emulator.simulate(G, sched)
    assert res.time_s == pytest.approx(sched.detail["nccl"]["predicted_s"], rel=1e-9)


def test_a_waypoint_route_on_the_default_path_shares_its_path_whichever_comes_first():
    from emulator import netpaths

    def table_of():
        G = topologies.from_spec("cluster:dgx_a100x2")
        return netpaths._routes_of(G, topologies.gpus(G))

    one = np.array([0]), np.array([8])              # GPU 0 to GPU 8, the next node
    t = table_of()
    t.paths([emulator.Route()], np.array([0]), *one)
    nodes = [t.channels[c][1] for c in t.chan]
    via = emulator.Route(via=tuple(v for v in nodes if ".nic" in v), flow=0)   # its NICs
    assert len(via.via) == 2
    routes = [emulator.Route(), via]
    for order in ((0, 1), (1, 0)):
        t = table_of()
        got = {r: int(t.paths(routes, np.array([r]), *one)[0]) for r in order}
        assert got[0] == got[1]
        assert len(t.ptr) - 1 == 1              # one path
    # a route that crosses other channels is a path of its own
    t = table_of()
    other = emulator.Route(via=("n0.nic7", "n1.nic7"), flow=0)
    ids = t.paths([emulator.Route(), other], np.array([0, 1]), np.array([0, 0]), np.array([8, 8]))
    assert ids[0] != ids[1]
