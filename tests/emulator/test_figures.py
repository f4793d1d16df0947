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


def _axes(fig, letter):
    return [fig.layout[k] for k in fig.layout if k.startswith(letter + "axis")]


def test_scaling_figure_one_line_per_configuration_sorted_by_gpus():
    rows = _rows()[::-1]  # unsorted input
    fig = figures.scaling_figure(rows, "throughput_samples_s")
    assert len(fig.data) == 3
    # legend order: transports as the study lists them (here reversed), wide to narrow
    assert [t.name for t in fig.data] == ["QSGD all-gather 8-bit", "QSGD all-gather 4-bit",
                                          "fp32 allreduce"]
    for trace in fig.data:
        assert list(trace.x) == [8, 16, 32]
    fp32 = next(t for t in fig.data if t.name == "fp32 allreduce")
    assert fp32.y[0] == pytest.approx(800 / (1 + 8 / 64))
    assert fig.layout.xaxis.title.text == "GPUs"
    assert list(fig.layout.xaxis.tickvals) == [8, 16, 32]   # ticked at the sizes studied
    assert fig.layout.yaxis.title.text == "throughput (samples/s)"
    assert fig.layout.yaxis.type == "log"
    # the log axis is ticked at 1-2-5 steps with SI labels, never at plotly's minor ticks
    ys = [y for t in fig.data for y in t.y]
    assert fig.layout.yaxis.tickmode == "array"
    assert min(ys) == pytest.approx(800 / 1.125) and max(ys) == pytest.approx(3200)
    assert list(fig.layout.yaxis.ticktext) == ["1k", "2k"]


def test_colour_is_the_transport_and_dash_the_width_in_every_figure():
    rows = _rows()
    scaling = figures.scaling_figure(rows, "throughput_samples_s")
    speedup = figures.scaling_figure(rows, "speedup_vs_fp32")
    for fig in (scaling, speedup):
        style = {t.name: (t.line.color, t.line.dash, t.marker.symbol) for t in fig.data}
        assert style["QSGD all-gather 8-bit"][0] == style["QSGD all-gather 4-bit"][0]
        assert style["QSGD all-gather 8-bit"][1:] != style["QSGD all-gather 4-bit"][1:]
        assert style["fp32 allreduce"][0] != style["QSGD all-gather 4-bit"][0]
        assert len(set(style.values())) == len(style)       # no two lines look alike
    same = {t.name: (t.line.color, t.line.dash) for t in scaling.data}
    assert same == {t.name: (t.line.color, t.line.dash) for t in speedup.data}
    bars = figures.breakdown_figure(rows)
    exposed = next(t for t in bars.data if t.name.endswith("QSGD all-gather"))
    assert exposed.marker.color == same["QSGD all-gather 4-bit"][0]


def test_scaling_figure_has_a_panel_per_topology_and_one_legend():
    rows = _rows() + [dataclasses.replace(r, topology="u") for r in _rows()]
    fig = figures.scaling_figure(rows, "speedup_vs_fp32")
    assert len(fig.data) == 6
    assert {t.xaxis for t in fig.data} == {"x", "x2"}                  # two panels
    assert [a.text for a in fig.layout.annotations if a.text in ("t", "u")] == ["t", "u"]
    shown = [t.name for t in fig.data if t.showlegend]
    assert sorted(shown) == sorted(set(t.name for t in fig.data))      # each entry once
    # a legend click hides a configuration in both panels
    assert all(t.legendgroup == t.name for t in fig.data)
    assert fig.layout.yaxis.type != "log"
    assert any(s.y0 == 1.0 for s in fig.layout.shapes)                 # break-even


def test_scaling_figure_rejects_unknown_metric():
    with pytest.raises(ValueError, match="metric: unknown scaling metric 'nope'"):
        figures.scaling_figure(_rows(), "nope")


def test_headline_shows_the_best_qsgd_speedup_against_fp32_and_fp16_per_topology():
    rows = [dataclasses.replace(r, speedup_vs_fp16=None if r.transport == "fp32"
                                else 0.9 * r.speedup_vs_fp32) for r in _rows()]
    rows += [dataclasses.replace(r, topology="u") for r in rows]
    fig = figures.headline_figure(rows)
    lines = {(t.name, t.xaxis): t for t in fig.data if t.mode == "lines+markers+text"}
    assert set(lines) == {(f"best QSGD over {b} allreduce", x) for b in ("fp32", "fp16")
                          for x in ("x", "x2")}
    # the fastest QSGD row of each size: 8-bit and 4-bit tie on speed at 8 GPUs (the first)
    best = {n: min((r for r in rows if r.topology == "t" and r.world_size == n
                    and r.transport != "fp32"), key=lambda r: r.iteration_s) for n in (8, 16, 32)}
    fp32 = lines[("best QSGD over fp32 allreduce", "x")]
    assert list(fp32.x) == [8, 16, 32]
    assert list(fp32.y) == pytest.approx([best[n].speedup_vs_fp32 for n in (8, 16, 32)])
    # written on the line: the last point and the best (here the same); hover for the rest
    assert list(fp32.text) == ["", "", f"{best[32].speedup_vs_fp32:.2f}x"]
    fp16 = lines[("best QSGD over fp16 allreduce", "x")]
    assert list(fp16.y) == pytest.approx([0.9 * best[n].speedup_vs_fp32 for n in (8, 16, 32)])
    # the winners are markers in the legend, coloured and shaped as everywhere else
    winners = [t for t in fig.data if t.mode == "markers" and t.showlegend]
    assert [t.name for t in winners] == ["QSGD all-gather 4-bit"]
    style = figures.series_style("qsgd_allgather", 4)
    assert (winners[0].marker.color, winners[0].marker.symbol) == (style["color"], style["symbol"])
    assert any(s.y0 == 1.0 for s in fig.layout.shapes)                 # break-even
    assert "Where QSGD pays" in fig.layout.title.text
    no_qsgd = figures.headline_figure([r for r in rows if r.transport == "fp32"])
    assert "no QSGD configuration" in no_qsgd.layout.annotations[0].text


def test_breakdown_bars_are_horizontal_in_ms_at_the_largest_size():
    fig = figures.breakdown_figure(_rows())
    assert [t.name for t in fig.data] == [
        "compute", "exposed communication, fp32 allreduce",
        "exposed communication, QSGD all-gather", "encode + decode (total, partly hidden)",
        "iteration"]
    # each bar ends in its iteration time, written there
    assert list(fig.data[4].text) == ["420 ms", "228 ms", "164 ms"]
    assert not fig.data[4].showlegend
    assert fig.layout.barmode == "stack"
    assert all(t.orientation == "h" for t in fig.data[:3])
    assert "32 GPUs" in fig.layout.title.text
    compute = dict(zip(fig.data[0].y, fig.data[0].x))
    assert compute["fp32 allreduce"] == pytest.approx(100.0)            # ms
    assert dict(zip(fig.data[1].y, fig.data[1].x)) == {"fp32 allreduce": pytest.approx(320.0)}
    assert dict(zip(fig.data[2].y, fig.data[2].x))["QSGD all-gather 4-bit"] == pytest.approx(64.0)
    assert list(fig.layout.yaxis.categoryarray) == [
        "fp32 allreduce", "QSGD all-gather 8-bit", "QSGD all-gather 4-bit"]
    fig8 = figures.breakdown_figure(_rows(), world_size=8)
    assert dict(zip(fig8.data[1].y, fig8.data[1].x))["fp32 allreduce"] == pytest.approx(80.0)


def test_log_ticks_are_1_2_5_steps_with_units():
    from emulator.figstyle import log_ticks, si_text

    assert log_ticks(130, 1900) == ([200.0, 500.0, 1000.0], ["200", "500", "1k"])
    assert log_ticks(3e-3, 0.2, "s")[1] == ["5 ms", "10 ms", "20 ms", "50 ms", "100 ms",
                                             "200 ms"]
    assert log_ticks(1e4, 1e9, "B")[1] == ["10 kB", "100 kB", "1 MB", "10 MB", "100 MB", "1 GB"]
    values, _ = log_ticks(7, 7.5)                                      # narrow: one either side
    assert values == [5.0, 10.0]
    for lo, hi in ((1, 3), (0.02, 900), (123, 4.5e7)):
        for v in log_ticks(lo, hi)[0]:
            assert f"{v:.0e}"[0] in "125"
    assert si_text(2.5e6) == "2.5M" and si_text(1024) == "1.02k"
    with pytest.raises(ValueError, match="log_ticks: lo and hi must be finite and > 0"):
        log_ticks(0, 10)


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
    assert list(coll.base) == pytest.approx([350.0, 650.0])            # ms
    assert list(coll.x) == pytest.approx([250.0, 250.0])
    assert coll.marker.color == figures.series_style("qsgd_allgather", 4)["color"]
    assert fig.layout.xaxis.title.text == "ms since the start of forward"
    # the title says what is shown, then which configuration, on a line of its own
    assert fig.layout.title.text.startswith("One iteration, bucket by bucket")
    assert "<br>QSGD all-gather 4-bit at 8 GPUs on t" in fig.layout.title.text
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
    assert "on switch:4: held-out median |error| 5.0%, max 10.0%" in \
        both.layout.title.text.replace("<br>", " ")
    # log axes at 1-2-5 steps with units, as every figure of the library
    assert list(both.layout.xaxis2.ticktext) == ["1 MB", "2 MB", "5 MB"]
    assert list(fig.layout.yaxis.ticktext) == ["10 ms", "20 ms", "50 ms"]
