"""The engine's symmetry reduction (emulator.symmetry) against the full engine: the same
times for every rank and the same use of every link, on random regular fabrics, with a
fallback wherever a fault or an irregular route breaks the shift."""
import dataclasses

import numpy as np
import pytest

import emulator
import topologies
from emulator import symmetry
from emulator.netpaths import Network

REL = 1e-9

MACHINES = ("dgx_a100", "dgx_h100", "rtx4090_box", "p4d")
FABRICS = ("rail", "leaf_spine", "fat_tree")
COLLECTIVES = (("allreduce", "nccl_ring"), ("allgather", "nccl_ring"),
               ("reduce_scatter", "nccl_ring"), ("alltoall", "nccl_p2p"),
               ("allreduce", "nccl_qsgd_allgather"),
               ("allreduce", "nccl_qsgd_scatter_reduce_allgather"),
               ("allreduce", "ring"), ("allgather", "direct"))


def _schedule(G, op, alg, nbytes, payload=None):
    p = len(topologies.gpus(G))
    kw = {"graph": G}
    if "qsgd" in alg:
        kw["payload_bytes"] = [payload or nbytes // 8] * p
    return emulator.build_schedule(op, alg, p, nbytes, **kw)


def _assert_same(full, red):
    assert red.time_s == pytest.approx(full.time_s, rel=REL)
    np.testing.assert_allclose(red.rank_start_s, full.rank_start_s, rtol=REL, atol=1e-18)
    np.testing.assert_allclose(red.rank_finish_s, full.rank_finish_s, rtol=REL, atol=1e-18)
    a = {(l.u, l.v): l for l in full.links}
    b = {(l.u, l.v): l for l in red.links}
    assert set(a) == set(b)
    for k, l in a.items():
        assert b[k].bytes == l.bytes
        assert b[k].busy_s == pytest.approx(l.busy_s, rel=REL, abs=1e-18)
        assert b[k].peak_utilization == pytest.approx(l.peak_utilization, rel=REL)
    assert (red.flows, red.bytes_sent, red.bytes_received, red.events) == \
        (full.flows, full.bytes_sent, full.bytes_received, full.events)


def _both(G, s, **kw):
    full = emulator.simulate(G, s, symmetry=False, _force_events=True, **kw)
    red = emulator.simulate(G, s, _force_events=True, **kw)
    assert full.copies == 1
    _assert_same(full, red)
    return red


def _cases(seed: int, n: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        machine = MACHINES[rng.integers(len(MACHINES))]
        fabric = FABRICS[rng.integers(len(FABRICS))]
        nodes = int(rng.choice([2, 4, 8]))
        op, alg = COLLECTIVES[rng.integers(len(COLLECTIVES))]
        nbytes = int(rng.choice([1 << 16, 1 << 20, 3 << 22]))
        yield f"cluster:{machine}x{nodes},fabric={fabric}", op, alg, nbytes


@pytest.mark.parametrize("seed", range(6))
def test_random_regular_fabrics_match_the_full_engine(seed):
    reduced = 0
    for spec, op, alg, nbytes in _cases(seed, 4):
        G = topologies.from_spec(spec)
        r = _both(G, _schedule(G, op, alg, nbytes))
        reduced += r.copies > 1
        if r.copies > 1:
            # a class holds copies transfers: the ranks split into that many equal blocks
            assert len(r.ranks) % r.copies == 0
    # 4 random cases per seed: the shift is no rare event on these fabrics
    assert reduced >= 1


@pytest.mark.parametrize("spec", ["cluster:dgx_h100x8,fabric=rail", "cluster:rtx4090_boxx8",
                                  "cluster:dgx_a100x8,fabric=leaf_spine"])
def test_rings_of_identical_machines_are_reduced(spec):
    G = topologies.from_spec(spec)
    r = _both(G, _schedule(G, "allreduce", "nccl_ring", 64 << 20))
    assert r.copies >= 2
    if "rail" in spec or "rtx" in spec:
        # one rail switch (one 25 GbE switch) for all 8 machines: one machine is one class
        assert r.copies == 8


def test_textbook_ring_on_a_switch_is_one_transfer_per_step():
    G = topologies.switch(8)
    s = emulator.build_schedule("allreduce", "ring", 8, 8_000_000)
    sym = symmetry.find(Network(G, s), s)
    assert sym.shift == 1 and sym.copies == 8 and len(sym.reps) * 8 == len(s)
    # every class has one transfer from each block of ranks
    for c in range(len(sym.reps)):
        members = np.flatnonzero(sym.class_of == c)
        assert sorted(s.src[members].tolist()) == list(range(8))
    _both(G, s)


def test_the_same_answer_in_the_approximate_mode():
    G = topologies.from_spec("cluster:dgx_h100x4,fabric=rail")
    s = _schedule(G, "allgather", "nccl_ring", 16 << 20)
    full = emulator.simulate(G, s, symmetry=False, exact=False)
    red = emulator.simulate(G, s, exact=False)
    assert red.copies == 4
    assert red.time_s == pytest.approx(full.time_s, rel=REL)


def test_a_straggler_or_a_degraded_link_falls_back_to_every_transfer():
    G = topologies.from_spec("cluster:dgx_h100x4,fabric=rail")
    s = _schedule(G, "allreduce", "nccl_ring", 16 << 20)
    slow = emulator.Straggler(3, 1e-4)
    r = _both(G, s, faults=[slow])
    assert r.copies == 1
    nic = next((u, v) for u, v in G.edges if str(u).startswith("n1.nic") and
               not str(v).startswith("n1."))
    r = _both(G, s, faults=[emulator.DegradedLink(*nic, 0.5)])
    # machine 1's NIC is slower than its images: no shift of fewer than 4 machines holds
    assert r.copies == 1


def test_uneven_bytes_break_the_symmetry():
    G = topologies.switch(4)
    s = emulator.build_schedule("allreduce", "ring", 4, 4_000_000)
    ts = [dataclasses.replace(t, nbytes=t.nbytes + (t.src == 2 and t.src != t.dst))
          for t in s.transfers]
    s2 = emulator.Schedule(ts, s.ranks, s.op, s.algorithm, s.nbytes)
    assert symmetry.find(Network(G, s2), s2) is None
    r = _both(G, s2)
    assert r.copies == 1


def test_trees_are_not_shifted():
    # NCCL's double binary tree puts each machine at a different place
    G = topologies.from_spec("cluster:dgx_a100x8,fabric=rail")
    s = _schedule(G, "allreduce", "nccl_tree", 1 << 20)
    assert symmetry.find(Network(G, s), s) is None


@pytest.mark.slow
def test_1024_gpus_match_the_full_engine():
    G = topologies.from_spec("cluster:dgx_h100x128,fabric=rail")
    r = _both(G, _schedule(G, "allgather", "nccl_ring", 4 << 20))
    assert r.copies >= 2


def test_symmetry_must_be_a_bool():
    G = topologies.switch(2)
    s = emulator.build_schedule("allreduce", "ring", 2, 1000)
    with pytest.raises(emulator.ConfigError, match="symmetry='yes' must be True or False"):
        emulator.simulate(G, s, symmetry="yes")
