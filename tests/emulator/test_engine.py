"""The flow-level engine: max-min fair sharing, congestion worked out by hand, faults,
invariants on congested topologies, determinism and bad input.

Units: bytes, seconds, bytes/s. B is a link bandwidth (bytes/s) and L a link latency (s).
"""
import heapq
import math

import numpy as np
import pytest
import simpy

import topologies
from emulator import (ConfigError, DegradedLink, RemovedLink, Schedule, SimulationError,
                      Straggler, Transfer, build_schedule, closed_form, run_collective, simulate)
from emulator.engine import _Network, _Run, max_min_rates

B = 12.5e9          # bytes/s, the generic builders' default link (100 Gbit/s)
L = 1e-6            # s per link


def _rates(flows, capacity):
    """max_min_rates from a list of channel lists, one per flow."""
    f = np.array([i for i, ch in enumerate(flows) for _ in ch], dtype=np.int64)
    c = np.array([x for ch in flows for x in ch], dtype=np.int64)
    return max_min_rates(f, c, np.asarray(capacity, dtype=float), len(flows))


# -- max_min_rates: progressive filling examples worked by hand ------------------------------------
def test_one_channel_shared_equally():
    # Capacity 1 over 3 flows: 1/3 each.
    assert _rates([[0], [0], [0]], [1.0]) == pytest.approx([1 / 3] * 3, rel=1e-12)


def test_parking_lot():
    # Three channels of capacity 1 in a line; one long flow crosses all, one short flow per
    # channel. Every channel has 2 flows: the fair share is 1/2 everywhere.
    r = _rates([[0, 1, 2], [0], [1], [2]], [1.0, 1.0, 1.0])
    assert r == pytest.approx([0.5] * 4, rel=1e-12)


def test_bottleneck_frees_capacity_elsewhere():
    # c0 = 1 shared by A and B, c1 = 2 shared by A and C. Shares: c0 1/2, c1 1: A and B
    # freeze at 1/2 on c0; c1 has 2 - 1/2 = 1.5 left for C alone.
    r = _rates([[0, 1], [0], [1]], [1.0, 2.0])
    assert r == pytest.approx([0.5, 0.5, 1.5], rel=1e-12)


def test_three_levels():
    # c0 = 3: A, B; c1 = 4: B, C; c2 = 10: C, D, E.
    # Round 1: shares 1.5, 2, 3.33 -> A = B = 1.5. Round 2: c1 has 4 - 1.5 = 2.5 for C alone,
    # c2 10/3 -> C = 2.5. Round 3: c2 has 10 - 2.5 = 7.5 for D, E -> 3.75 each.
    r = _rates([[0], [0, 1], [1, 2], [2], [2]], [3.0, 4.0, 10.0])
    assert r == pytest.approx([1.5, 1.5, 2.5, 3.75, 3.75], rel=1e-12)


def test_max_min_properties_on_random_instances():
    # Seeded random instances: no channel over capacity, and every flow has a bottleneck
    # channel (saturated, and no flow on it is faster) -- the definition of max-min fairness
    # (Bertsekas & Gallager, Data Networks, section 6.5.2).
    rng = np.random.default_rng(12345)
    for _ in range(50):
        n_ch, n_fl = int(rng.integers(1, 8)), int(rng.integers(1, 12))
        cap = rng.uniform(1.0, 10.0, n_ch)
        flows = [sorted(set(rng.choice(n_ch, size=int(rng.integers(1, n_ch + 1))).tolist()))
                 for _ in range(n_fl)]
        r = _rates(flows, cap)
        load = np.zeros(n_ch)
        for i, ch in enumerate(flows):
            load[ch] += r[i]
        assert np.all(load <= cap * (1 + 1e-9))
        for i, ch in enumerate(flows):
            assert any(load[c] >= cap[c] * (1 - 1e-9) and
                       all(r[j] <= r[i] * (1 + 1e-9) for j, f in enumerate(flows) if c in f)
                       for c in ch), (flows, cap, r)


# -- congestion worked out by hand ----------------------------------------------------------------
def _run(G, op, alg, n, *, events, ranks=None, chunks=1, faults=()):
    """run_collective, through the event engine itself when ``events`` (simulate otherwise
    answers schedules whose flows never meet by a critical-path pass)."""
    sched = build_schedule(op, alg, len(topologies.gpus(G)) if ranks is None else ranks, n,
                           chunks=chunks, graph=G)
    return simulate(G, sched, faults=faults, _force_events=events)


EVENTS = pytest.mark.parametrize("events", [False, True], ids=["simulate", "events"])


def _hand(G, transfers, ranks, events=False):
    return simulate(G, Schedule(transfers, ranks, "custom", "hand", 1), _force_events=events)


def _link(res, u, v):
    return next(l for l in res.links if (l.u, l.v) == (u, v))


def test_two_flows_on_one_channel_get_half_each():
    # switch(3): gpu0 -> gpu2 and gpu1 -> gpu2 share the channel sw0 -> gpu2. Each gets B/2,
    # so n bytes take 2n/B, then two link latencies: T = 2n/B + 2L.
    n = 10 ** 6
    res = _hand(topologies.switch(3), [Transfer(0, 0, 2, n), Transfer(1, 1, 2, n)], (0, 1, 2))
    assert res.time_s == pytest.approx(2 * n / B + 2 * L, rel=1e-12)
    assert _link(res, "sw0", "gpu2").peak_utilization == pytest.approx(1.0)
    assert _link(res, "gpu0", "sw0").peak_utilization == pytest.approx(0.5)   # B/2 on a B link
    assert _link(res, "sw0", "gpu2").bytes == 2 * n


def test_a_finished_flow_gives_its_share_back():
    # Same channel, 1000 and 3000 bytes. Both at B/2 until the first is done at t1 = 2000/B;
    # the second has 2000 bytes left, alone at B: done at 4000/B. Arrivals 2L later.
    res = _hand(topologies.switch(3), [Transfer(0, 0, 2, 1000), Transfer(1, 1, 2, 3000)],
                (0, 1, 2))
    assert res.rank_finish_s[0] == pytest.approx(2000 / B + 2 * L, rel=1e-12)
    assert res.time_s == pytest.approx(4000 / B + 2 * L, rel=1e-12)
    assert _link(res, "sw0", "gpu2").busy_s == pytest.approx(4000 / B, rel=1e-12)
    assert _link(res, "gpu0", "sw0").busy_s == pytest.approx(2000 / B, rel=1e-12)


@EVENTS
def test_zero_byte_message_pays_latency_and_compute(events):
    # A 0-byte message arrives one path latency (2L) after it starts; compute_s delays its
    # start. Chain: 0-byte message, then 1000 bytes after 5 us of local work.
    res = _hand(topologies.switch(2), [Transfer(0, 0, 1, 0),
                                       Transfer(1, 1, 0, 1000, deps=(0,), compute_s=5e-6)], (0, 1),
                events)
    assert res.time_s == pytest.approx(2 * L + 5e-6 + 1000 / B + 2 * L, rel=1e-12)


def test_direct_allgather_on_a_switch_is_port_limited():
    # Each GPU sends its n/p block to p-1 peers at once over its one link: p-1 flows share
    # it at B/(p-1) (and p-1 share each downlink), so T = 2L + (p-1)(n/p)/B, p-1 times the
    # closed form's port-per-peer bandwidth term.
    p, n = 8, 8 * 10 ** 6
    res = run_collective(topologies.switch(p), "allgather", "direct", n)
    assert res.time_s == pytest.approx(2 * L + (p - 1) * (n / p) / B, rel=1e-12)


@EVENTS
def test_oversubscribed_leaf_spine_slows_cross_leaf_ring_by_3(events):
    # 2 leaves x 3 GPUs, 1 spine, 3:1: the uplink is 3B/3 = B. The ring order 0,3,1,4,2,5
    # crosses leaves at every hop, so each uplink carries 3 flows at B/3 (and every downlink
    # too). Paths are gpu-leaf-spine-leaf-gpu: alpha = 4L. p*c | n keeps the steps in lock
    # step: T = 2(p-1)(4L + 3 (n/p) / B); non-blocking (uplink 3B) gives B per flow.
    p, n = 6, 6 * 2 ** 20
    order = [0, 3, 1, 4, 2, 5]
    slow = _run(topologies.leaf_spine(2, 1, 3, bandwidth=B, oversubscription=3),
                "allreduce", "ring", n, ranks=order, events=events)
    fast = _run(topologies.leaf_spine(2, 1, 3, bandwidth=B, oversubscription=1),
                "allreduce", "ring", n, ranks=order, events=events)
    assert slow.time_s == pytest.approx(2 * (p - 1) * (4 * L + 3 * (n / p) / B), rel=1e-9)
    assert fast.time_s == pytest.approx(2 * (p - 1) * (4 * L + (n / p) / B), rel=1e-9)
    bw_term = lambda t: t - 2 * (p - 1) * 4 * L                       # noqa: E731
    assert bw_term(slow.time_s) / bw_term(fast.time_s) == pytest.approx(3.0, rel=1e-9)
    # In rank order only two hops cross, one flow per uplink: no slow-down.
    inorder = _run(topologies.leaf_spine(2, 1, 3, bandwidth=B, oversubscription=3),
                   "allreduce", "ring", n, events=events)
    assert inorder.time_s == pytest.approx(2 * (p - 1) * (4 * L + (n / p) / B), rel=1e-9)


# -- faults ----------------------------------------------------------------------------------------
@EVENTS
def test_degraded_link_slows_ring_to_its_bandwidth(events):
    # ring(4), link gpu1-gpu2 at a quarter of B. Position 1 sends over it at every one of the
    # 2(p-1) steps and every other step waits for it: T = 2(p-1)(L + (n/p) / (B/4)), the
    # closed form with beta = 4/B.
    p, n = 4, 4 * 10 ** 6
    res = _run(topologies.ring(p), "allreduce", "ring", n, events=events,
               faults=[DegradedLink("gpu1", "gpu2", 0.25)])
    assert res.time_s == pytest.approx(2 * (p - 1) * (L + (n / p) * 4 / B), rel=1e-9)
    assert res.time_s == pytest.approx(closed_form("allreduce", "ring", p, n, L, 4 / B), rel=1e-9)


@EVENTS
def test_removed_link_reroutes(events):
    # ring(4) without gpu1-gpu2: 1 -> 2 goes 1 -> 0 -> 3 -> 2 (3 links). Those channels
    # carry no other ring flow (the others use 0->1, 2->3, 3->0), so position 1's chain sets
    # the pace at alpha = 3L: T = 2(p-1)(3L + (n/p)/B).
    p, n = 4, 4 * 10 ** 6
    G = topologies.ring(p)
    res = _run(G, "allreduce", "ring", n, events=events, faults=[RemovedLink("gpu1", "gpu2")])
    assert res.time_s == pytest.approx(2 * (p - 1) * (3 * L + (n / p) / B), rel=1e-9)
    used = {(l.u, l.v): l.bytes for l in res.links}
    assert ("gpu1", "gpu2") not in used
    # 1 -> 0 carries only the re-routed flow: 2(p-1) segments of n/p.
    assert used[("gpu1", "gpu0")] == 2 * (p - 1) * n // p
    assert G.has_edge("gpu1", "gpu2")                  # the caller's graph is untouched


def test_partition_is_a_simulation_error():
    G = topologies.ring(4)
    with pytest.raises(SimulationError) as e:
        run_collective(G, "allreduce", "ring", 100,
                       faults=[RemovedLink("gpu0", "gpu1"), RemovedLink("gpu2", "gpu3")])
    assert "RemovedLink('gpu2', 'gpu3') partitions the cluster into 2 parts" in str(e.value)


@EVENTS
@pytest.mark.parametrize("c", [1, 3])
def test_straggler_delays_ring_by_exactly_its_delay(c, events):
    # p*c | n: every chain of the ring is equally long (T0), so a rank that starts d late
    # delays the path through its own chain by d and nothing else: T = T0 + d.
    p, n, d = 5, 5 * 3 * 10 ** 5, 0.002
    G = topologies.ring(p)
    base = _run(G, "allreduce", "ring", n, chunks=c, events=events)
    late = _run(G, "allreduce", "ring", n, chunks=c, events=events, faults=[Straggler(2, d)])
    assert late.time_s == pytest.approx(base.time_s + d, rel=1e-12)
    assert late.rank_start_s[2] == pytest.approx(d) and late.rank_start_s[0] == 0.0


@EVENTS
def test_timeline_in_the_order_of_ranks_beyond_64(events):
    # Results list ranks in the caller's order; with >= 64 ranks the engine maps them through
    # a sorted index. Reversed ranks, rank 69 late by d: its entry is the first one.
    p, d = 70, 1e-3
    ranks = list(range(p))[::-1]
    res = _run(topologies.ring(p), "allreduce", "ring", p * 1000, ranks=ranks, events=events,
               faults=[Straggler(69, d)])
    assert res.ranks == tuple(ranks)
    assert res.rank_start_s[0] == pytest.approx(d) and max(res.rank_start_s[1:]) == 0.0
    assert min(res.rank_finish_s) > d


# -- invariants on congested topologies -----------------------------------------------------------
CONGESTED = {
    "fat_tree4": lambda: topologies.fat_tree(4),
    "leaf_spine_3to1": lambda: topologies.leaf_spine(4, 2, 4, oversubscription=3),
    "torus4x4": lambda: topologies.torus((4, 4)),
    "dgx1_v100": topologies.dgx1_v100,
    "dgx_a100x2": lambda: topologies.cluster("dgx_a100", 2),
}
CASES = [("allreduce", "ring"), ("allreduce", "tree"), ("allreduce", "rhd"),
         ("allreduce", "direct"), ("alltoall", "direct"), ("broadcast", "tree"),
         ("allreduce", "qsgd_scatter_reduce_allgather")]


def _routes(G, sched):
    """{(src, dst): (alpha s, beta s/byte)} of the routes of the schedule's GPU pairs."""
    router, nodes = topologies.Router(G), topologies.gpus(G)
    out = {}
    for s, d in set(zip(sched.src.tolist(), sched.dst.tolist())):
        if s != d:
            ch = router.channels(nodes[s], nodes[d])
            out[s, d] = (sum(G.edges[u, v]["latency"] for u, v in ch),
                         1 / min(G.edges[u, v]["bandwidth"] for u, v in ch))
    return out


@pytest.mark.parametrize("topo", sorted(CONGESTED))
@pytest.mark.parametrize("op, alg", CASES)
def test_invariants_on_congested_topologies(topo, op, alg):
    G = CONGESTED[topo]()
    p = len(topologies.gpus(G))
    n, c = 3 * 2 ** 20 + 5, 2
    pb = [40000 + 1000 * (j % 5) for j in range(p)] if alg.startswith("qsgd") else None
    sched = build_schedule(op, alg, p, n, chunks=c, graph=G, payload_bytes=pb)
    res = simulate(G, sched)
    # Every byte sent is received.
    assert res.bytes_sent == res.bytes_received == sched.total_bytes
    assert res.flows == int((sched.src != sched.dst).sum())
    # Per-channel bytes are the schedule's bytes along the router's routes.
    router, nodes = topologies.Router(G), topologies.gpus(G)
    want: dict = {}
    for s, d, b in zip(sched.src.tolist(), sched.dst.tolist(), sched.size.tolist()):
        if s != d and b:
            for ch in router.channels(nodes[s], nodes[d]):
                want[ch] = want.get(ch, 0) + b
    assert {(l.u, l.v): l.bytes for l in res.links} == want
    # No channel carries more than its capacity: over its busy time, and at any instant
    # (the engine's own peak, before CollectiveResult clips it to 1).
    for l in res.links:
        assert l.bytes <= l.capacity * l.busy_s * (1 + 1e-9), l
        assert l.peak_utilization <= 1.0
    # Contention and slower routes only add time: the closed form with the fastest route's
    # alpha and beta is a lower bound. (The slowest route's is not, in general: a tree or rhd
    # message need not cross it; for the ring at c=1 it is, see the next test.)
    routes = _routes(G, sched).values()
    a_min, b_min = min(a for a, _ in routes), min(b for _, b in routes)
    lower = closed_form(op, alg, p, n, a_min, b_min, chunks=c, payload_bytes=pb)
    assert res.time_s >= lower * (1 - 1e-12)


@pytest.mark.parametrize("topo", sorted(CONGESTED))
def test_peak_utilization_unclipped(topo):
    # White box: run the engine's process directly and read its raw per-channel peaks.
    G = CONGESTED[topo]()
    sched = build_schedule("allreduce", "direct", len(topologies.gpus(G)), 10 ** 6)
    run = _Run(_Network(G, sched), sched, np.zeros(len(sched)))
    env = simpy.Environment()
    env.process(run.process(env))
    env.run()
    assert run.ch_peak.max() <= 1 + 1e-9
    assert run.ch_peak.max() >= 1 - 1e-9           # all-to-all saturates some channel


@pytest.mark.parametrize("topo", sorted(CONGESTED))
def test_ring_is_no_faster_than_its_slowest_route(topo):
    # Each position sends its 2(p-1) messages of n/p bytes (p | n) to its successor one after
    # the other, each after the previous one arrived, so T >= 2(p-1)(a + n/p b) with the
    # alpha and beta of every position's route, the slowest one included.
    G = CONGESTED[topo]()
    p = len(topologies.gpus(G))
    n = p * 2 ** 18
    sched = build_schedule("allreduce", "ring", p, n)
    res = simulate(G, sched)
    slowest = max(2 * (p - 1) * (a + n / p * b) for a, b in _routes(G, sched).values())
    assert res.time_s >= slowest * (1 - 1e-12)


# -- an independent reference: every rate recomputed at every event ------------------------------
def _reference(G, sched, delays=None):
    """Makespan and per-transfer arrival times from a naive event loop (no fast paths);
    ``delays``: rank -> seconds before which it sends nothing (a Straggler)."""
    router, nodes = topologies.Router(G), topologies.gpus(G)
    chan_id: dict = {}
    routes, lat = [], []
    for s, d in zip(sched.src.tolist(), sched.dst.tolist()):
        ch = router.channels(nodes[s], nodes[d]) if s != d else ()
        routes.append([chan_id.setdefault(c, len(chan_id)) for c in ch])
        lat.append(sum(G.edges[u, v]["latency"] for u, v in ch))
    cap = np.array([G.edges[u, v]["bandwidth"] for u, v in chan_id], dtype=float)
    n = len(sched)
    earliest = np.array([(delays or {}).get(r, 0.0) for r in sched.src.tolist()])
    waiting = np.diff(sched.dep_ptr).copy()
    dependants = [[] for _ in range(n)]
    for i in range(n):
        for j in sched.deps_of(i).tolist():
            dependants[j].append(i)
    start, arrive = np.full(n, np.nan), np.full(n, np.nan)
    after = sched.after.tolist()
    queued = [[] for _ in range(n)]
    for i, a in enumerate(after):
        if a >= 0:
            queued[a].append(i)
    ready, left = np.full(n, np.nan), np.full(n, np.nan)
    events = []     # (time, kind, i): kind 0 = arrival, 1 = start

    def data_ready(k, t):
        ready[k] = max(t, earliest[k]) + sched.compute_s[k]
        if after[k] < 0 or not np.isnan(left[after[k]]):
            heapq.heappush(events, (ready[k], 1, k))

    def gone(i, t):
        left[i] = t
        for k in queued[i]:
            if not np.isnan(ready[k]):
                heapq.heappush(events, (max(ready[k], t), 1, k))

    for i in range(n):
        if waiting[i] == 0:
            data_ready(i, 0.0)
    active: dict = {}                                             # i -> bytes left
    t = 0.0
    while events or active:
        ids = sorted(active)
        if ids:
            f = np.array([k for k, i in enumerate(ids) for _ in routes[i]], dtype=np.int64)
            c = np.array([x for i in ids for x in routes[i]], dtype=np.int64)
            rate = max_min_rates(f, c, cap, len(ids))
            dt_fin = min(active[i] / r for i, r in zip(ids, rate))
        else:
            dt_fin = math.inf
        t_next = min(events[0][0] if events else math.inf, t + dt_fin)
        for i, r in zip(ids, rate if ids else []):
            active[i] -= r * (t_next - t)
            if active[i] <= 1e-9 * sched.size[i]:
                del active[i]
                heapq.heappush(events, (t_next + lat[i], 0, i))
                gone(i, t_next)
        t = t_next
        while events and events[0][0] <= t * (1 + 1e-15):
            _, kind, i = heapq.heappop(events)
            if kind == 0:
                arrive[i] = t
                for k in dependants[i]:
                    waiting[k] -= 1
                    if waiting[k] == 0:
                        data_ready(k, t)
            else:
                start[i] = t
                if routes[i] and sched.size[i]:
                    active[i] = float(sched.size[i])
                else:
                    heapq.heappush(events, (t + lat[i], 0, i))
                    gone(i, t)
    return float(arrive.max()), arrive


@pytest.mark.parametrize("topo, op, alg, c, late", [
    ("fat_tree4", "allreduce", "ring", 2, None),
    ("fat_tree4", "allreduce", "ring", 1, (5, 3e-5)),
    ("leaf_spine_3to1", "allreduce", "rhd", 1, None),
    ("torus4x4", "allreduce", "tree", 3, (0, 1e-5)),
    ("dgx1_v100", "alltoall", "direct", 1, None),
    ("dgx_a100x2", "allreduce", "hierarchical", 2, None),
    ("leaf_spine_3to1", "allreduce", "qsgd_scatter_reduce_allgather", 2, None),
])
def test_engine_matches_a_naive_reference(topo, op, alg, c, late):
    # The engine skips rate recomputation when flows start or end on channels nobody else
    # uses; a loop that recomputes every rate at every event must agree.
    G = CONGESTED[topo]()
    p = len(topologies.gpus(G))
    pb = [30000 + 4000 * (j % 7) for j in range(p)] if alg.startswith("qsgd") else None
    sched = build_schedule(op, alg, p, 2 ** 20 + 3, chunks=c, graph=G, payload_bytes=pb)
    makespan, arrive = _reference(G, sched, dict([late]) if late else None)
    finish = np.zeros(p)
    np.maximum.at(finish, sched.src, arrive)
    np.maximum.at(finish, sched.dst, arrive)
    for events in (False, True):
        res = simulate(G, sched, faults=[Straggler(*late)] if late else (),
                       _force_events=events)
        assert res.time_s == pytest.approx(makespan, rel=1e-9)
        assert np.allclose(res.rank_finish_s, finish, rtol=1e-9, atol=0)


@pytest.mark.parametrize("topo, c", [("leaf_spine_3to1", 1), ("fat_tree4", 3), ("torus4x4", 2)])
def test_queued_connections_match_the_naive_reference(topo, c):
    # Pipelined rings whose connections queue their messages (Transfer.after) on congested
    # fabrics, with per-step work that overlaps the message ahead.
    from emulator.collectives._builder import Builder
    from emulator.collectives.ring import ring_pass, segment_chunks

    G = CONGESTED[topo]()
    p = len(topologies.gpus(G))
    b = Builder()
    order = list(range(p))[::-1] if topo == "torus4x4" else list(range(p))
    ring_pass(b, order, segment_chunks(2 ** 20 + 3, p, c), 2 * (p - 1), -1, "x",
              hop_compute=np.full(p, 2e-6), start_compute=1e-6, ordered=False)
    ring_pass(b, [0, p // 2, 1, p // 2 + 1], segment_chunks(2 ** 19, 4, c), 3, 0, "y",
              ordered=False)
    sched = b.build(tuple(range(p)), "custom", "queued", 2 ** 20)
    assert (sched.after >= 0).sum() > len(sched) // 2
    makespan, _ = _reference(G, sched)
    for events in (False, True):
        res = simulate(G, sched, _force_events=events)
        assert res.time_s == pytest.approx(makespan, rel=1e-9)


# -- determinism -----------------------------------------------------------------------------------
@pytest.mark.parametrize("topo", ["fat_tree4", "dgx_a100x2"])
def test_two_runs_are_identical(topo):
    G = CONGESTED[topo]()
    kw = dict(chunks=2, faults=[Straggler(3, 1e-5), DegradedLink(*next(iter(G.edges)), 0.5)])
    a = run_collective(G, "allreduce", "tree", 10 ** 6 + 1, **kw).to_dict()
    b = run_collective(CONGESTED[topo](), "allreduce", "tree", 10 ** 6 + 1, **kw).to_dict()
    assert a == b                                   # floats compared exactly


# -- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, kwargs, exc, words", [
    (("allreduce", "bogus", 100), {}, ConfigError, "algorithm='bogus' is not known"),
    (("scan", "ring", 100), {}, ConfigError, "op='scan' is not known"),
    (("allreduce", "ring", 0), {}, ConfigError, "nbytes=0 must be an integer number of bytes"),
    (("allreduce", "ring", -8), {}, ConfigError, "nbytes=-8"),
    (("allreduce", "ring", 100), {"ranks": [0, 9]}, ConfigError,
     "ranks [9] are not in the graph 'switch:4'"),
    (("allreduce", "ring", 100), {"faults": ["slow"]}, ConfigError,
     "faults: 'slow' is not an emulator.Fault"),
    (("allreduce", "ring", 100), {"faults": [DegradedLink("gpu0", "gpu1", 0.5)]}, ConfigError,
     "DegradedLink: there is no link ('gpu0', 'gpu1')"),
    (("allreduce", "ring", 100), {"faults": [RemovedLink("gpu0", "gpu9")]}, ConfigError,
     "RemovedLink: there is no link ('gpu0', 'gpu9')"),
    (("allreduce", "ring", 100), {"ranks": [0, 1], "faults": [Straggler(3, 1.0)]}, ConfigError,
     "Straggler: rank 3 does not take part"),
])
def test_bad_input(args, kwargs, exc, words):
    with pytest.raises(exc) as e:
        run_collective(topologies.switch(4), *args, **kwargs)
    assert words in str(e.value)


def test_schedule_ranks_not_in_topology():
    sched = build_schedule("allreduce", "ring", 6, 600)
    with pytest.raises(ConfigError) as e:
        simulate(topologies.switch(4), sched)
    assert "ranks [4, 5] are not in the topology 'switch:4' (4 GPUs, ranks 0..3)" in str(e.value)
    with pytest.raises(ConfigError, match="schedule='ring' must be an emulator.Schedule"):
        simulate(topologies.switch(4), "ring")


def test_partitioned_graph():
    G = topologies.switch(4)
    G.remove_edge("gpu3", "sw0")
    with pytest.raises(topologies.TopologyError) as e:
        run_collective(G, "allreduce", "ring", 100)
    assert "not connected" in str(e.value) and "gpu3" in str(e.value)


@pytest.mark.parametrize("make, words", [
    (lambda: DegradedLink("a", "b", 0), "DegradedLink: factor=0 must be in (0, 1]"),
    (lambda: DegradedLink("a", "b", 1.5), "factor=1.5"),
    (lambda: DegradedLink("a", "b", True), "factor=True"),
    (lambda: DegradedLink("a", "b", "half"), "factor='half'"),
    (lambda: Straggler(-1, 1.0), "Straggler: rank=-1 must be an int >= 0"),
    (lambda: Straggler("r1", 1.0), "rank='r1'"),
    (lambda: Straggler(0, -0.5), "Straggler: delay_s=-0.5 must be a finite number of seconds"),
    (lambda: Straggler(0, float("inf")), "delay_s=inf"),
    (lambda: Straggler(0, float("nan")), "delay_s=nan"),
])
def test_bad_fault_fields(make, words):
    with pytest.raises(ConfigError) as e:
        make()
    assert words in str(e.value)


@pytest.mark.slow
@EVENTS
def test_fast_enough_for_1024_gpus(events):
    # The flow-level engine's purpose: a 1024-GPU ring allreduce (2 093 056 transfers) in the
    # order of a second. Generous bound for 2 shared cores; exact against the closed form.
    import time
    G = topologies.ring(1024)
    t0 = time.perf_counter()
    res = _run(G, "allreduce", "ring", 2 ** 30, events=events)
    elapsed = time.perf_counter() - t0
    assert res.time_s == pytest.approx(closed_form("allreduce", "ring", 1024, 2 ** 30, L, 1 / B),
                                       rel=1e-9)
    assert elapsed < 15.0
