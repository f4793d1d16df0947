"""emulator.size_sweep: nccl-tests rows (sizes, counts, bandwidths) predicted by the engine."""
import math
import re

import pytest

import emulator
import topologies
from emulator.sweep import MAX_ROWS, nccl_size, sweep_sizes

P = 4
MB = 1 << 20


@pytest.fixture(scope="module")
def switch4():
    return topologies.from_spec(f"switch:{P}")


# (op, algorithm, busbw factor on p ranks: nccl-tests doc/PERFORMANCE.md)
OPS = [
    ("allreduce", "ring", lambda p: 2 * (p - 1) / p),
    ("reduce_scatter", "ring", lambda p: (p - 1) / p),
    ("allgather", "ring", lambda p: (p - 1) / p),
    ("alltoall", "direct", lambda p: (p - 1) / p),
    ("broadcast", "ring", lambda p: 1.0),
]


def test_sizes_follow_b_e_f():
    assert sweep_sizes(8, MB, 2) == [8 << i for i in range(18)]
    assert sweep_sizes(8, MB, 4) == [8 * 4 ** i for i in range(9)]
    assert sweep_sizes(5, 5) == [5]
    assert sweep_sizes(8, 100, 1.5) == [8, 12, 18, 27, 40, 60, 90]


def test_row_count_and_keys_8b_to_1mb(switch4):
    rows = emulator.size_sweep(switch4, "allreduce", "ring", min_bytes=8, max_bytes=MB)
    assert len(rows) == 18
    assert [r["size"] for r in rows] == [8 << i for i in range(18)]
    assert [r["count"] for r in rows] == [2 << i for i in range(18)]
    for r in rows:
        assert {"size", "count", "type", "redop", "time_s", "time_us", "algbw",
                "busbw"} <= set(r)
        assert (r["type"], r["redop"], r["nranks"]) == ("float", "sum", P)
        assert r["time_us"] == pytest.approx(r["time_s"] * 1e6)
        assert r["algbw"] == pytest.approx(r["size"] / r["time_s"])


@pytest.mark.parametrize("op,algorithm,factor", OPS, ids=[o for o, _, _ in OPS])
def test_busbw_is_algbw_times_the_ops_factor(switch4, op, algorithm, factor):
    rows = emulator.size_sweep(switch4, op, algorithm, min_bytes=8, max_bytes=MB)
    per_rank = op in ("allgather", "reduce_scatter", "alltoall")
    # 8 B are 2 floats: fewer than one per rank, so per-rank ops leave that size out.
    assert len(rows) == (17 if per_rank else 18)
    assert rows[0]["redop"] == ("sum" if op in ("allreduce", "reduce_scatter") else "none")
    for r in rows:
        assert r["busbw"] == pytest.approx(r["algbw"] * factor(P), rel=1e-12)


def test_allgather_count_is_whole_elements_per_rank():
    G = topologies.from_spec("switch:3")
    rows = emulator.size_sweep(G, "allgather", "ring", min_bytes=8, max_bytes=1024)
    requested = sweep_sizes(8, 1024)
    # nccl-tests: count = size // 4 // p per rank, size = count * p * 4 (the total).
    assert [(r["size"], r["count"]) for r in rows] == [
        (12, 1), (24, 2), (60, 5), (120, 10), (252, 21), (504, 42), (1020, 85)]
    for r, req in zip(rows, requested[1:]):
        assert 0 <= req - r["size"] < 3 * 4
    assert nccl_size(1024, "allreduce", 3, 4) == (1024, 256)
    assert nccl_size(1023, "allreduce", 3, 4) == (1020, 255)
    assert nccl_size(1024, "reduce_scatter", 3, 2) == (1020, 170)


def test_dtype_sets_count_and_type_name(switch4):
    half = emulator.size_sweep(switch4, "allreduce", "ring", min_bytes=1024, max_bytes=1024,
                               dtype="float16")
    same = emulator.size_sweep(switch4, "allreduce", "ring", min_bytes=1024, max_bytes=1024,
                               dtype="half")
    assert (half[0]["count"], half[0]["type"]) == (512, "half")
    assert same[0]["count"] == 512 and same[0]["time_s"] == half[0]["time_s"]


def test_times_grow_with_size(switch4):
    rows = emulator.size_sweep(switch4, "allreduce", "ring", min_bytes=8, max_bytes=64 * MB,
                               factor=4)
    times = [r["time_s"] for r in rows]
    assert all(b > a for a, b in zip(times, times[1:]))
    # Large messages approach the ring's bus bandwidth: every link runs at 12.5e9 B/s.
    assert rows[-1]["busbw"] == pytest.approx(12.5e9, rel=0.01)


def test_faults_apply_to_every_size(switch4):
    kw = dict(min_bytes=1024, max_bytes=MB, factor=32)
    base = emulator.size_sweep(switch4, "allreduce", "ring", **kw)
    late = emulator.size_sweep(switch4, "allreduce", "ring", faults=[emulator.Straggler(2, 1e-5)],
                               **kw)
    # All ranks wait for the straggler's chain of 2(p-1) sends: exactly the delay later.
    for a, b in zip(base, late):
        assert b["time_s"] == pytest.approx(a["time_s"] + 1e-5, rel=1e-9)


def test_ranks_subset(switch4):
    rows = emulator.size_sweep(switch4, "allreduce", "ring", min_bytes=MB, max_bytes=MB,
                               ranks=2)
    assert rows[0]["nranks"] == 2
    assert rows[0]["busbw"] == pytest.approx(rows[0]["algbw"] * 1.0)


@pytest.mark.parametrize("kw,field", [
    (dict(min_bytes=0), "min_bytes=0"),
    (dict(min_bytes=-8), "min_bytes=-8"),
    (dict(min_bytes=8.5), "min_bytes=8.5"),
    (dict(min_bytes=True), "min_bytes=True"),
    (dict(max_bytes=4), "max_bytes=4"),
    (dict(factor=1), "factor=1"),
    (dict(factor=0.5), "factor=0.5"),
    (dict(factor=math.nan), "factor=nan"),
    (dict(factor="2"), "factor='2'"),
    (dict(chunks=0), "chunks=0"),
    (dict(ranks=1), "ranks=1"),
    (dict(dtype="float13"), "dtype='float13'"),
    (dict(op="allmix"), "op='allmix'"),
    (dict(algorithm="magic"), "algorithm='magic'"),
    (dict(min_bytes=1, max_bytes=10 ** 9, factor=1.0001), f"more than {MAX_ROWS}"),
    (dict(op="allgather", min_bytes=8, max_bytes=8), "max_bytes=8 is too small"),
])
def test_bad_arguments_name_field_and_value(switch4, kw, field):
    args = dict(op="allreduce", algorithm="ring", min_bytes=8, max_bytes=1024)
    args.update(kw)
    op, algorithm = args.pop("op"), args.pop("algorithm")
    with pytest.raises(emulator.ConfigError, match=re.escape(field)):
        emulator.size_sweep(switch4, op, algorithm, **args)
