"""The figure library: study and validation figures as pure functions, shared by ``report.html``
and the dashboard.

Inputs are the typed results (:class:`~emulator.StudyRow`, :class:`~emulator.Prediction`) or
the points and training rows of a :class:`~emulator.ValidationReport`; the output is a
``plotly.graph_objects.Figure``. Nothing here simulates or reads files. plotly is imported by
the functions, so ``import emulator`` stays cheap.

The study figures (:func:`headline_figure`, :func:`scaling_figure`, :func:`breakdown_figure`,
:func:`timeline_figure`) live in :mod:`emulator.studyfigures` and the look they share (colour
= transport, dash and marker = bit width, 1-2-5 log ticks with units, wrapped titles) in
:mod:`emulator.figstyle`; this module is their one public face, with the validation and
recommendation figures.

>>> from emulator import figures
>>> figures.message_figure("no study yet", "scaling").layout.annotations[0].text
'no study yet'
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Sequence

from emulator.figstyle import (BIT_DASHES, BIT_SYMBOLS, TRANSPORT_COLOURS, config_label,
                               log_axis, log_ticks, message_figure, series_style, style, wrap)
from emulator.studyfigures import (BREAKDOWN_PARTS, SCALING_METRICS, TIMELINE_PHASES,
                                   breakdown_figure, headline_figure, row_label, scaling_figure,
                                   timeline_figure)

__all__ = ["PALETTE", "TRANSPORT_COLOURS", "BIT_DASHES", "BIT_SYMBOLS", "SCALING_METRICS",
           "BREAKDOWN_PARTS", "TIMELINE_PHASES", "series_style", "config_label", "row_label",
           "log_ticks", "style", "message_figure", "headline_figure", "scaling_figure",
           "breakdown_figure", "timeline_figure", "validation_figure", "validation_scatter",
           "COMPARISON_PHASES", "timeline_comparison", "recommend_front_figure",
           "recommend_bits_figure"]

#: Colour cycle of the figures whose series are not configurations (validation ops, the
#: recommendation's points); study figures colour by transport (:data:`TRANSPORT_COLOURS`).
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)


def _go():
    import plotly.graph_objects as go

    return go


def validation_figure(points: Sequence[Mapping[str, Any]], topology: str = "",
                      summary: Mapping[str, Any] | None = None):
    """Measured and predicted seconds per message size, per op (log-log), and the relative
    error ``(predicted - measured) / measured`` below; fitted points are open markers.

    Parameters
    ----------
    points : sequence of dict
        ``ValidationReport.points``: ``op``, ``bytes``, ``measured_s``, ``predicted_s``,
        ``rel_error``, ``held_out``.
    topology : str
        Named in the title.
    summary : dict, optional
        ``ValidationReport.summary``: its held-out median and max error go in the title.
    """
    go = _go()
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35],
                        vertical_spacing=0.06)
    for i, op in enumerate(sorted({p["op"] for p in points})):
        pts = sorted((p for p in points if p["op"] == op), key=lambda p: p["bytes"])
        c = PALETTE[i % len(PALETTE)]
        x = [p["bytes"] for p in pts]
        fig.add_trace(go.Scatter(x=x, y=[p["measured_s"] for p in pts], name=f"{op} measured",
                                 mode="markers", marker={"color": c, "size": 9, "symbol": [
                                     "circle" if p.get("held_out", True) else "circle-open"
                                     for p in pts]}), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[p["predicted_s"] for p in pts], name=f"{op} emulator",
                                 mode="lines", line={"color": c, "dash": "dash"}), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[p["rel_error"] for p in pts], name=f"{op} error",
                                 mode="lines+markers", line={"color": c}, showlegend=False),
                      row=2, col=1)
    title = wrap(f"emulator vs measured on {topology}" if topology else "emulator vs measured", 60)
    med = (summary or {}).get("median_abs_rel_error")
    if med is not None:
        title += f":<br>held-out median |error| {med:.1%}, max {summary['max_abs_rel_error']:.1%}"
    style(fig, title, "", "time (s)")
    fig.update_layout(height=640)
    log_axis(fig, [p["bytes"] for p in points], "B", "x")
    fig.update_xaxes(title_text="message size (bytes, nccl-tests convention)", row=2, col=1)
    log_axis(fig, [p.get(k) for p in points for k in ("measured_s", "predicted_s")], "s",
             row=1, col=1)
    fig.update_yaxes(title_text="(pred - meas) / meas", tickformat=".0%", row=2, col=1)
    return fig


def validation_scatter(points: Sequence[Mapping[str, Any]]):
    """Predicted against measured seconds, one trace per op, with the y = x line (log axes)."""
    go = _go()
    fig = go.Figure()
    by_op: dict[str, list] = defaultdict(list)
    for p in points:
        by_op[str(p.get("op", "?"))].append(p)
    values = [float(p[k]) for p in points for k in ("measured_s", "predicted_s") if p.get(k)]
    for i, op in enumerate(sorted(by_op)):
        pts = by_op[op]
        fig.add_trace(go.Scatter(
            x=[p["measured_s"] for p in pts], y=[p["predicted_s"] for p in pts], mode="markers",
            name=op, marker={"color": PALETTE[i % len(PALETTE)], "size": 9,
                             "symbol": ["circle-open" if p.get("held_out") is False else "circle"
                                        for p in pts]},
            text=[f"{op} {int(p['bytes'])} bytes" for p in pts],
            hovertemplate="%{text}<br>measured %{x:.4g} s<br>predicted %{y:.4g} s<extra></extra>",
        ))
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x",
                                 line={"color": "black", "dash": "dot"}))
    style(fig, "predicted vs measured", "measured time (s)", "predicted time (s)")
    if values:
        log_axis(fig, [lo, hi], "s", "x")
        log_axis(fig, [lo, hi], "s", "y")
    return fig


#: Phases of a bucket in a measured-against-predicted timeline, in drawing order:
#: (start key, end key, legend name, colour).
COMPARISON_PHASES = (
    ("ready", "issued", "encode (in the hook)", "#ff7f0e"),
    ("issued", "comm_done", "collectives (queued and on the wire)", "#1f77b4"),
    ("comm_done", "done", "decode and average", "#2ca02c"),
)


def _training_label(row: Mapping[str, Any]) -> str:
    t = row.get("replay_transport") or row.get("transport", "")
    return f"{row.get('model', '')} {t} {row.get('bits', '')} bits".strip()


def timeline_comparison(row: Mapping[str, Any]):
    """Measured against predicted bucket timelines of one training step, side by side.

    Parameters
    ----------
    row : dict
        A ValidationReport ``training`` row: ``timeline`` with ``measured`` and ``predicted``
        lists of buckets (``bucket``, ``ready``, ``issued``, ``comm_done``, ``done``; seconds
        from the step's start), ``measured_backward_end``, ``predicted_backward_end``,
        ``measured_iteration``, ``predicted_iteration`` (seconds); ``model``, ``transport``,
        ``bits``, ``measured_s``, ``predicted_s`` for the title.

    Returns
    -------
    plotly.graph_objects.Figure
        Two panels on one time axis (ms): measured on the left, the emulator on the right; one
        row per bucket with its phases, dashed lines at the end of backward and of the step.

    Examples
    --------
    >>> from emulator import figures
    >>> row = {"model": "mlp", "transport": "allgather", "bits": 4, "timeline": {
    ...     "measured": [{"bucket": 0, "ready": 0.01, "issued": 0.012, "comm_done": 0.03,
    ...                   "done": 0.035}],
    ...     "predicted": [{"bucket": 0, "ready": 0.01, "issued": 0.011, "comm_done": 0.028,
    ...                    "done": 0.031}]}}
    >>> fig = figures.timeline_comparison(row)
    >>> [t.name for t in fig.data][:3]
    ['encode (in the hook)', 'collectives (queued and on the wire)', 'decode and average']
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    tl = row.get("timeline") or {}
    sides = (("measured", tl.get("measured") or []), ("emulator", tl.get("predicted") or []))
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, shared_xaxes=True,
                        subplot_titles=("measured", "emulator (replay)"), horizontal_spacing=0.04)
    for col, (side, buckets) in enumerate(sides, start=1):
        ys = [f"bucket {b.get('bucket', i)}" for i, b in enumerate(buckets)]
        for a, z, name, colour in COMPARISON_PHASES:
            keep = [(y, b) for y, b in zip(ys, buckets) if b.get(a) is not None and b.get(z) is not None]
            if not keep:
                continue
            fig.add_trace(go.Bar(
                y=[y for y, _ in keep], x=[1e3 * max(0.0, b[z] - b[a]) for _, b in keep],
                base=[1e3 * b[a] for _, b in keep], orientation="h", name=name,
                marker_color=colour, legendgroup=name, showlegend=col == 1,
                hovertemplate="%{y}<br>" + name + ": %{base:.1f} ms + %{x:.1f} ms<extra>" + side
                              + "</extra>"), row=1, col=col)
        key = "measured" if side == "measured" else "predicted"
        for what, dash in (("backward_end", "dot"), ("iteration", "dash")):
            x = tl.get(f"{key}_{what}")
            if x is not None:
                fig.add_vline(x=1e3 * float(x), line_dash=dash, line_color="#555", row=1, col=col,
                              annotation_text="backward ends" if what == "backward_end" else "step ends",
                              annotation_position="top")
    title = f"bucket timelines: {_training_label(row)}"
    if row.get("measured_s") is not None and row.get("predicted_s") is not None:
        title += (f" (step measured {1e3 * row['measured_s']:.1f} ms, emulator "
                  f"{1e3 * row['predicted_s']:.1f} ms)")
    for ann in fig.layout.annotations[:2]:      # the panel titles, above the lines' labels
        ann.yshift = 16
    style(fig, wrap(title, 90), "ms from the start of the step", "")
    fig.update_layout(barmode="overlay",
                      height=160 + 40 * max(len(sides[0][1]), len(sides[1][1]), 1))
    fig.update_layout(title_pad_b=fig.layout.title.pad.b + 16)
    fig.update_yaxes(autorange="reversed")
    return fig


def recommend_front_figure(rec: Mapping[str, Any]):
    """Speedup over fp32 against variance increase: the Pareto front of a recommendation
    (:meth:`emulator.Recommendation.to_dict`), uniform widths and the recommended point marked.

    >>> from emulator import figures
    >>> rec = {"fp32_s": 2.0, "world_size": 8, "topology": "t",
    ...        "front": [{"iteration_s": 1.0, "variance": 0.5, "uniform": True, "bits": [2],
    ...                   "transport": "qsgd_allgather"}],
    ...        "best": {"iteration_s": 1.0, "variance": 0.5, "bits": [2], "transport": "qsgd_allgather"}}
    >>> [t.name for t in figures.recommend_front_figure(rec).data]
    ['Pareto front', 'uniform widths', 'recommended']
    """
    go = _go()
    fp32 = rec["fp32_s"]

    def pts(cands):
        return ([c["variance"] for c in cands], [fp32 / c["iteration_s"] for c in cands],
                [f"{c['transport']} {c['bits']}" for c in cands])

    fig = go.Figure()
    x, y, text = pts(rec["front"])
    fig.add_scatter(x=x, y=y, text=text, mode="lines+markers", name="Pareto front",
                    line={"color": PALETTE[0]})
    x, y, text = pts([c for c in rec["front"] if c.get("uniform")])
    fig.add_scatter(x=x, y=y, text=text, mode="markers", name="uniform widths",
                    marker={"symbol": "square", "size": 11, "color": PALETTE[1]})
    x, y, text = pts([rec["best"]])
    fig.add_scatter(x=x, y=y, text=text, mode="markers", name="recommended",
                    marker={"symbol": "star", "size": 16, "color": PALETTE[3]})
    log_axis(fig, [c["variance"] for c in rec["front"] + [rec["best"]]], "", "x")
    return style(fig, wrap(f"Pareto front at {rec['world_size']} GPUs on {rec['topology']}", 60),
                 "gradient variance increase (relative)", "speedup over fp32 allreduce (x)")


def recommend_bits_figure(rec: Mapping[str, Any]):
    """The recommended width of each compressed parameter (layer), in the model's order.

    >>> from emulator import figures
    >>> fig = figures.recommend_bits_figure({"policy": {"fc.weight": 4, "conv.weight": 2}})
    >>> list(fig.data[0].x), list(fig.data[0].y)
    (['fc.weight', 'conv.weight'], [4, 2])
    """
    go = _go()
    names = list(rec["policy"])
    fig = go.Figure(go.Bar(x=names, y=[rec["policy"][n] for n in names], name="bits",
                           marker={"color": PALETTE[2]}))
    return style(fig, "recommended bits per layer", "parameter", "bits per coordinate")
