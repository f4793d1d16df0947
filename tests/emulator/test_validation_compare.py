"""compare -> ValidationReport: per-point errors, held-out summary, report round trip, figure."""
import importlib
import json

import pytest

import topologies
from emulator import TraceError
from emulator.validation import MeasuredTrace, ValidationReport, compare
from emulator.validation.trace import CollectivePoint

from .test_replay_validation import training_points
from .test_validation_calibrate import ring_over_star

calibrate_module = importlib.import_module("emulator.validation.calibrate")


@pytest.fixture(autouse=True)
def star_predictor(monkeypatch):
    monkeypatch.setitem(calibrate_module.PREDICTORS, "star", ring_over_star)


SPEC = "switch:4,bw=200Mbit,latency=30us,link=ethernet"
SIZES = [1 << 18, 1 << 20, 2 << 20, 4 << 20, 8 << 20]


def _trace(distort=None, training=()):
    G = topologies.from_spec(SPEC)
    pts = []
    for op in ("allreduce", "allgather"):
        for n in SIZES:
            t = ring_over_star(G, op, "ring", n)
            if distort:
                t *= distort(op, n)
            pts.append(CollectivePoint.make(op, n, t, 4))
    env = {"backend": "gloo", "world_size": 4, "source": "harness", "topology": SPEC}
    return MeasuredTrace(environment=env, collectives=tuple(pts), training=tuple(training))


def test_exact_model_gives_zero_error_on_held_out_points():
    rep = compare(_trace(), predictor="star", fit_sizes=[1 << 20, 8 << 20])
    assert rep.topology == SPEC
    assert len(rep.points) == 10
    held = rep.held_out()
    assert {p["bytes"] for p in held} == {1 << 18, 2 << 20, 4 << 20}
    assert all(abs(p["rel_error"]) < 1e-9 for p in rep.points)
    assert rep.summary["points"] == 6 and rep.summary["max_abs_rel_error"] < 1e-9
    assert rep.calibration["bandwidth"] == pytest.approx(25e6, rel=1e-6)
    assert rep.calibration["alpha_s"] == pytest.approx(30e-6, rel=1e-4)


def test_errors_are_signed_relative_and_summarised_over_large_held_out_points():
    # allgather measured 10% slower than the model at 4 MiB only
    rep = compare(_trace(lambda op, n: 1.1 if (op, n) == ("allgather", 4 << 20) else 1.0),
                  predictor="star", fit_sizes=[1 << 20, 8 << 20], min_bytes=1_000_000)
    pt = next(p for p in rep.points if (p["op"], p["bytes"]) == ("allgather", 4 << 20))
    assert pt["rel_error"] == pytest.approx(1 / 1.1 - 1, rel=1e-6)
    assert pt["predicted_s"] == pytest.approx(pt["measured_s"] / 1.1, rel=1e-6)
    s = rep.summary
    assert s["points"] == 4          # 2 MiB and 4 MiB of both ops (256 KiB is below min_bytes)
    assert s["max_abs_rel_error"] == pytest.approx(abs(1 / 1.1 - 1), rel=1e-6)
    assert s["per_op"]["allreduce"]["max_abs_rel_error"] < 1e-9
    assert s["min_bytes"] == 1_000_000


def test_per_op_fit_absorbs_an_op_specific_efficiency():
    slow_ag = lambda op, n: 1.12 if op == "allgather" else 1.0
    joint = compare(_trace(slow_ag), predictor="star")
    per_op = compare(_trace(slow_ag), predictor="star", per_op=True)
    assert joint.summary["median_abs_rel_error"] > 0.02
    assert per_op.summary["max_abs_rel_error"] < 0.01
    assert set(per_op.calibration["per_op"]) == {"allreduce", "allgather"}


def test_report_round_trip_figure_and_field_errors(tmp_path):
    # training rows are predicted through replay: tests/emulator/test_replay_validation.py
    fp32, q = training_points()
    rep = compare(_trace(training=(fp32, q)), predictor="star")
    path = tmp_path / "r.json"
    rep.save(path)
    again = ValidationReport.load(path)
    assert again.to_dict() == json.loads(path.read_text())
    assert again.summary == rep.summary and len(again.points) == 10
    html = tmp_path / "r.html"
    rep.write_html(html)
    text = html.read_text()
    assert "plotly" in text.lower() and "allgather measured" in text and len(text) > 100_000
    d = rep.to_dict()
    d["points"][3]["predicted_s"] = "fast"
    with pytest.raises(TraceError, match=r"points\[3\]\.predicted_s"):
        ValidationReport.from_dict(d)
    d = rep.to_dict()
    d["format"] = "qsgd-measured-trace"
    with pytest.raises(TraceError, match="format"):
        ValidationReport.from_dict(d)


def test_topology_is_required():
    t = _trace()
    env = dict(t.environment)
    env.pop("topology")
    bare = MeasuredTrace(environment=env, collectives=t.collectives)
    with pytest.raises(TraceError, match="environment.topology"):
        compare(bare, predictor="star")
    rep = compare(bare, topology=SPEC, predictor="star")
    assert rep.topology == SPEC
