"""End to end on the namespace testbed (root): real gloo ranks on shaped links, calibrated
on two sizes, held-out sizes and the QSGD training speedup predicted by the emulator."""
import pytest

from qsgd_emu.cli import main
from emulator.validation import MeasuredTrace, compare
from testbench.testbed import available

OK, WHY = available()
pytestmark = [pytest.mark.netns, pytest.mark.slow,
              pytest.mark.skipif(not OK, reason=f"testbed unavailable: {WHY}")]

RATE = 12.5e6        # 100 Mbit/s: slow enough that the model is communication-bound


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("tb") / "trace.json"
    rc = main(["validate", "testbed", "--hosts", "3", "--rate", "100Mbit", "--out", str(out),
               "--min-bytes", "1KiB", "--max-bytes", "4MiB", "--factor", "4", "--warmup", "1",
               "--iters", "5", "--train-bits", "4", "--width", "512", "--depth", "2",
               "--batch-size", "8", "--train-warmup", "2", "--train-steps", "8",
               "--timeout", "60", "--wall-timeout", "150"])
    assert rc == 0
    return MeasuredTrace.load(out)


def test_trace_records_the_testbed(trace):
    env = trace.environment
    assert env["world_size"] == 3 and env["hosts"] == ["h0", "h1", "h2"]
    assert env["topology"] == "switch:3,bw=100Mbit,link=ethernet"
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
    # communication-bound: QSGD 4-bit is measurably faster, and the emulator says how much
    assert rows[4]["measured_speedup"] > 1.3
    assert abs(rows[4]["speedup_rel_error"]) <= 0.25, rows
    # the hook's one collective per bucket, measured inside the steps (one kernel clock): the
    # payload all_gather with the biases in front, which the shaped links bound from below
    (gather,) = rows[4]["collectives"]
    assert gather["name"] == "payload all_gather", rows[4]
    q = next(t for t in trace.training if t.bits == 4)
    per_rank = q.get("payload_bytes") + 4 * q.get("raw_numel")
    assert gather["measured_s"] > 0.8 * 2 * per_rank / RATE    # (p-1)/p of p payloads, p = 3
    assert abs(gather["predicted_s"] / gather["measured_s"] - 1) <= 0.25, rows[4]
