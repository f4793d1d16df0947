"""The figure library on hand-written rows: trace counts, axis titles and ticks, values."""
import dataclasses

import pytest

import emulator
from emulator import Prediction, StudyRow, figures


def _row(**kw) -> StudyRow:
    base = dict(topology="t", topology_name="t", speedup_vs_fp16=None, scaling_efficiency=0.5,
                bytes_per_gpu=1e6, bound="compute", model="m", batch_size=2, device="A100",
                precision="amp-bf16",
                algorithm="ring", source="hand-written")
    return StudyRow(**{**base, **kw})


def _rows():
    rows = []
    for n in (8, 16, 32):
        rows.append(_row(world_size=n, bits=32, transport="fp32", iteration_s=0.1 + 0.01 * n,
                         throughput_samples_s=100.0 * n / (1 + n / 64), speedup_vs_fp32=1.0,
                         compute_s=0.1, exposed_comm_s=0.01 * n, encode_decode_s=0.0))
        for bits in (4, 8):
            rows.append(_row(world_size=n, bits=bits, transport="qsgd_allgather",
                             iteration_s=0.1 + 0.002 * n * bits / 4,
                             throughput_samples_s=100.0 * n, speedup_vs_fp32=1.0 + n / 100,
                             compute_s=0.1, exposed_comm_s=0.002 * n, encode_decode_s=0.003))
    return rows


def test_scaling_figure_one_line_per_configuration_sorted_by_gpus():
    rows = _rows()[::-1]  # unsorted input
    fig = figures.scaling_figure(rows, "throughput_samples_s")
    assert len(fig.data) == 3
    names = {t.name for t in fig.data}
    assert names == {"fp32", "qsgd_allgather 4-bit", "qsgd_allgather 8-bit"}
    for trace in fig.data:
        assert list(trace.x) == [8, 16, 32]
    fp32 = next(t for t in fig.data if t.name == "fp32")
    assert fp32.y[0] == pytest.approx(800 / (1 + 8 / 64))
    assert fig.layout.xaxis.title.text == "GPUs"
    assert list(fig.layout.xaxis.tickvals) == [8, 16, 32]   # ticked at the sizes studied
    assert fig.layout.yaxis.title.text == "throughput (samples/s)"
    assert fig.layout.yaxis.type == "log"


def test_scaling_figure_labels_topologies_when_several():
    rows = _rows() + [dataclasses.replace(r, topology="u") for r in _rows()]
    fig = figures.scaling_figure(rows, "speedup_vs_fp32")
    assert len(fig.data) == 6
    assert any(t.name.endswith("@ u") for t in fig.data)
    assert fig.layout.yaxis.type != "log"


def test_scaling_figure_rejects_unknown_metric():
    with pytest.raises(ValueError, match="metric: unknown scaling metric 'nope'"):
        figures.scaling_figure(_rows(), "nope")


def test_breakdown_stacks_compute_and_exposed_at_the_largest_size():
    fig = figures.breakdown_figure(_rows())
    assert [t.name for t in fig.data] == ["compute", "exposed communication",
                                          "encode/decode (total, partly hidden)"]
    assert fig.layout.barmode == "stack"
    assert "32 GPUs" in fig.layout.title.text
    comm = fig.data[1]
    by_label = dict(zip(comm.x, comm.y))
    assert by_label["fp32"] == pytest.approx(0.32)
    assert by_label["qsgd_allgather 4-bit"] == pytest.approx(0.064)
    fig8 = figures.breakdown_figure(_rows(), world_size=8)
    assert dict(zip(fig8.data[1].x, fig8.data[1].y))["fp32"] == pytest.approx(0.08)


def test_timeline_draws_each_phase_of_each_bucket():
    pred = Prediction.from_dict({
        "iteration_s": 1.0, "compute_s": 0.8, "exposed_comm_s": 0.2, "encode_decode_s": 0.1,
        "forward_s": 0.2, "backward_s": 0.5, "optimizer_s": 0.1, "bytes_per_gpu": 1e6,
        "transport": "qsgd_allgather", "bits": 4, "world_size": 8, "algorithm": "ring",
        "topology": "t", "source": "hand-written", "buckets": [
            {"index": 0, "ready_s": 0.3, "start_s": 0.3, "encode_end_s": 0.35, "comm_end_s": 0.6,
             "end_s": 0.62, "wire_bytes": 10, "comm_s": 0.25, "source": "x"},
            {"index": 1, "ready_s": 0.5, "start_s": 0.6, "encode_end_s": 0.65, "comm_end_s": 0.9,
             "end_s": 0.93, "wire_bytes": 10, "comm_s": 0.25, "source": "x"}]})
    fig = figures.timeline_figure(pred)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"waiting for the stream", "encode", "collective", "decode",
                            "forward", "backward"}
    coll = by_name["collective"]
    assert list(coll.y) == ["bucket 0", "bucket 1"]
    assert list(coll.base) == pytest.approx([0.35, 0.65])
    assert list(coll.x) == pytest.approx([0.25, 0.25])
    assert fig.layout.xaxis.title.text == "time since start of forward (s)"
    assert "qsgd_allgather at 8 GPUs on t" in fig.layout.title.text
    with pytest.raises(emulator.ConfigError, match="'buckets'"):
        Prediction.from_dict({"iteration_s": 1.0})


def test_validation_figures():
    points = [{"op": "allreduce", "bytes": 2**20, "measured_s": 0.01, "predicted_s": 0.011},
              {"op": "allreduce", "bytes": 2**22, "measured_s": 0.04, "predicted_s": 0.038,
               "rel_error": -0.05},
              {"op": "allgather", "bytes": 2**20, "measured_s": 0.02, "predicted_s": 0.02}]
    fig = figures.validation_scatter(points)
    assert [t.name for t in fig.data] == ["allgather", "allreduce", "y = x"]
    assert fig.data[-1].x[0] == fig.data[-1].y[0]
    assert fig.layout.xaxis.title.text == "measured time (s)"
    for p in points:
        p.setdefault("rel_error", (p["predicted_s"] - p["measured_s"]) / p["measured_s"])
    both = figures.validation_figure(points, "switch:4", {"median_abs_rel_error": 0.05,
                                                          "max_abs_rel_error": 0.1})
    assert [t.name for t in both.data] == ["allgather measured", "allgather emulator",
                                           "allgather error", "allreduce measured",
                                           "allreduce emulator", "allreduce error"]
    err = next(t for t in both.data if t.name == "allreduce error")
    assert list(err.y) == pytest.approx([0.1, -0.05])
    assert "on switch:4: held-out median |error| 5.0%, max 10.0%" in both.layout.title.text
