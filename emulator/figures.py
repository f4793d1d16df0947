"""Figures that ``report.html`` and the dashboard share: pure functions, plain dicts in, figures out.

Inputs are the JSON-ready rows of ``docs/formats.md`` (a ValidationReport's ``training`` rows),
so every function can be tested on hand-written rows. Times are seconds in, milliseconds drawn.
plotly is imported by the functions, not by ``import emulator``.
"""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["timeline_comparison", "TIMELINE_PHASES"]

#: Phases of a bucket, in drawing order: (start key, end key, legend name, colour).
TIMELINE_PHASES = (
    ("ready", "issued", "encode (in the hook)", "#ff7f0e"),
    ("issued", "comm_done", "collectives (queued and on the wire)", "#1f77b4"),
    ("comm_done", "done", "decode and average", "#2ca02c"),
)


def _label(row: Mapping[str, Any]) -> str:
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

    Example
    -------
    >>> row = {"model": "mlp", "transport": "allgather", "bits": 4, "timeline": {
    ...     "measured": [{"bucket": 0, "ready": 0.01, "issued": 0.012, "comm_done": 0.03,
    ...                   "done": 0.035}],
    ...     "predicted": [{"bucket": 0, "ready": 0.01, "issued": 0.011, "comm_done": 0.028,
    ...                    "done": 0.031}]}}
    >>> fig = timeline_comparison(row)
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
        for a, z, name, colour in TIMELINE_PHASES:
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
    title = f"bucket timelines: {_label(row)}"
    if row.get("measured_s") is not None and row.get("predicted_s") is not None:
        title += (f" (step measured {1e3 * row['measured_s']:.1f} ms, emulator "
                  f"{1e3 * row['predicted_s']:.1f} ms)")
    fig.update_layout(title={"text": title}, barmode="overlay", template="plotly_white",
                      height=120 + 40 * max(len(sides[0][1]), len(sides[1][1]), 1),
                      legend={"orientation": "h", "y": -0.2}, margin={"l": 70, "r": 20, "t": 70})
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="ms from the start of the step")
    return fig
