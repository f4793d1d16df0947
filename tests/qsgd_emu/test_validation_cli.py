"""``qsgd-emu validate calibrate|compare`` on a trace whose truth is the emulator itself."""
import json
from pathlib import Path

import pytest

import emulator
import topologies
from qsgd_emu.cli import main
from emulator.validation import MeasuredTrace
from emulator.validation.trace import CollectivePoint

DATA = Path(__file__).parent.parent / "emulator" / "data" / "validation"
SPEC = "switch:4,bw=200Mbit,latency=30us,link=ethernet"
SIZES = [1 << 20, 2 << 20, 4 << 20, 8 << 20]


@pytest.fixture
def trace_path(tmp_path):
    """Times the emulator gives on the true links, 3% slower at 4 MiB allgather."""
    G = topologies.from_spec(SPEC)
    pts = []
    for op in ("allreduce", "allgather"):
        for n in SIZES:
            t = emulator.run_collective(G, op, "ring", n).time_s
            if (op, n) == ("allgather", 4 << 20):
                t *= 1.03
            pts.append(CollectivePoint.make(op, n, t, 4))
    trace = MeasuredTrace(environment={"backend": "gloo", "world_size": 4, "topology": SPEC},
                          collectives=tuple(pts))
    path = tmp_path / "trace.json"
    trace.save(path)
    return path


def test_calibrate_recovers_the_links(trace_path, tmp_path, capsys):
    out = tmp_path / "cal.json"
    # start from wrong links: the spec in --topology has 1 Gbit/s and 1 us
    assert main(["validate", "calibrate", str(trace_path), "--topology",
                 "switch:4,bw=1Gbit,link=ethernet", "--fit-sizes", "1MiB,8MiB", "--out", str(out),
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["link"] == "ethernet"
    assert d["bandwidth"] == pytest.approx(25e6, rel=1e-3)
    assert d["alpha_s"] == pytest.approx(30e-6, rel=0.05)
    assert json.loads(out.read_text())["bandwidth"] == d["bandwidth"]


def test_compare_writes_report_and_figure(trace_path, tmp_path, capsys):
    rep, html = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["validate", "compare", str(trace_path), "--out", str(rep), "--html", str(html),
                 "--min-bytes", "1MB"]) == 0
    text = capsys.readouterr().out
    assert "held-out points: 4" in text
    d = json.loads(rep.read_text())
    assert d["format"] == "qsgd-validation-report"
    ag4 = next(p for p in d["points"] if (p["op"], p["bytes"]) == ("allgather", 4 << 20))
    assert ag4["rel_error"] == pytest.approx(1 / 1.03 - 1, abs=2e-3)
    assert d["summary"]["max_abs_rel_error"] == pytest.approx(1 - 1 / 1.03, abs=2e-3)
    assert html.stat().st_size > 100_000


def test_compare_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "qsgd-measured-trace", "version": 1,
                               "environment": {"backend": "gloo"}}))
    assert main(["validate", "compare", str(bad)]) == 2
    assert "environment.world_size" in capsys.readouterr().err


def test_import_cli_round_trip(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["validate", "import-nccl-tests", str(DATA / "all_reduce_perf_srun.log"),
                 "--out", str(out), "--topology", "switch:16", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == 9
    t = MeasuredTrace.load(out)
    assert t.environment["topology"] == "switch:16" and len(t.collectives) == 9
    assert main(["validate", "import-nccl-tests", str(DATA / "all_reduce_perf_truncated.log"),
                 "--out", str(out)]) == 2
    assert "line 37" in capsys.readouterr().err


def test_compare_says_how_the_overlap_was_priced(tmp_path, capsys):
    from emulator.validation.trace import TrainingPoint
    from tests.emulator.test_replay_validation import _trace, training_points

    trace = _trace([TrainingPoint(t.model, t.transport, t.bits, t.iteration_s,
                                  extra={**t.extra, "compute_pace": 0.8})
                    for t in training_points()])
    slow = tuple(CollectivePoint.make(c.op, c.bytes, 3 * c.time_s, 4, extra={"load": "compute"})
                 for c in trace.collectives)
    path = tmp_path / "t.json"
    MeasuredTrace(environment=trace.environment, collectives=trace.collectives,
                  training=trace.training, loaded=slow).save(path)
    assert main(["validate", "compare", str(path)]) == 0
    out = capsys.readouterr().out
    assert "links fitted under load (ethernet latency" in out
    assert "compute at 0.80 of its pace while a collective runs" in out
