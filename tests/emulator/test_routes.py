"""Explicit routes on transfers: waypoints and ECMP flow labels reach the engine."""
import numpy as np
import pytest

import emulator
import topologies
from emulator import Route, ScheduleError
from emulator.collectives._builder import Builder


def _one(route=None, src=0, dst=8, nbytes=1_000_000):
    b = Builder()
    rid = 0 if route is None else b.route(route)
    b.add([src], [dst], nbytes, (), "x", route=rid)
    return b.build((src, dst), "test", "x", nbytes)


def _links(res):
    return {(l.u, l.v) for l in res.links}


def test_a_route_passes_through_its_waypoints():
    G = topologies.from_spec("cluster:dgx_a100x2")
    plain = emulator.simulate(G, _one())
    via = emulator.simulate(G, _one(Route(via=("n0.nic5", "n1.nic5"))))
    assert ("n0.nic5", "leaf0") in _links(via) and ("leaf0", "n1.nic5") in _links(via)
    assert ("n0.nic5", "leaf0") not in _links(plain)
    # the waypoint legs are each shortest; the detour can only cost latency
    assert via.time_s >= plain.time_s


def test_flow_labels_spread_equal_cost_paths():
    G = topologies.from_spec("fat_tree:k=4")
    spines = set()
    for flow in range(16):
        res = emulator.simulate(G, _one(Route(flow=flow), src=0, dst=15))
        spines |= {u for u, _ in _links(res) if u.startswith("core")}
    assert len(spines) >= 2


def test_routes_survive_the_transfer_view_and_are_validated():
    s = _one(Route(via=("n0.nic5",), flow=2))
    assert s.transfers[0].route == 1 and s.routes[1] == Route(via=("n0.nic5",), flow=2)
    with pytest.raises(ScheduleError, match="flow=-1"):
        Route(flow=-1)
    with pytest.raises(ScheduleError, match="via node 3"):
        Route(via=(3,))
    # what the checks let through quickly (a tuple of names, an int flow) is still checked
    # for the rest: an empty name, a bool flow, a name among good ones
    for bad, match in ((dict(via=("",)), "via node ''"), (dict(flow=True), "flow=True"),
                       (dict(via=("n0.nic5", 7)), "via node 7"), (dict(flow=1.0), "flow=1.0")):
        with pytest.raises(ScheduleError, match=match):
            Route(**bad)
    assert Route(via=["a", "b"], flow=np.int64(3)) == Route(via=("a", "b"), flow=3)
    assert type(Route(flow=np.int64(3)).flow) is int and Route(via="a").via == ("a",)
    with pytest.raises(emulator.ConfigError, match="'nowhere' is not a node"):
        emulator.simulate(topologies.from_spec("switch:16"), _one(Route(via=("nowhere",))))


def test_explicit_routes_are_synced_once_per_lookup_not_once_per_route(monkeypatch):
    # NCCL's all-to-all gives each pair of nodes' GPUs a route through a proxy GPU and two
    # NICs; copying the routing tables once per new route made a 1024-GPU all-to-all quadratic
    from emulator import netpaths

    G = topologies.from_spec("cluster:dgx_a100x2")
    sched = emulator.build_schedule("alltoall", "nccl_p2p", list(range(16)), 16 << 20, graph=G)
    assert len(sched.routes) > 8
    calls = []
    real = netpaths._Routes._sync
    monkeypatch.setattr(netpaths._Routes, "_sync", lambda self: (calls.append(1), real(self)))
    res = emulator.simulate(G, sched)
    assert len(calls) == 1
    again = emulator.simulate(G, sched)          # routed already: nothing new to sync
    assert len(calls) == 1 and again.time_s == res.time_s
    monkeypatch.undo()
    fresh = emulator.simulate(topologies.from_spec("cluster:dgx_a100x2"), sched)
    assert fresh.time_s == res.time_s


@pytest.mark.parametrize("algorithm,op", [("nccl", "alltoall"), ("nccl", "allreduce"),
                                          ("ring", "allreduce")])
def test_sparse_pair_table_gives_the_dense_ones_results(algorithm, op, monkeypatch):
    # Beyond 4,096 GPUs the (source, destination) -> path table is sorted keys, not n**2
    # entries (34 GB at 65,536 GPUs); forced here on 32 GPUs, it must route alike.
    from emulator import netpaths

    G = topologies.from_spec("cluster:dgx_a100x4")
    sched = emulator.build_schedule(op, algorithm, 32, 8_000_000, graph=G)
    dense = emulator.simulate(G, sched)
    monkeypatch.setattr(netpaths._Pairs, "DENSE", 0)
    monkeypatch.setattr(netpaths, "_KEPT", {})
    G2 = topologies.from_spec("cluster:dgx_a100x4")
    sparse = emulator.simulate(G2, emulator.build_schedule(op, algorithm, 32, 8_000_000, graph=G2))
    assert netpaths._routes_of(G2, topologies.gpus(G2)).default.dense is None
    assert sparse.time_s == dense.time_s
    assert [(l.u, l.v, l.bytes) for l in sparse.links] == [(l.u, l.v, l.bytes) for l in dense.links]
