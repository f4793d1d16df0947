"""The engine benchmark's parts at tiny sizes: the naive baseline, agreement, the table.

No timing assertions: speed is what ``qsgd-emu bench emulator`` measures, not a unit test.
"""
import json

import numpy as np
import pytest

import emulator
import topologies
from qsgd_emu.bench import emulator as bench
from qsgd_emu.cli import main

B, LAT = 12.5e9, 1e-6
EPS = np.finfo(float).eps


def tiny(n):
    """A two-level fat tree like the benchmark's, 4 GPUs per leaf, 2 spines."""
    return bench.fabric(n, hosts_per_leaf=4, spines=2, bandwidth=B, latency=LAT)


def rtol(p):
    # Both models add the same doubles in the same order along each chain of messages
    # (finish = start + bytes/bandwidth, arrival = finish + latency). The engine also lets
    # flows finishing within 1e-12 of an event time (relative; engine._REL_TOL) finish at
    # it. The critical path of a ring allreduce is 2(p-1) messages, each adding at most
    # that shift and two roundings.
    return 2 * (p - 1) * (1e-12 + 4 * EPS)


@pytest.mark.parametrize("n,nbytes", [(8, 1 << 20), (16, 1 << 20), (16, 1000)])
def test_naive_and_engine_agree_on_an_uncongested_ring(n, nbytes):
    G = tiny(n)
    sched = emulator.build_schedule("allreduce", "ring", n, nbytes)
    engine = emulator.simulate(G, sched).time_s
    naive = bench.naive_simulate(G, sched)
    assert naive == pytest.approx(engine, rel=rtol(n), abs=0)


def test_naive_matches_the_alpha_beta_ring_on_a_switch():
    p, n = 4, 4_000_000
    G = topologies.switch(p, bandwidth=B, latency=LAT)
    naive = bench.naive_simulate(G, emulator.build_schedule("allreduce", "ring", p, n))
    # 2(p-1) steps of n/p bytes over 2 hops (GPU -> switch -> GPU)
    assert naive == pytest.approx(2 * (p - 1) * (2 * LAT + n / p / B), rel=rtol(p))


def test_contention_serializes_in_the_naive_model_and_shares_in_the_engine():
    m = 1_000_000
    G = topologies.switch(3, bandwidth=B, latency=LAT)
    both = emulator.Schedule([emulator.Transfer(0, 0, 1, m), emulator.Transfer(1, 2, 1, m)],
                             ranks=(0, 1, 2), op="alltoall", algorithm="test", nbytes=m)
    # One after the other (FIFO) or side by side at half rate: the last byte leaves at
    # 2m/B either way and arrives two hops later.
    expected = 2 * m / B + 2 * LAT
    assert bench.naive_simulate(G, both) == pytest.approx(expected, rel=1e-12)
    assert emulator.simulate(G, both).time_s == pytest.approx(expected, rel=1e-12)


def test_naive_runs_dependencies_and_local_steps():
    G = topologies.switch(2, bandwidth=B, latency=LAT)
    sched = emulator.Schedule([
        emulator.Transfer(0, 0, 1, 1000),
        emulator.Transfer(1, 1, 1, 0, deps=(0,), compute_s=5e-6),   # a local reduction
        emulator.Transfer(2, 1, 0, 0, deps=(1,)),                   # an empty message
    ], ranks=(0, 1), op="allreduce", algorithm="test", nbytes=1000)
    expected = (2 * LAT + 1000 / B) + 5e-6 + 2 * LAT
    assert bench.naive_simulate(G, sched) == pytest.approx(expected, rel=1e-12)
    assert emulator.simulate(G, sched).time_s == pytest.approx(expected, rel=1e-12)


def test_bench_case_row():
    row = bench.bench_case(8, 1 << 16, G=tiny(8), event_loop=True)
    assert row["flows"] == 2 * 7 * 8 and row["events"] > 0 and row["events_s"] > 0
    # the contention-free pass and the event loop agree to the engine's 1e-12 coalescing
    assert row["events_rel_diff"] <= rtol(8)
    assert row["engine_s"] > 0 and row["naive_s"] > 0 and row["speedup"] > 0
    assert row["rel_diff"] <= rtol(8)
    no_naive = bench.bench_case(8, 1 << 16, naive=False, G=tiny(8))
    assert no_naive["naive_s"] is None and no_naive["speedup"] is None


def test_run_bench_skips_what_the_budget_cannot_afford_and_the_table_prints():
    seen = []
    rows = bench.run_bench([16, 8], 1 << 16, naive_max=8, budget_s=1e-9, make_graph=tiny,
                           progress=seen.append)
    assert [r["gpus"] for r in rows] == [8, 16] and seen == rows
    assert rows[0]["naive_s"] is not None and "--budget-s" in rows[1]["skipped"]
    text = bench.format_table(rows)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["GPUs", "flows", "engine"]
    assert all(h in lines[0] for h in ("engine s", "events", "event-loop s", "naive s", "rel diff"))
    assert lines[2].split()[0] == "8" and "skipped" in lines[3]
    assert "target engine <= 2 s at 1024 GPUs (ring): not measured" in text
    assert "target speedup >= 20x at 256 GPUs (ring): not measured" in text


def test_cli_bench_emulator(capsys):
    quick = ["--congested", "none", "--no-startup"]
    assert main(["bench", "emulator", "--sizes", "32", "--bytes", "1MB", "--json", *quick]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["congested"] == [] and d["startup"] == [] and d["nccl"] == []
    rows = d["rows"]
    assert len(rows) == 1 and rows[0]["gpus"] == 32 and rows[0]["rel_diff"] <= rtol(32)
    assert main(["bench", "emulator", "--sizes", "32,64", "--max-gpus", "32",
                 "--bytes", "1MB", *quick]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(" GPUs") and "   32 " in out and "   64 " not in out


@pytest.mark.parametrize("argv,needle", [
    (["--sizes", "33"], "--sizes"),
    (["--sizes", "64", "--max-gpus", "32"], "--max-gpus"),
    (["--bytes", "1ZB"], "--bytes"),
    (["--budget-s", "0"], "--budget-s"),
    (["--congested", "alltoall-7"], "--congested"),
    (["--congested", "none", "--tolerance", "0.9"], "--tolerance"),
])
def test_cli_bench_bad_options(capsys, argv, needle):
    assert main(["bench", "emulator", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


# -- congested cases -----------------------------------------------------------------------------
def test_congested_case_row(monkeypatch):
    # The child's work, in this process, on a small case: exact and approximate engine, naive.
    from qsgd_emu.bench import congested

    case = congested.Case("tiny", "fat_tree:k=4", lambda G: emulator.build_schedule(
        "alltoall", "direct", 16, 10 ** 6 + 3), "all-to-all", 240)
    monkeypatch.setitem(congested.CASES, "tiny", case)
    row = congested._child("tiny", True, 1e-2)
    G = topologies.from_spec("fat_tree:k=4")
    exact = emulator.simulate(G, case.build(G))
    assert (row["gpus"], row["flows"], row["events"]) == (16, 240, exact.events)
    assert row["engine_time_s"] == exact.time_s
    assert abs(row["approx_rel_err"]) <= 1e-2 and row["approx_events"] <= row["events"]
    # FIFO resources serialize what max-min shares: never faster than the fair share
    assert row["naive_time_s"] >= exact.time_s * (1 - 1e-12)
    assert row["peak_mb"] >= row["base_mb"] > 0
    text = bench.format_table([], [row], [{"command": bench.STARTUP_COMMANDS[0], "runs": 1,
                                            "min_s": 0.5, "median_s": 0.5}])
    assert "tiny: all-to-all on fat_tree:k=4" in text
    assert "target simulate ring:8 <= 0.6 s: 0.50 s: met" in text
    assert "target alltoall-1024 <= 60 s exact: not measured" in text


def test_a_case_runs_in_its_own_process():
    from qsgd_emu.bench import congested

    row = congested.run_case("alltoall-64", naive=False, tolerance=1e-3)
    G = topologies.from_spec("fat_tree:k=16")
    exact = emulator.simulate(G, congested.CASES["alltoall-64"].build(G))
    assert row["engine_time_s"] == exact.time_s and row["flows"] == 64 * 63
    assert row["naive_s"] is None and row["peak_mb"] > 0


def test_ring_channels_use_every_nic_and_share_nvswitch_ports():
    from qsgd_emu.bench.congested import ring_channels

    G = topologies.from_spec("cluster:dgx_h100x2,fabric=leaf_spine")
    n = 8 * 10 ** 6
    sched = ring_channels(G, 2, 8, n)
    # 8 rings of 2(p-1) steps of p messages of n/8/p bytes
    assert len(sched) == 8 * 2 * 15 * 16 and sched.total_bytes == 8 * 2 * 15 * 16 * (n // 8 // 16)
    res = emulator.simulate(G, sched)
    nics = {l.u for l in res.links if ".nic" in l.u and l.v.startswith("leaf")}
    assert nics == {f"n{i}.nic{c}" for i in range(2) for c in range(8)}
    assert res.events > 0                        # channels share the GPUs' NVSwitch ports
    one = emulator.simulate(G, emulator.build_schedule("allreduce", "ring", 16, n))
    assert res.time_s < one.time_s


def test_startup_times_runs_the_cli():
    rows = bench.startup_times(("topology ring:4",), runs=2)
    assert rows[0]["command"] == "topology ring:4" and len(rows[0]["walls_s"]) == 2
    assert 0 < rows[0]["min_s"] <= rows[0]["median_s"]
