"""MeasuredTrace format and the nccl-tests importer, on fixture logs of every variant."""
import json
from pathlib import Path

import pytest

from emulator import TraceError
from emulator.validation import MeasuredTrace, import_nccl_tests
from emulator.validation.trace import CollectivePoint, busbw_factor

DATA = Path(__file__).parent / "data" / "validation"


def _trace_dict():
    return {
        "format": "qsgd-measured-trace", "version": 1,
        "environment": {"backend": "gloo", "world_size": 4, "hosts": ["h0", "h1", "h2", "h3"],
                        "devices": ["cpu"] * 4, "source": "harness", "topology": "switch:4"},
        "collectives": [
            {"op": "allreduce", "bytes": 1048576, "count": 262144, "dtype": "float32",
             "time_s": 0.0123, "samples_s": [0.0121, 0.0123, 0.0125], "algbw": 8.5e7,
             "busbw": 1.3e8, "mystery": 7},
        ],
        "training": [{"model": "mlp", "transport": "allgather", "bits": 4, "iteration_s": 0.45,
                      "samples_s": [0.44, 0.46], "bytes_per_step": 123456, "compute_s": 0.1,
                      "payload_bytes": 5000}],
        "loaded": [
            {"op": "allreduce", "bytes": 1048576, "time_s": 0.0450, "samples_s": [0.045],
             "load": "compute"},
        ],
        "comment": "kept",
    }


def test_round_trip_keeps_unknown_fields(tmp_path):
    t = MeasuredTrace.from_dict(_trace_dict())
    assert t.world_size == 4
    assert t.collectives[0].extra == {"mystery": 7}
    assert t.training[0].get("payload_bytes") == 5000
    path = tmp_path / "t.json"
    t.save(path)
    again = MeasuredTrace.load(path)
    assert again.to_dict() == t.to_dict()
    assert json.loads(path.read_text())["comment"] == "kept"
    # the points measured while the ranks computed are their own list, not collectives
    assert [(c.op, c.time_s, c.extra) for c in again.loaded] == [
        ("allreduce", 0.045, {"load": "compute"})]
    assert [c.time_s for c in again.points()] == [0.0123]
    d = _trace_dict()
    del d["loaded"]
    assert MeasuredTrace.from_dict(d).loaded == () and "loaded" not in MeasuredTrace.from_dict(d).to_dict()


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(format="qsgd-payload-trace"), "format"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d["environment"].pop("world_size"), "environment.world_size"),
    (lambda d: d["environment"].update(world_size=0), "environment.world_size"),
    (lambda d: d["collectives"][0].update(time_s=-1.0), "collectives[0].time_s"),
    (lambda d: d["collectives"][0].update(bytes="1MB"), "collectives[0].bytes"),
    (lambda d: d["collectives"][0].update(op="allreduse"), "collectives[0].op"),
    (lambda d: d["collectives"][0]["samples_s"].append(float("nan")), "collectives[0].samples_s[3]"),
    (lambda d: d["training"][0].update(transport="carrier-pigeon"), "training[0].transport"),
    (lambda d: d["training"][0].update(payload_bytes=-3), "training[0].payload_bytes"),
    (lambda d: d["training"][0].pop("iteration_s"), "training[0].iteration_s"),
    (lambda d: d["training"][0].update(busy_s=-0.1), "training[0].busy_s"),
    (lambda d: d["training"][0].update(codec="zip"), "training[0].codec"),
    (lambda d: d["training"][0].update(collectives_s=[0.1, "x"]), "training[0].collectives_s[1]"),
    (lambda d: d["loaded"][0].update(time_s=0), "loaded[0].time_s"),
    (lambda d: d["training"][0].update(compute_pace=1.2), "training[0].compute_pace"),
    (lambda d: d["training"][0].update(compute_pace=0), "training[0].compute_pace"),
    (lambda d: d["training"][0].update(compute_busy_s=-1), "training[0].compute_busy_s"),
    (lambda d: d.update(loaded={"op": "allreduce"}), "loaded"),
])
def test_bad_fields_are_named(mutate, field):
    d = _trace_dict()
    mutate(d)
    with pytest.raises(TraceError, match=field.replace("[", r"\[").replace("]", r"\]")):
        MeasuredTrace.from_dict(d)


def test_load_rejects_non_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{ not json")
    with pytest.raises(TraceError, match="not JSON"):
        MeasuredTrace.load(p)


def test_busbw_factors_follow_nccl_tests():
    assert busbw_factor("allreduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("allgather", 8) == pytest.approx(7 / 8)
    assert busbw_factor("broadcast", 8) == 1.0
    pt = CollectivePoint.make("allreduce", 1000, 0.5, 4)
    assert pt.algbw == 2000 and pt.busbw == pytest.approx(3000)


def _row_values(path, size):
    """The out-of-place time (us) printed on the row of ``size`` in a text log."""
    for line in Path(path).read_text().splitlines():
        tokens = line.split(": ", 1)[-1].split() if line[:1].isdigit() and ": " in line else line.split()
        if tokens and tokens[0] == str(size):
            return tokens
    raise AssertionError(size)


def test_current_format_with_root_column():
    path = DATA / "all_reduce_perf_2x8_h100.log"
    t = import_nccl_tests(path)
    env = t.environment
    assert env["backend"] == "nccl" and env["source"] == "nccl-tests"
    assert env["world_size"] == 16 and env["hosts"] == ["gpu-a017", "gpu-a018"]
    assert env["devices"][0] == "NVIDIA H100 80GB HBM3" and env["nccl_version"] == 22304
    sizes = [c.bytes for c in t.collectives]
    assert sizes == [8 << i for i in range(0, 25, 2)]
    assert all(c.op == "allreduce" and c.dtype == "float32" for c in t.collectives)
    tokens = _row_values(path, 33554432)
    c = next(c for c in t.collectives if c.bytes == 33554432)
    # out-of-place time is the first time column (index 5 with a root column), in us
    assert c.time_s == pytest.approx(float(tokens[5]) * 1e-6)
    assert c.extra["in_place_time_s"] == pytest.approx(float(tokens[9]) * 1e-6)
    assert c.count == 33554432 // 4
    # busbw recomputed from size and time matches what nccl-tests printed (GB/s, 2 decimals)
    assert c.busbw / 1e9 == pytest.approx(float(tokens[7]), abs=0.01)


def test_old_format_without_root_column_and_op_from_file_name():
    path = DATA / "all_gather_perf_old_8x.log"
    t = import_nccl_tests(path)
    assert t.world_size == 8 and {c.op for c in t.collectives} == {"allgather"}
    tokens = _row_values(path, 1048576)
    c = next(c for c in t.collectives if c.bytes == 1048576)
    assert c.time_s == pytest.approx(float(tokens[4]) * 1e-6)       # no root: index 4
    assert c.count == 1048576 // 4 // 8                                # elements per rank
    assert c.busbw / 1e9 == pytest.approx(float(tokens[6]), abs=0.01)
    assert "error" in c.extra


def test_op_must_be_known_when_the_log_does_not_say(tmp_path):
    p = tmp_path / "mystery.log"
    p.write_text((DATA / "all_gather_perf_old_8x.log").read_text())
    with pytest.raises(TraceError, match="which collective"):
        import_nccl_tests(p)
    assert import_nccl_tests(p, op="allgather").collectives[0].op == "allgather"


def test_srun_label_prefixes():
    t = import_nccl_tests(DATA / "all_reduce_perf_srun.log")
    assert t.world_size == 16 and t.environment["hosts"] == ["gpu-a017", "gpu-a018"]
    assert [c.bytes for c in t.collectives] == [1 << i for i in range(20, 29)]
    assert t.environment["nccl_tests_version"] == "2.13.9"
    # the rows of task 0 only, in order: past the latency-bound start, time grows with size
    times = [c.time_s for c in t.collectives]
    assert times[1:] == sorted(times[1:]) and times[-1] > 10 * times[3]


def test_json_report():
    path = DATA / "all_gather_perf_a100.json"
    doc = json.loads(path.read_text())
    t = import_nccl_tests(path)
    assert t.world_size == 8 and t.environment["hosts"] == ["dgx-b04"]
    assert {c.op for c in t.collectives} == {"allgather"}
    for c, r in zip(t.collectives, doc["results"]):
        assert c.bytes == r["size"] and c.time_s == pytest.approx(r["out_of_place"]["time"] * 1e-6)
        assert c.busbw == pytest.approx(r["out_of_place"]["bus_bw"] * 1e9, rel=1e-5)


def test_garbled_log_names_the_line():
    with pytest.raises(TraceError, match=r"line 37: 6 fields"):
        import_nccl_tests(DATA / "all_reduce_perf_truncated.log")


def test_garbled_number_names_the_line(tmp_path):
    text = (DATA / "all_reduce_perf_2x8_h100.log").read_text().splitlines()
    i = next(i for i, l in enumerate(text) if l.strip().startswith("8388608 "))
    text[i] = text[i].replace("float", "float", 1).replace(text[i].split()[5], "12x.4", 1)
    p = tmp_path / "all_reduce_perf_bad.log"
    p.write_text("\n".join(text))
    with pytest.raises(TraceError, match=f"line {i + 1}: a number does not parse"):
        import_nccl_tests(p)


def test_log_without_table_and_bad_json(tmp_path):
    p = tmp_path / "all_reduce_perf.log"
    p.write_text("NCCL WARN something broke\n")
    with pytest.raises(TraceError, match="no nccl-tests result table"):
        import_nccl_tests(p)
    q = tmp_path / "all_reduce_perf.json"
    q.write_text('{"version": 2, "results": [}')
    with pytest.raises(TraceError, match="not valid JSON"):
        import_nccl_tests(q)
    q.write_text(json.dumps({"version": 2, "args": ["all_reduce_perf"],
                             "config": {"devices": [{"rank": 0, "hostname": "a"}]},
                             "results": [{"size": 8, "count": 2, "out_of_place": None}]}))
    with pytest.raises(TraceError, match=r"results\[0\]\.out_of_place"):
        import_nccl_tests(q)


