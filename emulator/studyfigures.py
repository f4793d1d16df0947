"""Study figures: where QSGD pays (the headline), scaling, the iteration breakdown, a timeline.

Every figure with several topologies is small multiples, one panel per topology side by
side on shared axes, with one legend for all panels (each entry once; clicking it hides the
configuration in every panel). Colour is the transport and dash and marker the bit width
(:func:`emulator.figstyle.series_style`), in every figure. Rows are read by column name
(``topology``, ``world_size``, ``bits``, ``transport``, ``iteration_s``, the metric drawn, ...),
so columns that a study adds later change nothing here. Times are drawn in ms (in s where an
iteration takes 10 s or more, as a CPU-measured one can).

>>> from types import SimpleNamespace as Row       # any object with the columns drawn
>>> from emulator import studyfigures
>>> rows = [Row(topology="switch:{n}", world_size=n, bits=b, transport=t, iteration_s=s,
...             speedup_vs_fp32=f, speedup_vs_fp16=None)
...         for n, b, t, s, f in ((8, 32, "fp32", 0.2, 1.0), (8, 4, "qsgd_allgather", 0.1, 2.0),
...                               (16, 32, "fp32", 0.4, 1.0), (16, 4, "qsgd_allgather", 0.25, 1.6))]
>>> fig = studyfigures.headline_figure(rows)
>>> [t.name for t in fig.data][:2], list(fig.data[0].y), list(fig.data[0].text)
(['best QSGD over fp32 allreduce', 'QSGD all-gather 4-bit'], [2.0, 1.6], ['2.00x', '1.60x'])
"""
from __future__ import annotations

from typing import Sequence

from emulator.figstyle import (COMPUTE_GREY, config_label, gpu_ticks, log_axis,
                               message_figure, series_style, style, transport_colour,
                               transport_name, wrap)

__all__ = ["SCALING_METRICS", "METRIC_UNITS", "BREAKDOWN_PARTS", "TIMELINE_PHASES",
           "headline_figure", "scaling_figure", "breakdown_figure", "timeline_figure",
           "row_label"]

#: Scaling metrics: StudyRow column -> (axis title, log axis?).
SCALING_METRICS: dict[str, tuple[str, bool]] = {
    "throughput_samples_s": ("throughput (samples/s)", True),
    "speedup_vs_fp32": ("speedup over fp32 allreduce (x)", False),
    "iteration_s": ("iteration time (s)", True),
    "scaling_efficiency": ("scaling efficiency", False),
    "bytes_per_gpu": ("bytes per GPU per iteration (bytes)", True),
}
#: The unit of a log metric's tick labels (:func:`emulator.figstyle.si_text`).
METRIC_UNITS: dict[str, str] = {"throughput_samples_s": "", "iteration_s": "s",
                                "bytes_per_gpu": "B"}

#: Parts of one iteration in the breakdown: StudyRow column -> legend name. Compute and the
#: exposed communication add up to the iteration; the codec time is partly hidden behind them.
BREAKDOWN_PARTS: dict[str, str] = {
    "compute_s": "compute",
    "exposed_comm_s": "exposed communication",
}
CODEC_NAME = "encode + decode (total, partly hidden)"

#: Phases of one bucket in a timeline: (start field, end field, legend name).
TIMELINE_PHASES: tuple[tuple[str, str, str], ...] = (
    ("ready_s", "start_s", "waiting for the stream"),
    ("start_s", "encode_end_s", "encode"),
    ("encode_end_s", "comm_end_s", "collective"),
    ("comm_end_s", "end_s", "decode"),
)


def _go():
    import plotly.graph_objects as go

    return go


def row_label(row) -> str:
    """A row's configuration in words (``QSGD all-gather 4-bit``): its legend entry.

    >>> from types import SimpleNamespace as Row
    >>> row_label(Row(transport="qsgd_scatter_reduce_allgather", bits=2))
    'QSGD scatter-reduce-allgather 2-bit'
    """
    return config_label(row.transport, row.bits, getattr(row, "compressed", None))


def _order(rows) -> list:
    """Rows in legend order: transports as the study lists them, widths from wide to narrow."""
    first: dict[str, int] = {}
    for r in rows:
        first.setdefault(r.transport, len(first))
    return sorted(rows, key=lambda r: (first[r.transport], -r.bits))


def _panels(rows, title_of=lambda t: t, shared_y: bool = True):
    """A figure with one column per topology (first-seen order) and its topologies."""
    from plotly.subplots import make_subplots

    tops = list(dict.fromkeys(r.topology for r in rows)) or [""]
    fig = make_subplots(rows=1, cols=len(tops), shared_yaxes=shared_y,
                        horizontal_spacing=0.03 if shared_y else 0.08,
                        subplot_titles=[wrap(title_of(t), max(20, 64 // len(tops))) for t in tops])
    for ann in fig.layout.annotations:
        ann.font = {"size": 12}
    return fig, tops


def _gpu_axis(fig, sizes) -> None:
    vals, text = gpu_ticks(sizes)
    fig.update_xaxes(type="log", tickmode="array", tickvals=vals, ticktext=text,
                     title_text="GPUs")


def _legend_once(fig) -> None:
    """One legend entry per configuration across the panels; a click toggles it everywhere."""
    seen = set()
    for tr in fig.data:
        if tr.showlegend is False and tr.legendgroup is None:
            continue
        key = tr.legendgroup or tr.name
        tr.legendgroup = key
        tr.showlegend = key not in seen and tr.showlegend is not False
        seen.add(key)


def scaling_figure(rows: Sequence, metric: str = "throughput_samples_s"):
    """Scaling curves: ``metric`` against GPUs, one line per configuration, one panel per
    topology.

    Parameters
    ----------
    rows : sequence of StudyRow
    metric : str
        A key of :data:`SCALING_METRICS`.

    Examples
    --------
    >>> import emulator
    >>> fig = emulator.figures.scaling_figure([], "iteration_s")
    >>> fig.layout.yaxis.title.text
    'iteration time (s)'
    """
    if metric not in SCALING_METRICS:
        raise ValueError(f"metric: unknown scaling metric {metric!r}; known: {sorted(SCALING_METRICS)}")
    go = _go()
    ytitle, ylog = SCALING_METRICS[metric]
    usable = [r for r in rows if getattr(r, metric) is not None]
    fig, tops = _panels(usable)
    for col, top in enumerate(tops, start=1):
        series: dict[str, list] = {}
        for r in _order([r for r in usable if r.topology == top]):
            series.setdefault(row_label(r), []).append(r)
        for label, srs in series.items():
            srs = sorted(srs, key=lambda r: r.world_size)
            st = series_style(srs[0].transport, srs[0].bits)
            fig.add_trace(go.Scatter(
                x=[r.world_size for r in srs], y=[getattr(r, metric) for r in srs],
                mode="lines+markers", name=label, legendgroup=label,
                line={"color": st["color"], "dash": st["dash"], "width": 2},
                marker={"color": st["color"], "symbol": st["symbol"], "size": 7},
                hovertemplate="%{x} GPUs<br>%{y:.4g}<extra>" + label + "</extra>",
            ), row=1, col=col)
    title = ytitle.split(" (")[0] + " against GPUs"
    if metric == "speedup_vs_fp32":
        title = "speedup over fp32 allreduce against GPUs (above 1.0x: faster than fp32)"
    style(fig, wrap(title, 80), "GPUs", ytitle)
    _legend_once(fig)
    _gpu_axis(fig, [r.world_size for r in usable])
    if ylog:
        log_axis(fig, [getattr(r, metric) for r in usable], METRIC_UNITS.get(metric, ""))
    if metric == "speedup_vs_fp32" and usable:
        fig.add_hline(y=1.0, line_dash="dash", line_color="#777", line_width=1)
        ys = [r.speedup_vs_fp32 for r in usable]
        fig.update_yaxes(ticksuffix="x", tickformat=".1f" if max(ys) - min(ys) >= 0.5 else ".2f")
    if metric == "scaling_efficiency":
        fig.update_yaxes(tickformat=".0%")
    fig.update_layout(height=520)
    if not usable:
        fig.add_annotation(text="no rows", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def headline_figure(rows: Sequence):
    """Where QSGD pays, at a glance: per topology, the fastest QSGD configuration's speedup
    over fp32 and over fp16 allreduce against GPUs, with the break-even line at 1.0x.

    The lines are coloured as their baseline transport (fp32, fp16); each point's marker is
    the winning QSGD configuration (colour its transport, symbol its width), named in the
    legend and in the hover text; each line's speedup is written at its last point (the most
    GPUs) and at its best where that is above 1.0x. The y axis spans at least 0.9x..1.1x, so that a few per cent
    either side of break-even looks like what it is.

    Parameters
    ----------
    rows : sequence of StudyRow
        Uses ``topology``, ``world_size``, ``transport``, ``bits``, ``iteration_s``,
        ``speedup_vs_fp32`` and ``speedup_vs_fp16``.

    Examples
    --------
    >>> from emulator import figures
    >>> figures.headline_figure([]).layout.annotations[0].text
    'no rows'
    """
    go = _go()
    qsgd = [r for r in rows if getattr(r, "compressed", r.transport.startswith("qsgd"))]
    if not qsgd:
        return message_figure("no rows" if not rows else "the study has no QSGD configuration",
                              "where QSGD pays")
    fig, tops = _panels(rows)
    speeds = []
    for col, top in enumerate(tops, start=1):
        best = {}
        for r in qsgd:
            if r.topology == top and (r.world_size not in best
                                      or r.iteration_s < best[r.world_size].iteration_s):
                best[r.world_size] = r
        win = [best[w] for w in sorted(best)]
        for rank, (base, key, pos) in enumerate((("fp32", "speedup_vs_fp32", "top left"),
                                                 ("fp16", "speedup_vs_fp16", "bottom left"))):
            pts = [(r, getattr(r, key)) for r in win if getattr(r, key, None) is not None]
            if not pts:
                continue
            speeds += [s for _, s in pts]
            name = f"best QSGD over {transport_name(base)}"
            # written on the line: its last point (the most GPUs) and its best where QSGD
            # pays; a value that reads the same over fp32 is written once (the fp32 line's);
            # hover for the rest
            ys = [s for _, s in pts]
            keep = {len(pts) - 1} | ({ys.index(max(ys))} if max(ys) > 1 else set())
            text = [f"{s:.2f}x" if i in keep and (
                base == "fp32" or getattr(r, "speedup_vs_fp32", None) is None
                or f"{s:.2f}" != f"{r.speedup_vs_fp32:.2f}") else ""
                for i, (r, s) in enumerate(pts)]
            fig.add_trace(go.Scatter(
                x=[r.world_size for r, _ in pts], y=[s for _, s in pts], name=name,
                legendgroup=name, legendrank=1 + rank, mode="lines+markers+text",
                line={"color": transport_colour(base), "width": 2.5},
                # markers as big as the winners' but unseen: the text clears those
                marker={"size": 13, "color": "rgba(0,0,0,0)"},
                text=text, textposition=pos,
                textfont={"size": 11, "color": transport_colour(base)},
                customdata=[row_label(r) for r, _ in pts],
                hovertemplate="%{x} GPUs: %{customdata}<br>%{y:.2f}x " + base
                              + "<extra></extra>"), row=1, col=col)
            for r, s in pts:       # the winner of each point: one marker trace per configuration
                st, label = series_style(r.transport, r.bits), row_label(r)
                fig.add_trace(go.Scatter(
                    x=[r.world_size], y=[s], mode="markers", name=label, legendgroup=label,
                    legendrank=10, marker={"color": st["color"], "symbol": st["symbol"], "size": 11,
                            "line": {"color": "#222", "width": 1}},
                    hovertemplate=f"%{{x}} GPUs: {label}<br>%{{y:.2f}}x {base}<extra></extra>"),
                    row=1, col=col)
    style(fig, "Where QSGD pays: the fastest QSGD configuration's speedup over fp32 and fp16",
          "GPUs", "speedup of the best QSGD (x)")
    _legend_once(fig)
    _gpu_axis(fig, [r.world_size for r in qsgd])
    # at least 0.9x..1.1x: a few per cent either side of break-even must look like it
    lo, hi = min(speeds + [0.9]), max(speeds + [1.1])
    pad = 0.1 * (hi - lo)
    fig.update_yaxes(range=[lo - pad, hi + pad], ticksuffix="x", zeroline=False,
                     tickformat=".2f" if hi - lo < 0.5 else ".1f")
    fig.add_hline(y=1.0, line_dash="dash", line_color="#777", line_width=1)
    fig.add_annotation(text="break-even: above it, QSGD is faster", xref="x domain", yref="y",
                       x=0.01, y=1.0, xanchor="left", yanchor="bottom", showarrow=False,
                       font={"size": 11, "color": "#555"})
    # a few entries: in a row under the panels, which leaves them the figure's width
    fig.update_layout(height=470, margin={"b": 100}, legend={
        "orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0,
        "xanchor": "left"})
    return fig


def breakdown_figure(rows: Sequence, world_size: int | None = None):
    """One iteration of each configuration at ``world_size`` (the largest in ``rows`` by
    default), as horizontal bars in ms: compute (grey) and the exposed communication
    (coloured by transport) stacked, the codec's total (partly hidden behind them) marked;
    one panel per topology, the configurations named once on the left.

    Examples
    --------
    >>> from types import SimpleNamespace as Row
    >>> from emulator import figures
    >>> fig = figures.breakdown_figure([Row(topology="t", world_size=8, bits=32, transport="fp32",
    ...     compute_s=0.1, exposed_comm_s=0.02, encode_decode_s=0.0, iteration_s=0.12)])
    >>> fig.data[0].name, fig.data[0].orientation, list(fig.data[1].x)
    ('compute', 'h', [20.0])
    """
    go = _go()
    sizes = sorted({r.world_size for r in rows})
    if not sizes:
        return message_figure("no rows", "iteration time breakdown")
    if world_size is None:
        world_size = sizes[-1]
    at = _order([r for r in rows if r.world_size == world_size])
    labels = list(dict.fromkeys(row_label(r) for r in at))
    k, unit = _time_unit(max(r.iteration_s for r in at))
    fig, tops = _panels(at)
    for col, top in enumerate(tops, start=1):
        cell = {row_label(r): r for r in at if r.topology == top}
        names = [n for n in labels if n in cell]
        fig.add_trace(go.Bar(
            y=names, x=[k * cell[n].compute_s for n in names], orientation="h",
            name="compute", legendgroup="compute", marker_color=COMPUTE_GREY,
            hovertemplate=f"%{{y}}<br>compute %{{x:.3g}} {unit}<extra></extra>"),
            row=1, col=col)
        for transport in dict.fromkeys(cell[n].transport for n in names):
            mine = [n for n in names if cell[n].transport == transport]
            fig.add_trace(go.Bar(
                y=mine, x=[k * cell[n].exposed_comm_s for n in mine], orientation="h",
                name=f"exposed communication, {transport_name(transport)}",
                legendgroup=f"exposed {transport}", marker_color=transport_colour(transport),
                hovertemplate=f"%{{y}}<br>exposed communication %{{x:.3g}} {unit}"
                              "<extra></extra>"),
                row=1, col=col)
        coded = [n for n in names if cell[n].encode_decode_s > 0]
        if coded:
            fig.add_trace(go.Scatter(
                y=coded, x=[k * cell[n].encode_decode_s for n in coded], mode="markers",
                name=CODEC_NAME, legendgroup="codec",
                marker={"symbol": "line-ns", "size": 16, "color": "#000",
                        "line": {"width": 3, "color": "#000"}},
                hovertemplate=f"%{{y}}<br>encode + decode %{{x:.3g}} {unit}<extra></extra>"),
                row=1, col=col)
    for col, top in enumerate(tops, start=1):   # the iteration, written at the end of its bar
        cell = {row_label(r): r for r in at if r.topology == top}
        names = [n for n in labels if n in cell]
        ends = [k * (cell[n].compute_s + cell[n].exposed_comm_s) for n in names]
        fig.add_trace(go.Scatter(
            y=names, x=ends, mode="text", text=[_ms(cell[n].iteration_s, unit) for n in names],
            textposition="middle right", textfont={"size": 11, "color": "#444"},
            showlegend=False, hoverinfo="skip", name="iteration"), row=1, col=col)
        fig.update_xaxes(range=[0, 1.3 * max(ends + [1e-9])], row=1, col=col)
    fig.update_layout(barmode="stack", height=230 + 28 * len(labels), bargap=0.25)
    fig.update_yaxes(categoryorder="array", categoryarray=labels, autorange="reversed",
                     automargin=True)
    style(fig, f"One iteration at {world_size} GPUs: compute and exposed communication ({unit})",
          f"{unit} per iteration", "")
    _legend_once(fig)
    return fig


def _time_unit(longest_s: float) -> tuple[float, str]:
    """(scale, unit) of a time axis whose longest time is ``longest_s`` seconds: ms below 10 s."""
    return (1e3, "ms") if longest_s < 10 else (1.0, "s")


def _ms(seconds: float, unit: str = "ms") -> str:
    """``"147 ms"``, ``"7,150 ms"``, ``"4.2 ms"`` (or in s): 3 significant figures, no exponent."""
    v = seconds * (1e3 if unit == "ms" else 1.0)
    return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"


def _tint(colour: str, share: float, towards: str = "#ffffff") -> str:
    """``colour`` (#rrggbb) mixed with ``towards`` (white: lighter, black: darker);
    ``share`` is how much of ``towards`` goes in."""
    a = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    b = [int(towards[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + share * (y - x)):02x}" for x, y in zip(a, b))


def timeline_figure(prediction, label: str = ""):
    """Per-bucket timeline of one iteration (a Gantt chart, ms from the start of forward):
    forward and backward, and for each gradient bucket its wait for the stream, encode,
    collective and decode, coloured as its transport.

    Parameters
    ----------
    prediction : Prediction
        From :func:`emulator.replay` (or :meth:`Study.prediction`).
    label : str
        Names what is shown in the title's second line; by default the configuration, the
        GPUs and the topology of ``prediction``.

    Examples
    --------
    >>> import emulator
    >>> pred = emulator.Prediction.from_dict({
    ...     "iteration_s": 0.01, "compute_s": 0.008, "exposed_comm_s": 0.002,
    ...     "encode_decode_s": 0.001, "forward_s": 0.003, "backward_s": 0.005,
    ...     "optimizer_s": 0.0, "bytes_per_gpu": 1e6, "transport": "qsgd_allgather", "bits": 4,
    ...     "world_size": 8, "algorithm": "nccl", "topology": "switch:8", "source": "doc",
    ...     "buckets": [{"index": 0, "ready_s": 0.004, "start_s": 0.004, "encode_end_s": 0.005,
    ...                  "comm_end_s": 0.009, "end_s": 0.0095, "wire_bytes": 10, "comm_s": 0.004,
    ...                  "source": "doc"}]})
    >>> fig = emulator.figures.timeline_figure(pred)
    >>> fig.layout.title.text.split("<br>")[1], round(fig.data[2].x[0], 6)   # ms
    ('QSGD all-gather 4-bit at 8 GPUs on switch:8', 4.0)
    """
    go = _go()
    fig = go.Figure()
    buckets = prediction.buckets
    colour = transport_colour(prediction.transport)
    k, unit = _time_unit(prediction.iteration_s)
    shades = {"waiting for the stream": "#f2f2f2", "encode": _tint(colour, 0.6),
              "collective": colour, "decode": _tint(colour, 0.4, "#000000")}
    for start, end, name in TIMELINE_PHASES:
        fig.add_trace(go.Bar(
            y=[f"bucket {b.index}" for b in buckets],
            x=[k * max(getattr(b, end) - getattr(b, start), 0.0) for b in buckets],
            base=[k * getattr(b, start) for b in buckets], orientation="h", name=name,
            marker={"color": shades[name], "line": {"color": "#999", "width": 0.5}},
            hovertemplate="%{y}<br>" + name + f": %{{base:.3g}} {unit} + %{{x:.3g}} {unit}"
                          "<extra></extra>",
        ))
    fig.add_trace(go.Bar(y=["compute"], x=[k * prediction.forward_s], base=[0.0],
                         orientation="h", name="forward", marker_color="#e0e0e0"))
    fig.add_trace(go.Bar(y=["compute"], x=[k * prediction.backward_s],
                         base=[k * prediction.forward_s], orientation="h", name="backward",
                         marker_color="#a8a8a8"))
    fig.add_vline(x=k * prediction.iteration_s, line_dash="dash",
                  annotation_text=f"iteration ends: {_ms(prediction.iteration_s, unit)}")
    fig.update_layout(barmode="overlay", height=max(320, 200 + 26 * (len(buckets) + 1)))
    fig.update_yaxes(autorange="reversed", automargin=True)
    what = label or (f"{config_label(prediction.transport, prediction.bits)} at "
                     f"{prediction.world_size} GPUs on {prediction.topology}")
    return style(fig, "One iteration, bucket by bucket: when each gradient bucket is encoded, "
                 f"sent and decoded<br>{wrap(what, 70)}", f"{unit} since the start of forward", "")
