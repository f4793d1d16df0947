"""The dashboard's own figures (topology, live runs) on hand-written data."""
import pytest

from dashboards import figures


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
