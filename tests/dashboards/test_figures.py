"""Figure functions on hand-written rows: trace counts, axis titles, values."""
import pytest

from dashboards import figures


def _rows():
    rows = []
    for n in (8, 16, 32):
        rows.append({"topology": "t", "world_size": n, "bits": 32, "transport": "fp32",
                     "iteration_s": 0.1 + 0.01 * n, "throughput_samples_s": 100.0 * n / (1 + n / 64),
                     "speedup_vs_fp32": 1.0, "compute_s": 0.1, "exposed_comm_s": 0.01 * n,
                     "encode_decode_s": 0.0})
        for bits in (4, 8):
            rows.append({"topology": "t", "world_size": n, "bits": bits,
                         "transport": "qsgd_allgather", "iteration_s": 0.1 + 0.002 * n * bits / 4,
                         "throughput_samples_s": 100.0 * n, "speedup_vs_fp32": 1.0 + n / 100,
                         "compute_s": 0.1, "exposed_comm_s": 0.002 * n, "encode_decode_s": 0.003})
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
    assert fig.layout.yaxis.title.text == "throughput (samples/s)"
    assert fig.layout.yaxis.type == "log"


def test_scaling_figure_labels_topologies_when_several():
    rows = _rows() + [dict(r, topology="u") for r in _rows()]
    fig = figures.scaling_figure(rows, "speedup_vs_fp32")
    assert len(fig.data) == 6
    assert any(t.name.endswith("@ u") for t in fig.data)
    assert fig.layout.yaxis.type != "log"


def test_scaling_figure_rejects_unknown_metric():
    with pytest.raises(ValueError, match="metric: unknown scaling metric 'nope'"):
        figures.scaling_figure(_rows(), "nope")


def test_breakdown_stacks_three_parts_at_the_largest_size():
    fig = figures.breakdown_figure(_rows())
    assert [t.name for t in fig.data] == ["compute", "exposed communication", "encode/decode"]
    assert fig.layout.barmode == "stack"
    assert "32 GPUs" in fig.layout.title.text
    comm = fig.data[1]
    by_label = dict(zip(comm.x, comm.y))
    assert by_label["fp32"] == pytest.approx(0.32)
    assert by_label["qsgd_allgather 4-bit"] == pytest.approx(0.064)
    fig8 = figures.breakdown_figure(_rows(), world_size=8)
    assert dict(zip(fig8.data[1].x, fig8.data[1].y))["fp32"] == pytest.approx(0.08)


def test_gantt_draws_each_phase_of_each_bucket():
    pred = {"iteration_s": 1.0, "forward_s": 0.2, "backward_s": 0.5, "buckets": [
        {"index": 0, "ready_s": 0.3, "start_s": 0.3, "encode_end_s": 0.35, "comm_end_s": 0.6,
         "end_s": 0.62},
        {"index": 1, "ready_s": 0.5, "start_s": 0.6, "encode_end": 0.65, "comm_end": 0.9,
         "end": 0.93},
    ]}
    fig = figures.gantt_figure(pred)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"waiting for the stream", "encode", "collective", "decode",
                            "forward", "backward"}
    coll = by_name["collective"]
    assert list(coll.y) == ["bucket 0", "bucket 1"]
    assert list(coll.base) == pytest.approx([0.35, 0.65])
    assert list(coll.x) == pytest.approx([0.25, 0.25])
    assert fig.layout.xaxis.title.text == "time since start of forward (s)"


def test_link_utilization_merges_directions_and_keeps_the_busier():
    result = {"time_s": 2.0, "links": [
        {"u": "a", "v": "b", "bytes": 10, "busy_s": 1.0},
        {"u": "b", "v": "a", "bytes": 30, "utilization": 0.9},
    ]}
    util = figures.link_utilization(result)
    assert util == {("a", "b"): {"bytes": 40.0, "utilization": 0.9}}


def test_topology_figure_has_nodes_by_kind_and_link_hover():
    data = {"name": "tiny", "nodes": [{"id": "g0", "kind": "gpu", "rank": 0},
                                      {"id": "g1", "kind": "gpu", "rank": 1},
                                      {"id": "s", "kind": "switch"}],
            "links": [{"source": "g0", "target": "s", "bandwidth": 25e9, "latency": 1e-6},
                      {"source": "g1", "target": "s", "bandwidth": 25e9, "latency": 1e-6}]}
    pos = {"g0": [0, 0], "g1": [1, 0], "s": [0.5, 1]}
    util = {("g0", "s"): {"bytes": 5e6, "utilization": 1.0}}
    fig = figures.topology_figure(data, pos, util)
    names = [t.name for t in fig.data]
    assert "gpu" in names and "switch" in names
    assert "utilization 0%" in names and "utilization 100%" in names
    hover = next(t for t in fig.data if t.name == "links").text
    assert any("bandwidth 25 GB/s" in h and "latency 1 us" in h and "bytes 5e+06" in h for h in hover)


def test_live_figure_draws_prediction_beside_measured():
    steps = [{"step": i, "time_s": float(i), "metrics": {"iteration_s": 0.1 + 0.001 * i,
                                                          "loss": 2.0 / (i + 1)}}
             for i in range(5)]
    fig = figures.live_figure(steps, "iteration_s", predicted_iteration_s=0.08)
    assert [t.name for t in fig.data] == ["measured", "predicted (emulator)"]
    assert list(fig.data[1].y) == [0.08, 0.08]
    steps[2]["metrics"]["predicted_iteration_s"] = 0.09
    fig = figures.live_figure(steps, "iteration_s", predicted_iteration_s=0.08)
    assert list(fig.data[1].y) == [0.09]
    loss = figures.live_figure(steps, "loss")
    assert len(loss.data) == 1 and loss.data[0].y[-1] == pytest.approx(0.4)
    assert loss.layout.yaxis.title.text == "loss"


def test_validation_figures():
    points = [{"op": "allreduce", "bytes": 2**20, "measured_s": 0.01, "predicted_s": 0.011},
              {"op": "allreduce", "bytes": 2**22, "measured_s": 0.04, "predicted_s": 0.038,
               "rel_error": -0.05},
              {"op": "allgather", "bytes": 2**20, "measured_s": 0.02, "predicted_s": 0.02}]
    fig = figures.validation_scatter(points)
    assert [t.name for t in fig.data] == ["allgather", "allreduce", "y = x"]
    assert fig.data[-1].x[0] == fig.data[-1].y[0]
    assert fig.layout.xaxis.title.text == "measured time (s)"
    err = figures.validation_error_figure(points)
    ar = next(t for t in err.data if t.name == "allreduce")
    assert list(ar.y) == pytest.approx([0.1, -0.05])
