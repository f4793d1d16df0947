"""Schedules as pure data (no engine): transfer counts, bytes, dependencies, chunking, payloads,
and the validation errors of Transfer, Schedule and build_schedule.

Byte totals are derived once here and reused below. With segments ``split(n, p)`` (sizes
summing to n):

- ring allreduce: position r sends the 2(p-1) segments r-1, r-2, ..., r-2(p-1) (mod p), i.e.
  every segment twice except r and r+1: 2n - seg[r] - seg[r+1] bytes, 2(p-1) n in all;
  2(p-1)/p n per rank when p divides n.
- ring reduce-scatter / allgather: p-1 segments per rank, every segment but one:
  n - seg[.] per rank, (p-1) n in all.
- every allreduce (ring, tree, rhd, direct, hierarchical, parameter server) moves 2(p-1) n
  bytes in all: tree, 2 trees x (p-1) edges x (up + down) x its half; rhd, sum over rounds of
  d n (d = q/2, ..., 1, twice) = 2(q-1) n plus 2(p-q) n for the pre/post messages; direct,
  (p-1) n to the owners and (p-1) n back; hierarchical, 2 H (g-1) n inside the machines plus
  2 (H-1) n along the rails = 2(p-1) n; parameter server, (p-1) n in and (p-1) n out.
"""
import numpy as np
import pytest

import emulator
import topologies
from emulator import ConfigError, Schedule, ScheduleError, Transfer, build_schedule
from emulator.collectives import ALGORITHMS, TEXTBOOK_ALGORITHMS, busbw_factor, split
from tests.emulator.test_closed_form import _box

ALLREDUCE_PLAIN = ["ring", "tree", "rhd", "direct", "parameter_server"]


# g GPUs on one switch, each with its own NIC (a rail-friendly box for hierarchical)
_machine = _box


def _per_rank(s: Schedule, field: str) -> dict:
    """Network bytes sent (field='src') or received (field='dst') by each rank."""
    ranks = getattr(s, field)
    out = dict.fromkeys(s.ranks, 0)
    for r, b in zip(ranks.tolist(), s.size.tolist()):
        out[r] += b
    return out


def _network(s: Schedule) -> int:
    return int((s.src != s.dst).sum())


# -- counts and bytes ----------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 5, 8])
@pytest.mark.parametrize("c", [1, 3])
def test_ring_allreduce_counts_and_bytes(p, c):
    n = 1000 * p * c                    # p*c divides n: every chunk is n/(p c)
    s = build_schedule("allreduce", "ring", p, n, chunks=c)
    assert len(s) == 2 * (p - 1) * p * c
    assert set(s.size.tolist()) == {n // (p * c)}
    # 2(p-1)/p * n per rank (Patarasuk & Yuan's bandwidth optimality).
    assert _per_rank(s, "src") == dict.fromkeys(range(p), 2 * (p - 1) * n // p)
    assert _per_rank(s, "dst") == dict.fromkeys(range(p), 2 * (p - 1) * n // p)
    # Each position sends only to the next one.
    assert np.array_equal(s.dst, (s.src + 1) % p)


@pytest.mark.parametrize("p", [3, 7])
def test_ring_allreduce_uneven_bytes(p):
    n = 10 * p + 4                      # segments: 4 of 11 bytes, the rest 10
    seg = split(n, p)
    s = build_schedule("allreduce", "ring", p, n)
    want = {r: 2 * n - int(seg[r]) - int(seg[(r + 1) % p]) for r in range(p)}
    assert _per_rank(s, "src") == want
    assert s.total_bytes == 2 * (p - 1) * n


@pytest.mark.parametrize("op", ["reduce_scatter", "allgather"])
def test_ring_half_bytes(op):
    p, n = 4, 4003                      # segments 1001, 1001, 1001, 1000
    s = build_schedule(op, "ring", p, n, chunks=2)
    assert len(s) == (p - 1) * p * 2
    assert s.total_bytes == (p - 1) * n
    seg = split(n, p)
    sent = _per_rank(s, "src")
    # Each rank forwards every segment but one: n - (a segment) bytes.
    assert all(n - sent[r] in seg.tolist() for r in range(p))
    assert s.tags == (op,)


@pytest.mark.parametrize("algorithm", ALLREDUCE_PLAIN)
@pytest.mark.parametrize("p", [2, 5, 8])
def test_every_allreduce_moves_2_p_minus_1_n(algorithm, p):
    n = 12345
    s = build_schedule("allreduce", algorithm, p, n)
    assert s.total_bytes == 2 * (p - 1) * n


def test_hierarchical_bytes_and_phases():
    g, H, n = 4, 3, 10 ** 6 + 1
    G = topologies.cluster(_machine(g), nodes=H, fabric="rail")
    s = build_schedule("allreduce", "hierarchical", g * H, n, graph=G)
    assert s.total_bytes == 2 * (g * H - 1) * n
    tag = np.array(s.tags)[s.tag_code]
    host = np.array([G.nodes[v]["host"] for v in topologies.gpus(G)])
    intra = host[s.src] == host[s.dst]
    # Reduce-scatter and allgather stay inside the machines: (g-1) n each per machine.
    assert s.size[intra].sum() == 2 * H * (g - 1) * n
    assert set(tag[intra]) == {"intra_reduce_scatter", "intra_allgather"}
    # The rail phase crosses machines only between GPUs of the same local index.
    assert np.array_equal(s.src[~intra] % g, s.dst[~intra] % g)
    assert s.size[~intra].sum() == 2 * (H - 1) * n


def test_tree_counts():
    p, c, n = 6, 4, 8000
    s = build_schedule("allreduce", "tree", p, n, chunks=c)
    # 2 trees, p-1 edges each, one reduce and one broadcast message per edge, c chunks each.
    assert len(s) == 2 * (p - 1) * 2 * c
    assert sorted(s.tags) == ["broadcast", "reduce"]
    # Each tree carries half of n; in each tree every edge carries it up once and down once.
    assert s.total_bytes == 2 * (p - 1) * n


@pytest.mark.parametrize("p", [2, 3, 6, 8, 13])
def test_broadcasts_reach_everyone_once(p):
    n, c = 999, 3
    for alg in ("ring", "tree"):
        s = build_schedule("broadcast", alg, p, n, chunks=c)
        assert len(s) == (p - 1) * c
        # Every rank but the root receives exactly n bytes.
        assert _per_rank(s, "dst") == {r: (0 if r == 0 else n) for r in range(p)}


def test_binomial_children_order():
    # Position x sends to x + 2**j for j below its lowest set bit, largest subtree first:
    # 0 -> 4, 2, 1; 2 -> 3; 4 -> 6, 5; 6 -> 7 (MPICH's binomial tree on 8 ranks).
    from emulator.collectives.tree import binomial
    assert binomial(8) == [[4, 2, 1], [], [3], [], [6, 5], [], [7], []]
    assert binomial(6) == [[4, 2, 1], [], [3], [], [5], []]


@pytest.mark.parametrize("p", [4, 6, 8])
def test_rhd_rounds(p):
    n = 4096
    s = build_schedule("allreduce", "rhd", p, n)
    q = 1 << (p.bit_length() - 1)
    rounds = 2 * (q.bit_length() - 1)
    # q ranks exchange in every round, both ways; p - q extra ranks send before and get after.
    assert len(s) == rounds * q + 2 * (p - q)
    if p == q:
        # Every rank sends n/2 + n/4 + ... + n/p twice: 2(p-1)/p n.
        assert _per_rank(s, "src") == dict.fromkeys(range(p), 2 * (p - 1) * n // p)


def test_direct_and_alltoall_bytes():
    p, n = 5, 1003                       # segments 201, 201, 201, 200, 200
    seg = split(n, p)
    a2a = build_schedule("alltoall", "direct", p, n)
    assert len(a2a) == p * (p - 1)
    assert _per_rank(a2a, "dst") == {d: (p - 1) * int(seg[d]) for d in range(p)}
    ag = build_schedule("allgather", "direct", p, n)
    assert _per_rank(ag, "src") == {r: (p - 1) * int(seg[r]) for r in range(p)}
    ar = build_schedule("allreduce", "direct", p, n)
    # p (p-1) messages each way plus one local reduction per owner (0 bytes, src == dst).
    local = ar.src == ar.dst
    assert local.sum() == p and ar.size[local].sum() == 0 and len(ar) == 2 * p * (p - 1) + p
    ps = build_schedule("allreduce", "parameter_server", p, n)
    assert _per_rank(ps, "dst")[0] == (p - 1) * n and _per_rank(ps, "src")[0] == (p - 1) * n


# -- dependencies ------------------------------------------------------------------------------
def _all_schedules():
    G = topologies.cluster(_machine(2), nodes=3, fabric="rail")
    for (op, alg) in sorted(TEXTBOOK_ALGORITHMS):
        for p in (2, 5, 6):
            kw = {}
            if alg.startswith("qsgd"):
                kw["payload_bytes"] = [100 + 7 * j for j in range(p)]
            if alg == "hierarchical":
                if p != 6:
                    continue
                kw["graph"] = G
            yield build_schedule(op, alg, p, 1001, chunks=2, **kw)


def test_dependencies_point_backwards_and_touch_the_sender():
    for s in _all_schedules():
        owner = np.repeat(np.arange(len(s)), np.diff(s.dep_ptr))
        assert np.all(s.dep_idx < owner), s
        # A dependency is data that reached this transfer's sender, the same connection's
        # previous message, or (rhd's rendezvous, hierarchical's last send) one of the two ranks.
        mine = np.stack([s.src[owner], s.dst[owner]], axis=1)
        theirs = np.stack([s.src[s.dep_idx], s.dst[s.dep_idx]], axis=1)
        touch = (theirs[:, :, None] == mine[:, None, :]).any(axis=(1, 2))
        assert touch.all(), s


def test_ring_allreduce_dependencies_by_hand():
    # p=3, c=1: transfer (k, r) has id 3k + r; it waits for the data (k-1, r-1) and for its
    # connection's previous message (k-1, r). Step 0 waits for nothing.
    s = build_schedule("allreduce", "ring", 3, 3)
    deps = {t.id: set(t.deps) for t in s.transfers}
    for k in range(4):
        for r in range(3):
            want = set() if k == 0 else {3 * (k - 1) + (r - 1) % 3, 3 * (k - 1) + r}
            assert deps[3 * k + r] == want
    # Segment sent at step k by position r: (r - k - 1) mod 3, one byte each.
    assert [t.tag for t in s.transfers[:6]] == ["reduce_scatter"] * 6
    assert [t.tag for t in s.transfers[6:]] == ["allgather"] * 6


@pytest.mark.parametrize("key", sorted(TEXTBOOK_ALGORITHMS))
def test_chunking_multiplies_transfers(key):
    op, alg = key
    p, n = 6, 6 * 1000
    kw = {"payload_bytes": [500 + j for j in range(p)]} if alg.startswith("qsgd") else {}
    if alg == "hierarchical":
        kw["graph"] = topologies.cluster(_machine(2), nodes=3, fabric="rail")
    one = build_schedule(op, alg, p, n, chunks=1, **kw)
    four = build_schedule(op, alg, p, n, chunks=4, **kw)
    assert four.total_bytes == one.total_bytes
    assert four.chunks == 4 and one.chunks == 1
    if alg in ("direct", "parameter_server"):
        assert len(four) == len(one)            # one-shot schedules ignore chunks
    elif alg == "qsgd_scatter_reduce_allgather":
        # The scatter is one message per pair; only the ring all-gather is chunked.
        assert _network(four) - _network(one) == 3 * p * (p - 1)
    else:
        assert _network(four) == 4 * _network(one)


# -- QSGD transports ---------------------------------------------------------------------------
def test_qsgd_allgather_honours_payloads():
    p = 5
    pb = [1000, 10, 0, 333, 77]
    s = build_schedule("allreduce", "qsgd_allgather", p, 10 ** 6, payload_bytes=pb)
    # Every payload travels p-1 hops; rank r receives every payload but its own.
    assert s.total_bytes == (p - 1) * sum(pb)
    assert _per_rank(s, "dst") == {r: sum(pb) - pb[r] for r in range(p)}
    # The vector size plays no part in the bytes moved.
    s2 = build_schedule("allreduce", "qsgd_allgather", p, 8, payload_bytes=pb)
    assert np.array_equal(s.size, s2.size)


def test_qsgd_scatter_reduce_allgather_honours_payloads():
    p = 4
    pb = [400, 300, 200, 100]
    s = build_schedule("allreduce", "qsgd_scatter_reduce_allgather", p, 10 ** 6, payload_bytes=pb)
    tag = np.array(s.tags)[s.tag_code]
    scatter = tag == "scatter"
    # Owner j receives chunk j from each of the p-1 others, then the owners' chunks go around.
    got = dict.fromkeys(range(p), 0)
    for d, b in zip(s.dst[scatter].tolist(), s.size[scatter].tolist()):
        got[d] += b
    assert got == {j: (p - 1) * pb[j] for j in range(p)}
    assert s.size[tag == "allgather"].sum() == (p - 1) * sum(pb)


def test_qsgd_scalar_payload_is_per_rank():
    s = build_schedule("allreduce", "qsgd_allgather", 4, 100, payload_bytes=50)
    assert s.total_bytes == 3 * 4 * 50


@pytest.mark.parametrize("alg", ["qsgd_allgather", "qsgd_scatter_reduce_allgather"])
@pytest.mark.parametrize("payload, words", [
    (None, "payload_bytes is required"),
    ([1, 2, 3], "has 3 entries, expected one per rank (4)"),
    ([1, 2, -3, 4], "must be integers >= 0"),
    ([1, 2, 3.5, 4], "must be integers >= 0"),
])
def test_qsgd_payload_errors(alg, payload, words):
    with pytest.raises(ConfigError) as e:
        build_schedule("allreduce", alg, 4, 100, payload_bytes=payload)
    assert words in str(e.value) and alg in str(e.value)


# -- Transfer, Schedule and build_schedule validation ----------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    (dict(id=-1, src=0, dst=1, nbytes=1), "id=-1"),
    (dict(id=0, src=True, dst=1, nbytes=1), "src=True"),
    (dict(id=0, src=0, dst=1, nbytes=-5), "nbytes=-5"),
    (dict(id=0, src=0, dst=1, nbytes=1.5), "nbytes=1.5"),
    (dict(id=3, src=2, dst=2, nbytes=8), "local step (src == dst == 2) must carry 0 bytes"),
    (dict(id=0, src=0, dst=1, nbytes=1, deps=("a",)), "dependency 'a'"),
    (dict(id=0, src=0, dst=1, nbytes=1, tag=5), "tag=5"),
    (dict(id=0, src=0, dst=1, nbytes=1, compute_s=-1.0), "compute_s=-1.0"),
    (dict(id=0, src=0, dst=1, nbytes=1, compute_s=float("nan")), "compute_s=nan"),
])
def test_transfer_errors(kwargs, words):
    with pytest.raises(ScheduleError) as e:
        Transfer(**kwargs)
    assert words in str(e.value)


@pytest.mark.parametrize("transfers, ranks, words", [
    ([Transfer(0, 0, 1, 1), Transfer(0, 1, 0, 1)], (0, 1), "transfer id 0 appears twice"),
    ([Transfer(0, 0, 1, 1, deps=(7,))], (0, 1), "depends on unknown id 7"),
    ([Transfer(0, 0, 1, 1, deps=(1,)), Transfer(1, 1, 0, 1)], (0, 1), "not listed before it"),
    ([Transfer(0, 0, 1, 1, deps=(0,))], (0, 1), "not listed before it"),
    ([Transfer(0, 0, 5, 1)], (0, 1), "dst=5 is not one of the ranks"),
    ([Transfer(0, 0, 1, 1)], (0, 1, 1), "contain duplicates"),
    (["not a transfer"], (0, 1), "'not a transfer' is not a Transfer"),
])
def test_schedule_errors(transfers, ranks, words):
    with pytest.raises(ScheduleError) as e:
        Schedule(transfers, ranks, "custom", "hand", 1)
    assert words in str(e.value)


def test_schedule_from_arrays_errors():
    ok = dict(src=[0], dst=[1], size=[4], compute_s=[0.0], dep_ptr=[0, 0], dep_idx=[],
              tag_code=[0], tags=("x",), ranks=(0, 1), op="o", algorithm="a", nbytes=4)
    Schedule.from_arrays(**ok)
    with pytest.raises(ScheduleError, match="dep_ptr is not a CSR pointer"):
        Schedule.from_arrays(**{**ok, "dep_ptr": [0, 1]})
    with pytest.raises(ScheduleError, match="size has 2 entries, src has 1"):
        Schedule.from_arrays(**{**ok, "size": [4, 4]})
    with pytest.raises(ScheduleError, match="nbytes=-4 < 0"):
        Schedule.from_arrays(**{**ok, "size": [-4]})
    with pytest.raises(ScheduleError, match="tag_code out of range"):
        Schedule.from_arrays(**{**ok, "tag_code": [3]})


def test_schedule_is_immutable_and_round_trips():
    s = build_schedule("allreduce", "ring", 3, 30)
    with pytest.raises(AttributeError, match="immutable"):
        s.nbytes = 5
    with pytest.raises(ValueError):
        s.size[0] = 99                      # read-only arrays
    again = Schedule(s.transfers, s.ranks, s.op, s.algorithm, s.nbytes)
    for f in ("src", "dst", "size", "dep_ptr", "dep_idx"):
        assert np.array_equal(getattr(again, f), getattr(s, f))


@pytest.mark.parametrize("args, kwargs, words", [
    (("gather", "ring", 4, 8), {}, "op='gather' is not known"),
    (("allreduce", "bogus", 4, 8), {}, "algorithm='bogus' is not known for op='allreduce'"),
    (("allgather", "tree", 4, 8), {}, "algorithm='tree' is not known for op='allgather'"),
    (("allreduce", "ring", 4, 0), {}, "nbytes=0 must be an integer number of bytes > 0"),
    (("allreduce", "ring", 4, 2.5), {}, "nbytes=2.5"),
    (("allreduce", "ring", 4, 8), {"chunks": 0}, "chunks=0 must be an integer >= 1"),
    (("allreduce", "ring", 0, 8), {}, "ranks=0 must be >= 1"),
    (("allreduce", "ring", [0, 1, 1], 8), {}, "ranks=[0, 1, 1] contains duplicates"),
    (("allreduce", "ring", [0, -1], 8), {}, "ranks: -1 must be a non-negative integer"),
    (("allreduce", "hierarchical", 4, 8), {}, "needs graph="),
])
def test_build_schedule_errors(args, kwargs, words):
    with pytest.raises(ConfigError) as e:
        build_schedule(*args, **kwargs)
    assert words in str(e.value)


def test_build_schedule_graph_errors():
    with pytest.raises(ConfigError, match=r"ranks \[4\] are not in the graph 'switch:4'"):
        build_schedule("allreduce", "ring", [0, 4], 8, graph=topologies.switch(4))
    with pytest.raises(ConfigError, match="has no 'host' attribute"):
        build_schedule("allreduce", "hierarchical", 4, 8, graph=topologies.switch(4))
    G = topologies.cluster(_machine(2), nodes=2, fabric="rail")
    with pytest.raises(ConfigError, match=r"different numbers of ranks \[1, 2\]"):
        build_schedule("allreduce", "hierarchical", [0, 1, 2], 8, graph=G)


def test_single_rank_schedules_are_empty():
    for (op, alg) in TEXTBOOK_ALGORITHMS:
        kw = {"payload_bytes": [9]} if alg.startswith("qsgd") else {}
        if alg == "hierarchical":
            kw["graph"] = topologies.cluster(_machine(1), nodes=1, fabric="rail")
        s = build_schedule(op, alg, 1, 100, **kw)
        assert s.total_bytes == 0 and _network(s) == 0, (op, alg)


def test_busbw_factor():
    # nccl-tests: allreduce 2(p-1)/p, allgather (p-1)/p, broadcast 1.
    assert busbw_factor("allreduce", 8) == 2 * 7 / 8
    assert busbw_factor("allgather", 4) == 3 / 4
    assert busbw_factor("broadcast", 16) == 1.0
    with pytest.raises(ConfigError, match="op='scan' has no busbw factor"):
        busbw_factor("scan", 4)
    with pytest.raises(ConfigError, match="p=0"):
        busbw_factor("allreduce", 0)


def test_exports():
    assert emulator.build_schedule is build_schedule
    assert emulator.ALGORITHMS is ALGORITHMS


def test_split_each_is_split_of_every_block():
    from emulator.collectives._schedule import split_each

    blocks = [0, 1, 7, 8, 1_000_003, 17]
    for parts in (1, 2, 3, 8):
        got = split_each(blocks, parts)
        assert got.shape == (parts, len(blocks))
        for j, n in enumerate(blocks):
            assert got[:, j].tolist() == split(n, parts).tolist()
            assert got[:, j].sum() == n and got[:, j].max() - got[:, j].min() <= 1
    with pytest.raises(ScheduleError, match="parts=0"):
        split(5, 0)
