"""End to end on the namespace testbed (root): real gloo ranks on shaped links, calibrated
on two sizes, held-out sizes, and multi-bucket DDP steps (fp32, fp16, QSGD) whose overlap the
emulator's replay predicts."""
import pytest

import emulator
import qsgd
from qsgd_emu.cli import main
from emulator.validation import MeasuredTrace, compare
from testbench.testbed import available

OK, WHY = available()
pytestmark = [pytest.mark.netns, pytest.mark.slow,
              pytest.mark.skipif(not OK, reason=f"testbed unavailable: {WHY}")]

# 50 Mbit/s: slow enough that the steps stay communication-bound when the host is busy. Three
# ranks share two cores in CI; at 100 Mbit/s their contended backward and codec were 15-25 % of a
# QSGD step and the 4-bit speedup error reached 0.26 on a loaded host (0.15 quiet); at 50 Mbit/s
# it measured 0.01 quiet and 0.03 beside two CPU hogs (benchmarks/RESULTS.md).
RATE = 6.25e6


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("tb") / "trace.json"
    rc = main(["validate", "testbed", "--hosts", "3", "--rate", "50Mbit", "--out", str(out),
               "--min-bytes", "1KiB", "--max-bytes", "4MiB", "--factor", "4", "--warmup", "1",
               "--iters", "5", "--train-bits", "4", "--width", "512", "--depth", "3",
               "--batch-size", "8", "--bucket-cap-mb", "1", "--train-warmup", "2",
               "--train-steps", "8",
               "--timeout", "60", "--wall-timeout", "150"])
    assert rc == 0
    return MeasuredTrace.load(out)


def test_trace_records_the_testbed(trace):
    env = trace.environment
    assert env["world_size"] == 3 and env["hosts"] == ["h0", "h1", "h2"]
    assert env["topology"] == "switch:3,bw=50Mbit,link=ethernet"
    # the links are shaped: a 4 MiB ring allreduce cannot beat 2(p-1)/p * n / rate
    ar = max(trace.points("allreduce"), key=lambda c: c.bytes)
    bound = 2 * 2 / 3 * ar.bytes / RATE
    assert bound < ar.time_s < 1.6 * bound


def test_held_out_sizes_and_speedup_predicted(trace):
    # fit on 1 KiB (the per-hop latency the hook's small collectives pay) and 4 MiB of both ops
    rep = compare(trace, min_bytes=1_000_000)
    # allgather sizes are whole elements per rank: 1 MiB rounds down to a multiple of 3 * 4
    assert sorted((p["op"], p["bytes"] // 1024) for p in rep.held_out()
                  if p["bytes"] >= 1_000_000) == [
        ("allgather", 1023), ("allreduce", 1024)]
    assert rep.summary["median_abs_rel_error"] <= 0.15, rep.points
    assert 0.7 * RATE < rep.calibration["bandwidth"] < 1.1 * RATE
    rows = {r["bits"]: r for r in rep.training}
    assert rows[32]["transport"] == "allreduce" and rows[4]["transport"] == "allgather"
    assert rows[16]["replay_transport"] == "fp16"
    # communication-bound: QSGD 4-bit is measurably faster, and the emulator says how much
    assert rows[4]["measured_speedup"] > 1.3
    assert abs(rows[4]["speedup_rel_error"]) <= 0.25, rows
    for r in rows.values():
        assert abs(r["rel_error"]) <= 0.25, r
        m, pr = r["timeline"]["measured"], r["timeline"]["predicted"]
        # 1 MiB buckets: the output layer with the last hidden one, then one layer each
        assert len(m) == len(pr) == 3
        for b in m:
            assert b["ready"] <= b["issued"] <= b["comm_done"] <= b["done"]
        # overlap, measured: the first bucket's collective went out while backward still ran;
        # predicted: no later than the last bucket's gradients (the compute-alone run can report
        # the last buckets ready at one instant, leaving no backward after the first issue)
        assert m[0]["issued"] < m[-1]["ready"] and pr[0]["issued"] <= pr[-1]["ready"]
    # what the hook sent per bucket cannot beat the shaped links: (p-1) of p payloads, p = 3
    q = next(t for t in trace.training if t.bits == 4)
    ptrace = qsgd.PayloadTrace.from_dict(q.get("payload_trace"))
    for b, k in zip(rows[4]["timeline"]["measured"], range(ptrace.num_buckets)):
        (c,) = emulator.bucket_plan(ptrace, k, "qsgd_allgather", 3).collectives
        assert b["comm_done"] - b["issued"] > 0.8 * c.wire_bytes / RATE
