"""validate compare predicts training steps through replay (the study's own path), on the
calibrated links: measured and predicted step, exposed communication, speedup and per-bucket
timeline, side by side."""
import pytest

import emulator
import topologies
from emulator.validation import Calibration, MeasuredTrace, compare
from emulator.validation.trace import CollectivePoint, TrainingPoint
from emulator.validation.training import predict_training, replay_transport, step_breakdown
from tests.emulator.test_replay_limits import make_trace

SPEC = "switch:4,bw=200Mbit,latency=30us,link=ethernet"
CAL = Calibration(links={"ethernet": (50e-6, 20e6)}, fitted_on=())


def _measured_timeline(pred, late=0.0):
    return [{"bucket": b.index, "ready": b.ready_s, "issued": b.issued_s,
             "comm_done": b.comm_end_s + late, "done": b.end_s + late} for b in pred.buckets]


def training_points(fp32_factor=1.0, qsgd_factor=1.05):
    """fp32 and QSGD points whose measured steps are the replay's times these factors, each
    with the harness's payload trace (the hand-made 3-bucket trace) and measured timeline."""
    trace = make_trace()
    H = CAL.apply(topologies.from_spec(SPEC))
    out = []
    for transport, bits, rt, factor in (("allreduce", 32, "fp32", fp32_factor),
                                        ("allgather", 4, "qsgd_allgather", qsgd_factor)):
        pred = emulator.replay(trace, H, transport=rt, world_size=4)
        out.append(TrainingPoint("mlp", transport, bits, iteration_s=pred.iteration_s * factor, extra={
            "compute_s": pred.compute_s, "payload_trace": trace.to_dict(), "replay_transport": rt,
            "timeline": _measured_timeline(pred, pred.iteration_s * (factor - 1)),
            "backward_end_s": pred.forward_s + pred.backward_s}))
    return out


def _trace(training):
    G = topologies.from_spec(SPEC)
    pts = [CollectivePoint.make(op, n, emulator.run_collective(CAL.apply(G), op, "ring", n).time_s, 4)
           for op in ("allreduce", "allgather") for n in (1 << 20, 4 << 20)]
    env = {"backend": "gloo", "world_size": 4, "source": "harness", "topology": SPEC}
    return MeasuredTrace(environment=env, collectives=tuple(pts), training=tuple(training))


def test_training_rows_are_the_replay_on_the_calibrated_links():
    fp32, q = training_points()
    rep = compare(_trace((fp32, q)), calibration=CAL)
    rows = {r["bits"]: r for r in rep.training}
    H = CAL.apply(topologies.from_spec(SPEC))
    for bits, point in ((32, fp32), (4, q)):
        want = emulator.replay(make_trace(), H, transport=point.get("replay_transport"), world_size=4)
        r = rows[bits]
        assert r["predicted_s"] == pytest.approx(want.iteration_s, rel=1e-12)
        assert r["predicted_exposed_s"] == pytest.approx(want.exposed_comm_s, rel=1e-12)
        assert r["measured_exposed_s"] == pytest.approx(point.iteration_s - want.compute_s, rel=1e-12)
        pred_tl = r["timeline"]["predicted"]
        assert [b["done"] for b in pred_tl] == pytest.approx([b.end_s for b in want.buckets])
        assert [b["issued"] for b in pred_tl] == pytest.approx([b.issued_s for b in want.buckets])
        assert r["timeline"]["measured"] == point.get("timeline")
    assert rows[32]["rel_error"] == pytest.approx(0.0, abs=1e-12)
    assert rows[4]["rel_error"] == pytest.approx(1 / 1.05 - 1, rel=1e-9)
    assert rows[4]["measured_speedup"] == pytest.approx(fp32.iteration_s / q.iteration_s)
    assert rows[4]["speedup_rel_error"] == pytest.approx(0.05, rel=1e-9)
    assert rep.summary["speedup_max_abs_rel_error"] == pytest.approx(0.05, rel=1e-9)
    # exposed: the step beyond the compute; measured 5% longer steps, all of it exposed
    m, pr = rows[4]["measured_exposed_s"], rows[4]["predicted_exposed_s"]
    assert m - pr == pytest.approx(0.05 * rows[4]["predicted_s"], rel=1e-9)
    assert rows[4]["exposed_rel_error"] == pytest.approx(pr / m - 1, rel=1e-12)


def test_a_point_without_its_trace_has_no_prediction_and_transports_are_named():
    bare = TrainingPoint("mlp", "allgather", 4, iteration_s=1.0, extra={"compute_s": 0.1})
    assert predict_training(bare, topologies.from_spec(SPEC), 4) is None
    assert replay_transport(bare) == "qsgd_allgather"
    assert replay_transport(TrainingPoint("mlp", "allreduce", 16, iteration_s=1.0)) == "fp16"
    assert replay_transport(TrainingPoint("mlp", "scatter_reduce_allgather", 4,
                                          iteration_s=1.0)) == "qsgd_scatter_reduce_allgather"
    rep = compare(_trace((bare,)), calibration=CAL)
    (row,) = rep.training
    assert row["predicted_s"] is None and "timeline" not in row and step_breakdown(row) is None


def test_step_breakdown_line():
    # measured: two collectives that overlap in time count once (50 + 40 ms of stream)
    m = [{"issued": 0.05, "comm_done": 0.10, "done": 0.15},
         {"issued": 0.07, "comm_done": 0.14, "done": 0.21}]
    pr = [{"issued": 0.05, "comm_done": 0.09, "done": 0.14},
          {"issued": 0.12, "comm_done": 0.15, "done": 0.2}]
    row = {"predicted_s": 0.2, "compute_s": 0.1, "measured_exposed_s": 0.12,
           "predicted_exposed_s": 0.1, "timeline": {"measured": m, "predicted": pr}}
    assert step_breakdown(row) == ("compute 100.0 ms; exposed communication 120.0 vs 100.0 ms; "
                                   "collectives busy 90.0 vs 70.0 ms; "
                                   "2 buckets, last done at 210.0 vs 200.0 ms")


def test_timeline_figure_puts_measured_and_predicted_side_by_side(tmp_path):
    fp32, q = training_points()
    rep = compare(_trace((fp32, q)), calibration=CAL)
    row = next(r for r in rep.training if r["bits"] == 4)
    fig = emulator.figures.timeline_comparison(row)
    names = [t.name for t in fig.data]
    assert names == ["encode (in the hook)", "collectives (queued and on the wire)",
                     "decode and average"] * 2
    # left panel measured, right panel the replay; bars start and end where the rows say (ms)
    left, right = fig.data[1], fig.data[4]
    assert (left.xaxis, right.xaxis) == ("x", "x2")
    m, pr = row["timeline"]["measured"], row["timeline"]["predicted"]
    assert list(left.base) == pytest.approx([1e3 * b["issued"] for b in m])
    assert list(right.x) == pytest.approx([1e3 * (b["comm_done"] - b["issued"]) for b in pr])
    assert list(left.y) == ["bucket 0", "bucket 1", "bucket 2"]
    assert len(fig.layout.shapes) == 4          # backward end and step end, on each side
    assert "measured" in fig.layout.title.text and "emulator" in fig.layout.title.text
    # the report's HTML carries one per training row, after the collective figure
    path = tmp_path / "report.html"
    rep.write_html(path)
    text = path.read_text()
    assert text.count("bucket timelines:") == 2 and text.count("Plotly.newPlot(") == 3
    # a row without timelines draws empty panels, not an error
    assert len(emulator.figures.timeline_comparison({"bits": 4}).data) == 0


def test_loaded_collectives_price_the_overlap_with_backward():
    # the harness's sweep again while the ranks compute, 3x slower: compare fits a second set
    # of links to it and the steps' collectives that overlap backward run at that pace
    fp32, q = training_points()
    trace = _trace((fp32, q))
    slow = tuple(CollectivePoint.make(c.op, c.bytes, 3 * c.time_s, 4, extra={"load": "compute"})
                 for c in trace.collectives)
    loaded = MeasuredTrace(environment=trace.environment, collectives=trace.collectives,
                           training=trace.training, loaded=slow)
    plain, with_load = compare(trace), compare(loaded)
    assert "loaded" not in plain.calibration and "loaded" in with_load.calibration
    links = with_load.calibration["loaded"]["links"]["ethernet"]
    assert links["bandwidth"] == pytest.approx(20e6 / 3, rel=0.05)
    for a, b in zip(plain.training, with_load.training):
        assert b["predicted_s"] > a["predicted_s"]
        G = topologies.from_spec(SPEC)
        H = Calibration.from_dict(with_load.calibration).apply(G)
        L = Calibration.from_dict(with_load.calibration["loaded"]).apply(G)
        want = emulator.replay(make_trace(), H, transport=b["replay_transport"], world_size=4,
                               loaded=L)
        assert b["predicted_s"] == pytest.approx(want.iteration_s, rel=1e-12)


def test_the_measured_compute_pace_reaches_the_replay():
    fp32, q = training_points()
    paced = [TrainingPoint(t.model, t.transport, t.bits, t.iteration_s,
                           extra={**t.extra, "compute_pace": 0.8,
                                  "compute_busy_s": t.get("compute_s") / 0.8})
             for t in (fp32, q)]
    rep = compare(_trace(paced), calibration=CAL)
    assert rep.calibration["compute_pace"] == 0.8
    H = CAL.apply(topologies.from_spec(SPEC))
    for row in rep.training:
        want = emulator.replay(make_trace(), H, transport=row["replay_transport"], world_size=4,
                               compute_pace=0.8)
        assert row["predicted_s"] == pytest.approx(want.iteration_s, rel=1e-12)
    assert "compute_pace" not in compare(_trace((fp32, q)), calibration=CAL).calibration
