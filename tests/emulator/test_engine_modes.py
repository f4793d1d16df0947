"""The engine at scale: the approximate mode's error bound, batching of events and SimPy steps,
routes kept per graph, memory linear in flows, and the exact/tolerance options.

Units: bytes, seconds, bytes/s.
"""
import tracemalloc

import numpy as np
import pytest
import simpy

import emulator
import topologies
from emulator import ConfigError, Schedule, Transfer, build_schedule, simulate
from emulator import engine
from emulator.engine import APPROX_TOLERANCE, _Network, _Run

B, L = 12.5e9, 1e-6


def _chain(rng, n):
    """n transfers in a chain, random sizes, on a ring of 4 (no two ever share a channel)."""
    sizes = rng.integers(10_000, 2_000_000, n)
    return Schedule([Transfer(i, i % 4, (i + 1) % 4, int(sizes[i]), deps=(i - 1,) if i else ())
                     for i in range(n)], (0, 1, 2, 3), "custom", "chain", 1)


@pytest.mark.parametrize("tol", [1e-3, 1e-2])
def test_approximate_chain_is_short_by_at_most_tolerance(tol):
    # The stated bound: each flow ends at most tol of its own duration early, so a chain that
    # never shares is at most tol (relative) short, and never long.
    G = topologies.ring(4)
    for seed in range(20):
        sched = _chain(np.random.default_rng(seed), 30)
        exact = simulate(G, sched, _force_events=True).time_s
        approx = simulate(G, sched, exact=False, tolerance=tol, _force_events=True).time_s
        assert exact * (1 - tol) <= approx <= exact * (1 + 1e-12)


CONGESTED = [("fat_tree:k=4", "alltoall", "direct"), ("switch:16", "allreduce", "tree"),
             ("leaf_spine:leaves=4,spines=1,hosts=4", "allreduce", "direct"),
             ("cluster:dgx_a100x2", "allreduce", "qsgd_scatter_reduce_allgather")]


@pytest.mark.parametrize("spec, op, alg", CONGESTED)
def test_approximate_error_on_congested_schedules(spec, op, alg):
    # Through sharing the error is not bounded by a proof; measured here on uneven sizes it
    # stays within the tolerance, and the approximate run never has more events.
    G = topologies.from_spec(spec)
    p = len(topologies.gpus(G))
    rng = np.random.default_rng(3)
    for n in (10 ** 6 + 7, 3 * 10 ** 7):
        pb = rng.integers(n // (4 * p), n // p, p).tolist() if alg.startswith("qsgd") else None
        sched = build_schedule(op, alg, p, n, graph=G, payload_bytes=pb)
        exact = simulate(G, sched)
        approx = simulate(G, sched, exact=False, tolerance=1e-2)
        assert abs(approx.time_s - exact.time_s) <= 1e-2 * exact.time_s
        assert approx.events <= exact.events
        assert approx.bytes_received == exact.bytes_received == sched.total_bytes


def test_events_per_step_does_not_change_results(monkeypatch):
    # The SimPy clock steps over up to EVENTS_PER_STEP events of the compiled loop: one event
    # per step or thousands, the same outcome, and SimPy's clock ends at the last event.
    G = topologies.fat_tree(4)
    sched = build_schedule("allreduce", "tree", 16, 10 ** 6 + 1, chunks=3, graph=G)
    big = simulate(G, sched).to_dict()
    monkeypatch.setattr(engine, "EVENTS_PER_STEP", 1)
    run = _Run(_Network(G, sched), sched, np.zeros(len(sched)))
    env = simpy.Environment()
    env.process(run.process(env))
    env.run()
    one = run.result()
    assert one.to_dict() == big
    assert env.now == pytest.approx(float(np.nanmax(run.clock.arrive)), rel=1e-12)
    assert one.events == big["events"] > 100


def test_starts_and_arrivals_within_1e12_are_one_event():
    # Two flows into one GPU start at t and t (1 + 1e-13): one event, one shared rate.
    G = topologies.switch(3, bandwidth=B, latency=L)
    t0 = 1e-3
    sched = Schedule([Transfer(0, 0, 0, 0, compute_s=t0),
                      Transfer(1, 1, 1, 0, compute_s=t0 * (1 + 1e-13)),
                      Transfer(2, 0, 2, 10 ** 6, deps=(0,)),
                      Transfer(3, 1, 2, 10 ** 6, deps=(1,))], (0, 1, 2), "custom", "x", 1)
    res = simulate(G, sched)
    assert res.time_s == pytest.approx(t0 + 2 * 10 ** 6 / B + 2 * L, rel=1e-12)
    assert res.events == 3                 # both start, both finish, both arrive


def test_routes_are_kept_per_graph_and_redone_when_it_changes():
    from emulator import netpaths

    G = topologies.fat_tree(4)
    s = build_schedule("alltoall", "direct", 16, 10 ** 6)
    first = simulate(G, s)
    table = netpaths._CACHE[G][1]
    again = simulate(G, s)
    assert netpaths._CACHE[G][1] is table and again.to_dict() == first.to_dict()
    # A link at half bandwidth, changed in place: routed afresh, and slower.
    u, v = "pod0.edge0", "pod0.agg0"
    G.edges[u, v]["bandwidth"] /= 2
    slower = simulate(G, s)
    assert netpaths._CACHE[G][1] is not table
    assert slower.time_s > first.time_s
    assert next(l for l in slower.links if (l.u, l.v) == (u, v)).capacity == \
        next(l for l in first.links if (l.u, l.v) == (u, v)).capacity / 2


def _engine_bytes(run: _Run) -> int:
    """Bytes of every array the event loop holds."""
    total = 0
    for group in (run.paths, run.state, run.flows, run.sched, run.clock):
        total += sum(a.nbytes for a in group)
    return total


def test_event_loop_memory_is_linear_in_flows():
    # All-to-all on a fat tree: flows grow as p^2. What the loop holds is a fixed part (the
    # graph's channels) plus a constant per flow (paths, route entries, transfers are all
    # O(flows)): the cost of each added flow is the same from 16 to 32 as from 32 to 64
    # ranks. The peak of what a whole simulation allocates grows no faster.
    flows, held, peak = [], [], []
    for p in (16, 32, 64):
        G = topologies.fat_tree(8)
        sched = build_schedule("alltoall", "direct", p, 10 ** 7)
        run = _Run(_Network(G, sched), sched, np.zeros(len(sched)))
        flows.append(len(sched))
        held.append(_engine_bytes(run))
        tracemalloc.start()
        simulate(topologies.fat_tree(8), sched)
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    marginal = np.diff(held) / np.diff(flows)
    assert marginal[1] == pytest.approx(marginal[0], rel=0.1), marginal
    assert marginal[1] < 1000                       # bytes per flow
    peak_marginal = np.diff(peak) / np.diff(flows)
    assert peak_marginal[1] <= 1.25 * peak_marginal[0], peak_marginal


@pytest.mark.parametrize("kwargs, words", [
    ({"exact": 1}, "exact=1 must be True or False"),
    ({"tolerance": 0.01}, "tolerance=0.01 applies only with exact=False"),
    ({"exact": False, "tolerance": 0.0}, "tolerance=0.0 must be a number in (0, 0.5)"),
    ({"exact": False, "tolerance": 0.7}, "tolerance=0.7"),
    ({"exact": False, "tolerance": "1%"}, "tolerance='1%'"),
])
def test_bad_mode(kwargs, words):
    G = topologies.switch(4)
    with pytest.raises(ConfigError) as e:
        simulate(G, build_schedule("alltoall", "direct", 4, 1000), **kwargs)
    assert words in str(e.value)


def test_default_tolerance_is_used_by_exact_false():
    G = topologies.switch(3, bandwidth=B, latency=L)
    # Two flows into gpu2, n and n (1 + tol/2) bytes: exact finishes them apart (start, two
    # finishes, two arrivals), the approximate mode together (the second is within tol of
    # its duration): start, finish, arrival; n tol / (2 B) earlier.
    n = 10 ** 6
    sched = Schedule([Transfer(0, 0, 2, n), Transfer(1, 1, 2, int(n * (1 + APPROX_TOLERANCE / 2)))],
                     (0, 1, 2), "custom", "x", 1)
    exact, approx = simulate(G, sched), simulate(G, sched, exact=False)
    assert (exact.events, approx.events) == (5, 3)
    assert exact.time_s - approx.time_s == pytest.approx(n * APPROX_TOLERANCE / 2 / B, rel=1e-6)
    assert emulator.run_collective(G, "alltoall", "direct", 3000, exact=False).events >= 1


@pytest.mark.parametrize("seed", range(5))
def test_dependants_is_the_reverse_of_the_dependency_csr(seed):
    # The counting sort must list each transfer's dependants in increasing order, as a
    # stable argsort of the dependency edges does.
    from emulator import events

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    counts = rng.integers(0, 4, n)
    dep_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    dep_idx = rng.integers(0, n, int(dep_ptr[-1])).astype(np.int64)
    rev_ptr, rev_idx = events.dependants(dep_ptr, dep_idx, n)
    owners = np.repeat(np.arange(n), counts)
    expect_ptr = np.concatenate(([0], np.cumsum(np.bincount(dep_idx, minlength=n))))
    assert rev_ptr.tolist() == expect_ptr.tolist()
    assert rev_idx.tolist() == owners[np.argsort(dep_idx, kind="stable")].tolist()

# -- a connection's messages leave in order (Transfer.after) ----------------------------------
def _two_on_one_connection(after, compute_s=0.0):
    return Schedule([Transfer(0, 0, 1, 10_000_000),
                     Transfer(1, 0, 1, 10_000_000, compute_s=compute_s, after=after)],
                    (0, 1), "custom", "x", 1)


@pytest.mark.parametrize("force", [False, True])
def test_a_queued_message_starts_when_the_one_ahead_leaves(force):
    # 10 MB at 10 GB/s is 1 ms. Queued: the second goes on the wire when the first's last
    # byte leaves (1 ms), not when it arrives (1 ms + 1 us); they never share the link.
    G = topologies.from_spec("switch:2,bw=10GB/s,lat=0.5us")
    r = simulate(G, _two_on_one_connection(0), _force_events=force)
    assert r.time_s == pytest.approx(2e-3 + 1e-6, rel=1e-12)
    assert r.rank_start_s == pytest.approx((0.0, 0.0))
    # Without the queue they share the link: both leave at 2 ms, the same makespan here...
    shared = simulate(G, _two_on_one_connection(None), _force_events=force)
    assert shared.time_s == pytest.approx(2e-3 + 1e-6, rel=1e-12)


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("compute_s, expect", [(0.4e-3, 2e-3), (1.5e-3, 2.5e-3)])
def test_a_queued_message_does_its_local_work_meanwhile(force, compute_s, expect):
    # compute_s follows the deps only: it overlaps the message ahead, and the later of the
    # two decides when the bytes go out.
    G = topologies.from_spec("switch:2,bw=10GB/s,lat=0.5us")
    r = simulate(G, _two_on_one_connection(0, compute_s), _force_events=force)
    assert r.time_s == pytest.approx(expect + 1e-6, rel=1e-12)


def test_queued_messages_agree_between_the_engine_and_the_critical_path():
    # A pipelined NCCL ring on one channel never shares a link: both paths time it alike.
    G = topologies.from_spec("cluster:dgx_a100x2")
    s = build_schedule("allreduce", "nccl_ring", 16, 1 << 22, graph=G, protocol="Simple",
                       channels=1)
    assert (s.after >= 0).any()
    fast = simulate(G, s)
    slow = simulate(G, s, _force_events=True)
    assert fast.events == 0 and slow.events > 0
    assert slow.time_s == pytest.approx(fast.time_s, rel=1e-9)
    assert slow.time_s == pytest.approx(s.detail["nccl"]["predicted_s"], rel=1e-9)


def test_after_is_validated_and_kept():
    with pytest.raises(emulator.ScheduleError, match="after"):
        Transfer(0, 0, 1, 10, after="x")
    with pytest.raises(emulator.ScheduleError, match="comes after 5"):
        Schedule([Transfer(0, 0, 1, 10, after=5)], (0, 1), "custom", "x", 1)
    with pytest.raises(emulator.ScheduleError, match="after=1"):
        Schedule.from_arrays(src=[0, 0], dst=[1, 1], size=[1, 1], compute_s=[0, 0],
                             dep_ptr=[0, 0, 0], dep_idx=[], tag_code=[0, 0], tags=("",),
                             ranks=(0, 1), op="custom", algorithm="x", nbytes=2, after=[1, -1])
    s = _two_on_one_connection(0)
    assert s.after.tolist() == [-1, 0]
    assert [t.after for t in s.transfers] == [None, 0]
