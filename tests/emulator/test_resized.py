"""A collective's other sizes reuse its structure: :meth:`Schedule.resized`, NCCL's rings kept
between sizes, and the engine's routes and dependants kept with the structure."""
from __future__ import annotations

import numpy as np
import pytest

import emulator
import topologies
from emulator import netpaths
from emulator.collectives import Schedule, Transfer, build_schedule, nccl
from emulator.errors import ScheduleError

ARRAYS = ("src", "dst", "size", "compute_s", "dep_ptr", "dep_idx", "tag_code", "route", "after")


def small():
    return Schedule([Transfer(0, 0, 1, 10), Transfer(1, 1, 1, 0, deps=(0,)),
                     Transfer(2, 1, 0, 5, deps=(1,))], (0, 1), "test", "x", 10)


def test_resized_shares_everything_but_the_bytes():
    s = small()
    t = s.resized([7, 0, 3], 7)
    assert t.size.tolist() == [7, 0, 3] and t.nbytes == 7
    assert t.structure is s.structure and t.dep_idx is s.dep_idx and t.src is s.src
    assert s.size.tolist() == [10, 0, 5] and s.nbytes == 10       # the original is untouched
    assert not t.size.flags.writeable
    assert [x.nbytes for x in t.transfers] == [7, 0, 3]
    with pytest.raises(AttributeError):
        t.size = np.zeros(3)


@pytest.mark.parametrize("size, nbytes, words", [
    ([1, 0], 1, r"shape \(2,\)"),
    ([1, 0, -4], 1, "nbytes=-4"),
    ([1, 2, 3], 1, "local step 1 carries 2 bytes"),
    ([1, 0, 3], -1, "nbytes=-1"),
])
def test_resized_rejects_bad_sizes_by_name(size, nbytes, words):
    with pytest.raises(ScheduleError, match=words):
        small().resized(size, nbytes)


def _same(a, b):
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ARRAYS) and \
        a.routes == b.routes and a.tags == b.tags and a.ranks == b.ranks


@pytest.mark.parametrize("op", ["allreduce", "allgather", "reduce_scatter"])
def test_an_nccl_ring_at_another_size_is_the_fresh_schedule(op):
    G = topologies.from_spec("cluster:dgx_a100x2")
    first = build_schedule(op, "nccl_ring", 16, 3 << 30, graph=G, protocol="Simple")
    # an odd size: the blocks split unevenly over ranks and channels
    n = (2 << 30) + 12345
    again = build_schedule(op, "nccl_ring", 16, n, graph=G, protocol="Simple")
    assert again.structure is first.structure          # resized, not built
    nccl._KEPT.clear()
    fresh = build_schedule(op, "nccl_ring", 16, n, graph=G, protocol="Simple")
    assert fresh.structure is not first.structure
    assert _same(again, fresh) and again.nbytes == fresh.nbytes == n
    assert again.detail == fresh.detail
    a, b = emulator.simulate(G, again), emulator.simulate(G, fresh)
    assert a.time_s == b.time_s and a.links == b.links and a.bytes_sent == b.bytes_sent


def test_a_ring_of_other_channels_or_protocol_is_built_afresh():
    G = topologies.from_spec("cluster:dgx_a100x2")
    s = build_schedule("allgather", "nccl_ring", 16, 1 << 28, graph=G, protocol="Simple")
    t = build_schedule("allgather", "nccl_ring", 16, 1 << 28, graph=G, protocol="LL128")
    u = build_schedule("allgather", "nccl_ring", 16, 1 << 28, graph=G, protocol="LL128",
                       channels=2)
    assert len({id(x.structure) for x in (s, t, u)}) == 3
    assert t.detail["nccl"]["channels"] != u.detail["nccl"]["channels"]
    assert len(t) != len(u)


def _slow_network(G):
    for _, _, d in G.edges(data=True):
        if d.get("link") == "ib":
            d["bandwidth"] /= 4


def test_the_engine_reuses_routes_only_on_the_same_graph_unchanged():
    G = topologies.from_spec("cluster:dgx_a100x2")
    s = build_schedule("allgather", "nccl_ring", 16, 1 << 28, graph=G, protocol="Simple")
    t = build_schedule("allgather", "nccl_ring", 16, 1 << 27, graph=G, protocol="Simple")
    assert netpaths.Network.of(G, s) is netpaths.Network.of(G, t)
    before = emulator.simulate(G, t).time_s
    # slow the InfiniBand links down in place: the kept routes' capacities are stale now
    _slow_network(G)
    net = netpaths.Network.of(G, t)
    after = emulator.simulate(G, t).time_s
    H = topologies.from_spec("cluster:dgx_a100x2")        # the same change, routed afresh
    _slow_network(H)
    assert net is not netpaths.Network.of(H, t)
    assert after == emulator.simulate(H, t).time_s
    assert after > 1.5 * before


def test_a_schedule_simulated_twice_gives_the_same_result():
    """The engine keeps what it derives from a schedule (dependants, routes) for the next
    run: the counts the event loop consumes must not be among it."""
    G = topologies.from_spec("cluster:dgx_a100x2")
    s = build_schedule("allreduce", "nccl_ring", 16, 1 << 26, graph=G)
    a = emulator.simulate(G, s, _force_events=True)
    b = emulator.simulate(G, s, _force_events=True)
    assert a.time_s == b.time_s and a.events == b.events > 0


def test_schedules_pickle_and_keep_their_shared_structure():
    import pickle

    G = topologies.from_spec("cluster:dgx_a100x2")
    s = build_schedule("allgather", "nccl_ring", 16, 1 << 28, graph=G, protocol="Simple")
    t = build_schedule("allgather", "nccl_ring", 16, 1 << 27, graph=G, protocol="Simple")
    a, b = pickle.loads(pickle.dumps((s, t)))
    assert _same(a, s) and _same(b, t) and a.detail == s.detail and a.nbytes == s.nbytes
    assert a.structure is b.structure and a.structure is not s.structure
    assert not a.size.flags.writeable and not b.dep_idx.flags.writeable
    assert emulator.simulate(G, b).time_s == emulator.simulate(G, t).time_s
    with pytest.raises(AttributeError, match="immutable"):
        a.size = t.size
