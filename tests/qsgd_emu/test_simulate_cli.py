"""``qsgd-emu simulate``: one collective, nccl-tests sweep tables, fault options, errors."""
import json

import pytest

from qsgd_emu.cli import main
from emulator.validation.nccl_tests import parse_nccl_tests_text

# ring:4: GPU i linked to GPU i+1, 12.5e9 B/s and 1 us per link (topologies defaults).
P, B, LAT = 4, 12.5e9, 1e-6
RING = ["simulate", "--topology", "ring:4", "--op", "allreduce", "--algorithm", "ring"]
HEADER = "#       size         count      type   redop     time   algbw   busbw"
UNITS = "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)"


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_time(capsys, *extra) -> float:
    rc, out, err = run(capsys, *RING, "--bytes", "4MB", "--json", *extra)
    assert rc == 0, err
    return json.loads(out)["time_s"]


def test_sweep_text_has_the_nccl_tests_columns(capsys):
    rc, out, _ = run(capsys, *RING, "--min-bytes", "8", "--max-bytes", "1MiB")
    assert rc == 0
    lines = out.splitlines()
    assert HEADER in lines and UNITS in lines
    rows = [l for l in lines if not l.startswith("#")]
    assert len(rows) == 18
    size, count, typ, redop, time_us, algbw, busbw = rows[-1].split()
    assert (size, count, typ, redop) == (str(1 << 20), str(1 << 18), "float", "sum")
    assert float(busbw) == pytest.approx(float(algbw) * 2 * (P - 1) / P, abs=0.01)
    # Column widths of nccl-tests (src/common.cu): %12li  %12li  %8s  %6s  %7s  %6.2f  %6.2f
    assert len(rows[-1]) == 12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 7 + 2 + 6 + 2 + 6
    assert any(l.startswith("# Avg bus bandwidth") for l in lines)


def test_sweep_text_reads_back_with_the_nccl_tests_importer(capsys):
    _, text, _ = run(capsys, *RING, "--min-bytes", "1KiB", "--max-bytes", "16MiB", "--factor", "4")
    _, js, _ = run(capsys, *RING, "--min-bytes", "1KiB", "--max-bytes", "16MiB", "--factor", "4",
                   "--json")
    trace = parse_nccl_tests_text(text, op="allreduce", world_size=P)
    rows = json.loads(js)
    assert [c.bytes for c in trace.collectives] == [r["size"] for r in rows]
    for c, r in zip(trace.collectives, rows):
        # printed with 2 decimals below 100 us, 1 below 10 ms
        assert c.time_s == pytest.approx(r["time_s"], abs=0.051e-6)


def test_sweep_json_rows(capsys):
    rc, out, _ = run(capsys, *RING, "--op", "allgather", "--min-bytes", "8", "--max-bytes", "4KB",
                     "--json")
    rows = json.loads(out)
    assert rc == 0 and isinstance(rows, list)
    # allgather on 4 ranks: 8 B = 2 floats is less than one per rank and is left out
    assert [r["size"] for r in rows] == [16, 32, 64, 128, 256, 512, 1024, 2048]
    for r in rows:
        assert {"size", "count", "type", "redop", "time_s", "time_us", "algbw", "busbw"} <= set(r)
        assert r["redop"] == "none" and r["count"] * P * 4 == r["size"]
        assert r["busbw"] == pytest.approx(r["algbw"] * (P - 1) / P)


def test_one_collective_text(capsys):
    rc, out, _ = run(capsys, *RING, "--bytes", "4MB", "--top", "2")
    assert rc == 0
    for label in ("topology", "collective", "time", "algbw", "busbw", "flows", "events",
                  "peak link utilization", "busiest links"):
        assert any(l.startswith(label) for l in out.splitlines()), label
    assert "ring:4" in out and "4,000,000 B" in out
    links = out.split("busiest links")[1].splitlines()[1:]
    assert len(links) == 2 and all("->" in l and "GB/s" in l for l in links)


def test_one_collective_json(capsys):
    rc, out, _ = run(capsys, *RING, "--bytes", "4MB", "--json", "--top", "3")
    d = json.loads(out)
    assert rc == 0
    m = 4e6 / P
    # uncongested ring: 2(p-1) steps of (latency + n/p / bandwidth)
    assert d["time_s"] == pytest.approx(2 * (P - 1) * (LAT + m / B), rel=1e-12)
    assert d["algbw"] == pytest.approx(4e6 / d["time_s"])
    assert d["busbw"] == pytest.approx(d["algbw"] * 2 * (P - 1) / P)
    # a ring on a ring never shares a channel: the contention-free pass needs no events
    assert d["flows"] == 2 * (P - 1) * P and d["events"] == 0
    assert d["peak_utilization"] == pytest.approx(1.0)
    assert len(d["busiest_links"]) == 3 and d["faults"] == []


def test_straggler_delays_by_exactly_its_delay(capsys):
    base = one_time(capsys)
    # Every rank waits for the straggler's 2(p-1) back-to-back sends, and nothing waits longer.
    assert one_time(capsys, "--straggler", "1,20us") == pytest.approx(base + 20e-6, rel=1e-9)


def test_degraded_link_slows_the_ring_to_its_pace(capsys):
    base = one_time(capsys)
    slow = one_time(capsys, "--degrade", "gpu0,gpu1,0.5")
    m = 4e6 / P
    # Its sender sends 2(p-1) messages one after another at half the bandwidth (lower
    # bound), and no transfer takes more than twice as long (upper bound).
    assert slow >= 2 * (P - 1) * (LAT + m / (0.5 * B)) * (1 - 1e-12)
    assert slow <= 2 * base
    assert one_time(capsys, "--degrade", "0,1,1") == pytest.approx(base, rel=1e-12)


def test_removed_link_reroutes_the_long_way(capsys):
    base = one_time(capsys)
    # gpu0 -> gpu1 now goes 0-3-2-1 against the ring's direction: no sharing, 2 more hops
    # of 1 us in each of the 2(p-1) steps.
    assert one_time(capsys, "--remove", "gpu0,gpu1") == pytest.approx(
        base + 2 * (P - 1) * 2 * LAT, rel=1e-9)


def test_faults_are_listed(capsys):
    rc, out, _ = run(capsys, *RING, "--bytes", "1MB", "--degrade", "gpu0,gpu1,0.5",
                     "--straggler", "2,1ms")
    assert rc == 0
    assert "degrade gpu0-gpu1 x0.5" in out and "straggler rank 2 +1000 us" in out


@pytest.mark.parametrize("extra,needles", [
    (["--bytes", "12QB"], ["--bytes", "12QB"]),
    (["--bytes", "0"], ["--bytes", "'0'"]),
    (["--min-bytes", "8"], ["--max-bytes"]),
    (["--max-bytes", "8"], ["--min-bytes"]),
    (["--bytes", "8", "--min-bytes", "8", "--max-bytes", "16"], ["--bytes", "--min-bytes"]),
    ([], ["--bytes"]),
    (["--min-bytes", "1k", "--max-bytes", "8"], ["--max-bytes", "'8'"]),
    (["--min-bytes", "8", "--max-bytes", "1k", "--factor", "1"], ["--factor", "'1'"]),
    (["--min-bytes", "8", "--max-bytes", "1k", "--factor", "two"], ["--factor", "two"]),
    (["--min-bytes", "8", "--max-bytes", "1k", "--dtype", "float13"], ["--dtype", "float13"]),
    (["--bytes", "1MB", "--chunks", "0"], ["--chunks", "'0'"]),
    (["--bytes", "1MB", "--ranks", "1"], ["--ranks", "'1'"]),
    (["--bytes", "1MB", "--ranks", "9"], ["--ranks", "'9'"]),
    (["--bytes", "1MB", "--op", "allmix"], ["--op", "allmix"]),
    (["--bytes", "1MB", "--algorithm", "magic"], ["--algorithm", "magic"]),
    (["--bytes", "1MB", "--degrade", "gpu0,gpu1"], ["--degrade", "gpu0,gpu1", "U,V,FACTOR"]),
    (["--bytes", "1MB", "--degrade", "gpu0,gpu1,2"], ["--degrade", "gpu0,gpu1,2", "FACTOR"]),
    (["--bytes", "1MB", "--degrade", "gpu0,gpu2,0.5"], ["--degrade", "no link gpu0 - gpu2"]),
    (["--bytes", "1MB", "--degrade", "gpu0,sw9,0.5"], ["--degrade", "'sw9'"]),
    (["--bytes", "1MB", "--remove", "gpu0"], ["--remove", "'gpu0'", "U,V"]),
    (["--bytes", "1MB", "--remove", "gpu0,gpu1", "--remove", "gpu2,gpu3"],
     ["--remove", "gpu2,gpu3", "partitions"]),
    (["--bytes", "1MB", "--straggler", "7,1us"], ["--straggler", "7,1us", "rank 7"]),
    (["--bytes", "1MB", "--straggler", "1,5parsec"], ["--straggler", "5parsec"]),
    (["--bytes", "1MB", "--straggler", "x,1us"], ["--straggler", "'x'"]),
])
def test_bad_options_exit_2_naming_the_option(capsys, extra, needles):
    rc, out, err = run(capsys, *RING, *extra)
    assert rc == 2 and out == ""
    assert err.startswith("qsgd-emu simulate: error: ") and err.count("\n") == 1
    for needle in needles:
        assert needle in err, (needle, err)


def test_bad_topology_exits_2(capsys):
    rc, _, err = run(capsys, "simulate", "--topology", "ring:x", "--bytes", "1MB")
    assert rc == 2 and err.count("\n") == 1 and "'x'" in err


@pytest.mark.parametrize("op", ["allreduce", "allgather", "reduce_scatter", "broadcast",
                                "alltoall"])
def test_every_op_runs_on_the_default_algorithm(capsys, op):
    """No --algorithm: the op's NCCL model (a textbook default failed for --op alltoall)."""
    rc, out, err = run(capsys, "simulate", "--topology", "dgx_a100", "--op", op, "--bytes", "8MB",
                       "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["op"] == op and d["time_s"] > 0
