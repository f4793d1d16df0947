"""The contention-free pass against the event engine: same results where it applies, and it
declines (so the engine steps) wherever two flows would share a channel."""
import numpy as np
import pytest

import emulator
import topologies
from emulator.critical_path import contention_free
from emulator.engine import _Network, simulate

B, LAT = 1e9, 1e-6

CASES = [  # (spec, op, algorithm, nbytes, chunks, stragglers)
    ("ring:8", "allreduce", "ring", 10 ** 6 + 3, 3, ()),
    ("ring:8", "allreduce", "ring", 10 ** 6, 1, (emulator.Straggler(3, 2e-4),)),
    ("switch:16", "allreduce", "rhd", 10 ** 6 + 7, 1, ()),
    ("switch:16", "allgather", "ring", 10 ** 6, 2, ()),
    ("switch:16", "broadcast", "ring", 10 ** 6, 4, ()),
    ("fat_tree:k=4", "allreduce", "ring", 10 ** 7, 1, ()),
    ("cluster:dgx_a100x2", "allreduce", "ring", 10 ** 7, 2, ()),
    ("leaf_spine:leaves=4,spines=1,hosts=4", "reduce_scatter", "ring", 10 ** 7, 1, ()),
    ("switch:6", "allreduce", "qsgd_allgather", 10 ** 6, 1, ()),
]


def _pair(spec, op, algorithm, nbytes, chunks, faults):
    G = topologies.from_spec(spec)
    p = len(topologies.gpus(G))
    pb = [nbytes // 10 + 97 * r for r in range(p)] if algorithm.startswith("qsgd") else None
    sched = emulator.build_schedule(op, algorithm, p, nbytes, chunks=chunks, graph=G,
                                    payload_bytes=pb)
    return simulate(G, sched, faults=faults), simulate(G, sched, faults=faults, _force_events=True)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-c{c[4]}" for c in CASES])
def test_same_result_as_the_event_engine(case):
    fast, slow = _pair(*case)
    assert fast.events == 0 and slow.events > 0       # one took the pass, one stepped
    assert fast.time_s == pytest.approx(slow.time_s, rel=1e-12)
    assert np.allclose(fast.rank_start_s, slow.rank_start_s, rtol=1e-12, atol=0)
    assert np.allclose(fast.rank_finish_s, slow.rank_finish_s, rtol=1e-12, atol=0)
    assert (fast.flows, fast.bytes_sent, fast.bytes_received) == \
        (slow.flows, slow.bytes_sent, slow.bytes_received)
    a = {(l.u, l.v): l for l in fast.links}
    b = {(l.u, l.v): l for l in slow.links}
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].bytes == b[key].bytes
        assert a[key].busy_s == pytest.approx(b[key].busy_s, rel=1e-9)
        assert a[key].peak_utilization == pytest.approx(b[key].peak_utilization, rel=1e-12)


@pytest.mark.parametrize("spec, op, algorithm", [
    ("switch:16", "allreduce", "tree"),              # a parent sends to two children at once
    ("switch:8", "alltoall", "direct"),              # every sender fans out
    ("torus:4x4", "allreduce", "ring"),              # ring order crosses shared torus links
    ("cluster:dgx_a100x2", "allreduce", "hierarchical"),
    ("switch:6", "allreduce", "qsgd_scatter_reduce_allgather"),   # the scatter fans out
])
def test_declines_where_flows_share_a_channel(spec, op, algorithm):
    G = topologies.from_spec(spec)
    p = len(topologies.gpus(G))
    pb = [10 ** 5] * p if algorithm.startswith("qsgd") else None
    sched = emulator.build_schedule(op, algorithm, p, 10 ** 6, graph=G, payload_bytes=pb)
    assert contention_free(_Network(G, sched), sched, np.zeros(len(sched))) is None
    assert simulate(G, sched).events > 0             # so the engine stepped, sharing max-min


def _two_senders(second_start_s):
    """gpu0 and gpu1 both send 1 MB to gpu2 through one switch: they share sw -> gpu2."""
    G = topologies.switch(3, bandwidth=B, latency=LAT)
    sched = emulator.Schedule([
        emulator.Transfer(0, 0, 2, 10 ** 6),
        emulator.Transfer(1, 1, 1, 0, compute_s=second_start_s),   # delays the second send
        emulator.Transfer(2, 1, 2, 10 ** 6, deps=(1,)),
    ], ranks=(0, 1, 2), op="allreduce", algorithm="test", nbytes=10 ** 6)
    return G, sched


def test_overlap_on_one_shared_channel_is_detected_and_touching_is_not():
    # The first flow's last byte leaves gpu0 at 1 ms. Started before that, the second shares
    # the switch's channel to gpu2: the engine's max-min answer differs from the pass's.
    G, sched = _two_senders(0.5e-3)
    assert contention_free(_Network(G, sched), sched, np.zeros(3)) is None
    # A flow occupies every channel of its route from its first byte to its last byte
    # leaving; the second starting exactly when the first's last byte leaves shares nothing.
    G, sched = _two_senders(1e-3)
    times = contention_free(_Network(G, sched), sched, np.zeros(3))
    assert times is not None
    assert times["arrive_s"][2] == pytest.approx(1e-3 + 1e-3 + 2 * LAT, rel=1e-12)
    assert simulate(G, sched).time_s == pytest.approx(
        simulate(G, sched, _force_events=True).time_s, rel=1e-12)


def test_shared_time_is_what_max_min_gives():
    # Overlapping by half: alone for 0.5 ms (0.5 MB sent), then both at B/2 until the first
    # is done (0.5 MB more for it takes 1 ms), then the second alone: it has sent 0.5 MB,
    # 0.5 MB left at B: 0.5 ms. Last byte leaves at 2.0 ms, arrives 2 hops of latency later.
    G, sched = _two_senders(0.5e-3)
    assert simulate(G, sched).time_s == pytest.approx(2.0e-3 + 2 * LAT, rel=1e-9)


# -- the pass per wave (numpy) against the kernels ---------------------------------------------
def _random_schedule(rng, G, n=40, layered=False):
    """Random transfers on ``G``: local steps, zero-byte messages, queued connections
    (``after``), several dependencies; ``layered``: ring steps, each waiting for the last."""
    p = len(topologies.gpus(G))
    ts = []
    if layered:
        # a message waits for the one before it on its connection to arrive (a dependency),
        # to leave (``after``), or not at all (then they may overlap)
        order = rng.choice(["dep", "after", "none"])
        steps = int(rng.integers(2, 6))
        for k in range(steps):
            for r in range(p):
                data = ts[(k - 1) * p + (r - 1) % p].id if k else None
                conn = ts[(k - 1) * p + r].id if k else None
                deps = tuple(d for d in (data, conn if order == "dep" else None)
                             if d is not None)
                ts.append(emulator.Transfer(len(ts), r, (r + 1) % p,
                                            int(rng.integers(1, 10 ** 6)), deps=deps,
                                            after=conn if order == "after" else None))
        return emulator.Schedule(ts, tuple(range(p)), "allreduce", "test", 10 ** 6)
    for i in range(n):
        src = int(rng.integers(p))
        dst = src if rng.random() < 0.15 else int(rng.integers(p))
        size = 0 if src == dst or rng.random() < 0.1 else int(rng.integers(1, 10 ** 6))
        deps = tuple(sorted({int(d) for d in rng.integers(0, i, int(rng.integers(0, 4)))})) \
            if i else ()
        after = int(rng.integers(0, i)) if i and rng.random() < 0.3 else None
        ts.append(emulator.Transfer(i, src, dst, size, deps=deps, after=after,
                                    compute_s=float(rng.choice([0.0, 1e-5, 3e-4]))))
    return emulator.Schedule(ts, tuple(range(p)), "allreduce", "test", 10 ** 6)


def _both_paths(monkeypatch, G, sched, earliest):
    from emulator import critical_path

    net = _Network(G, sched)
    monkeypatch.setattr(critical_path, "compiled", lambda: False)   # as in a fresh process
    monkeypatch.setattr(critical_path, "ENTRIES", 100)
    monkeypatch.setattr(critical_path, "WIDE", 1)            # every schedule per wave
    waves = contention_free(net, sched, earliest)
    monkeypatch.setattr(critical_path, "WIDE", 10 ** 12)     # never: the kernels
    kernels = contention_free(net, sched, earliest)
    return waves, kernels


def test_the_pass_per_wave_is_the_kernels_to_the_bit(monkeypatch):
    from emulator import critical_path

    decided = []                                # what the numpy overlap check answered
    check = critical_path._overlap_in_index_order
    monkeypatch.setattr(critical_path, "_overlap_in_index_order",
                        lambda *a: decided.append(check(*a)) or decided[-1])
    rng = np.random.default_rng(7)
    seen = {True: 0, False: 0}
    for trial in range(450):
        G = topologies.from_spec(["ring:6", "switch:5", "fat_tree:k=4"][trial % 3])
        layered = trial % 3 == 0
        sched = _random_schedule(rng, G, layered=layered)
        late = rng.random(len(sched)) < (0.05 if layered else 0.2)   # stragglers
        earliest = np.where(late, rng.random(len(sched)) * 1e-3, 0.0)
        waves, kernels = _both_paths(monkeypatch, G, sched, earliest)
        assert (waves is None) == (kernels is None), trial
        seen[waves is None] += 1
        if kernels is not None:
            for key in kernels:
                assert np.array_equal(waves[key], kernels[key]), (trial, key)
    assert seen[True] and seen[False]          # both answers came up
    assert {True, False, None} <= set(decided)  # and the numpy check gave all three


def test_the_pass_per_wave_decides_a_ring_without_the_kernels(monkeypatch):
    from emulator import critical_path

    called = []
    monkeypatch.setattr(critical_path, "_any_overlap", lambda *a: called.append(a) or True)
    monkeypatch.setattr(critical_path, "_times", None)
    monkeypatch.setattr(critical_path, "compiled", lambda: False)   # as in a fresh process
    G = topologies.from_spec("fat_tree:k=16")
    sched = emulator.build_schedule("allreduce", "ring", 128, 10 ** 7, graph=G)
    assert len(sched) >= critical_path.WIDE * 2 * 127     # 254 waves of 128 transfers
    assert contention_free(_Network(G, sched), sched, np.zeros(len(sched))) is not None
    assert not called
    # two flows of one pair in one wave are left to the kernel, which is asked
    G = topologies.switch(3, bandwidth=B, latency=LAT)
    sched = emulator.Schedule([emulator.Transfer(0, 0, 2, 10 ** 6),
                               emulator.Transfer(1, 0, 2, 10 ** 6)], (0, 1, 2), "x", "y", 1)
    monkeypatch.setattr(critical_path, "WIDE", 1)
    assert contention_free(_Network(G, sched), sched, np.zeros(2)) is None and called


@pytest.mark.parametrize("seed", range(20))
def test_waves_are_maximal_runs_of_independent_transfers(seed):
    from emulator.critical_path import waves

    G = topologies.from_spec("switch:5")
    sched = _random_schedule(np.random.default_rng(seed), G, n=60)
    bounds = waves(sched.dep_ptr, sched.dep_idx, sched.after).tolist()
    assert bounds[0] == 0 and bounds[-1] == len(sched) and bounds == sorted(set(bounds))
    for a, b in zip(bounds, bounds[1:]):
        for i in range(a, b):
            waited = list(sched.deps_of(i)) + ([sched.after[i]] if sched.after[i] >= 0 else [])
            assert all(j < a for j in waited)
        if b < len(sched):                       # the next transfer waits on this wave
            waited = list(sched.deps_of(b)) + ([sched.after[b]] if sched.after[b] >= 0 else [])
            assert any(j >= a for j in waited)
    assert waves(sched.dep_ptr, sched.dep_idx, sched.after, most=1) is None or len(bounds) <= 2


def _one_pair(monkeypatch, transfers):
    """Transfers on 3 GPUs of a switch, checked per wave and by the kernels."""
    G = topologies.switch(4, bandwidth=B, latency=LAT)
    sched = emulator.Schedule(transfers, (0, 1, 2, 3), "x", "y", 1)
    return _both_paths(monkeypatch, G, sched, np.zeros(len(sched)))


def test_flows_out_of_start_order_are_sorted_before_comparing(monkeypatch):
    # On pair 0 -> 1 in index order: A at 0-10 us, B at 20-30 us, C at 5-15 us (in a later
    # wave than B). Neighbours in index order never overlap; sorted by start, A and C do.
    T = emulator.Transfer
    waves, kernels = _one_pair(monkeypatch, [
        T(0, 0, 1, 10_000), T(1, 2, 2, 0, compute_s=20e-6), T(2, 0, 1, 10_000, deps=(1,)),
        T(3, 3, 3, 0), T(4, 0, 1, 10_000, deps=(3,), compute_s=5e-6)])
    assert waves is None and kernels is None


def test_flows_of_one_pair_starting_together_overlap(monkeypatch):
    # A and B on pair 0 -> 1 both start at 0, in two waves: a tie, and they overlap.
    T = emulator.Transfer
    waves, kernels = _one_pair(monkeypatch, [
        T(0, 0, 1, 10_000), T(1, 2, 2, 0), T(2, 0, 1, 10_000, deps=(1,))])
    assert waves is None and kernels is None
    # one after the other (B waits 10 us, A's whole time on the wire): no overlap
    waves, kernels = _one_pair(monkeypatch, [
        T(0, 0, 1, 10_000), T(1, 2, 2, 0, compute_s=10e-6), T(2, 0, 1, 10_000, deps=(1,))])
    assert waves is not None and np.array_equal(waves["start_s"], kernels["start_s"])
    # a tie with a 1-byte flow, 1e-9 s long at 1e4 s: shorter than the float tolerance there,
    # so which one the kernel puts first decides; the check leaves it to the kernel
    waves, kernels = _one_pair(monkeypatch, [
        T(0, 0, 1, 10_000, compute_s=1e4), T(1, 2, 2, 0, compute_s=1e4),
        T(2, 0, 1, 1, deps=(1,))])
    assert waves is None and kernels is None


def test_compiled_kernels_take_over_from_the_pass_per_wave(monkeypatch):
    # Once numba is loaded the kernels cost nothing to start and stop at the first overlap.
    from emulator import critical_path

    def fail(*a):
        raise AssertionError("ran per wave")

    monkeypatch.setattr(critical_path, "compiled", lambda: True)
    monkeypatch.setattr(critical_path, "_times_by_wave", fail)
    G = topologies.from_spec("fat_tree:k=16")
    sched = emulator.build_schedule("allreduce", "ring", 128, 10 ** 7, graph=G)
    assert contention_free(_Network(G, sched), sched, np.zeros(len(sched))) is not None
