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
