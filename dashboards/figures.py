"""Figures of the dashboard as pure functions: plain rows and dicts in, ``go.Figure`` out.

Nothing here touches the emulator or the network: every function takes the JSON-ready
results documented in ``docs/formats.md`` and ``docs/interfaces.md`` (study rows,
``Prediction.to_dict()``, ``CollectiveResult.to_dict()``, run-store steps, validation points),
so each one is unit-tested on hand-written inputs. Units: seconds, bytes, bytes/s.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

import plotly.graph_objects as go

#: Colour cycle shared by every figure, so a series keeps its colour across figures.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)

#: Scaling metrics: row key -> (axis title, log axis?).
SCALING_METRICS: dict[str, tuple[str, bool]] = {
    "throughput_samples_s": ("throughput (samples/s)", True),
    "speedup_vs_fp32": ("speedup over fp32 allreduce (x)", False),
    "iteration_s": ("iteration time (s)", True),
    "scaling_efficiency": ("scaling efficiency", False),
    "bytes_per_gpu": ("bytes per GPU per iteration (bytes)", True),
}

#: Parts of one iteration, in stacking order: row key -> legend name.
BREAKDOWN_PARTS: dict[str, str] = {
    "compute_s": "compute",
    "exposed_comm_s": "exposed communication",
    "encode_decode_s": "encode/decode",
}


def _base_layout(fig: go.Figure, title: str, xaxis: str, yaxis: str) -> go.Figure:
    fig.update_layout(
        title={"text": title},
        xaxis_title=xaxis,
        yaxis_title=yaxis,
        template="plotly_white",
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def message_figure(text: str, title: str = "") -> go.Figure:
    """An empty figure that says why it is empty (no data yet, bad input, ...)."""
    fig = go.Figure()
    fig.update_layout(
        title={"text": title},
        template="plotly_white",
        xaxis={"visible": False},
        yaxis={"visible": False},
        annotations=[{"text": text, "showarrow": False, "xref": "paper", "yref": "paper",
                      "x": 0.5, "y": 0.5, "font": {"size": 14}}],
    )
    return fig


def series_label(row: Mapping[str, Any], *, with_topology: bool = True) -> str:
    """Legend label of one study configuration: transport, bits and (optionally) topology."""
    transport = str(row.get("transport", "?"))
    bits = row.get("bits")
    label = transport if bits is None or transport in ("fp32", "fp16") else f"{transport} {bits}-bit"
    if with_topology and row.get("topology") is not None:
        label += f" @ {row['topology']}"
    return label


def _series(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    rows = list(rows)
    with_topology = len({r.get("topology") for r in rows}) > 1
    out: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        out[series_label(row, with_topology=with_topology)].append(row)
    return dict(out)


def scaling_figure(rows: Sequence[Mapping[str, Any]], metric: str = "throughput_samples_s") -> go.Figure:
    """Scaling curves: one line per (transport, bits, topology), ``metric`` against GPUs.

    Parameters
    ----------
    rows : sequence of dict
        Study rows with ``world_size``, ``transport``, ``bits``, ``topology`` and ``metric``.
    metric : str
        A key of :data:`SCALING_METRICS`.
    """
    if metric not in SCALING_METRICS:
        raise ValueError(f"metric: unknown scaling metric {metric!r}; known: {sorted(SCALING_METRICS)}")
    ytitle, ylog = SCALING_METRICS[metric]
    fig = go.Figure()
    usable = [r for r in rows if r.get(metric) is not None and r.get("world_size") is not None]
    for i, (label, series) in enumerate(sorted(_series(usable).items())):
        series = sorted(series, key=lambda r: r["world_size"])
        fig.add_trace(go.Scatter(
            x=[r["world_size"] for r in series], y=[r[metric] for r in series],
            mode="lines+markers", name=label, line={"color": PALETTE[i % len(PALETTE)]},
            hovertemplate="%{x} GPUs<br>%{y:.4g}<extra>" + label + "</extra>",
        ))
    _base_layout(fig, ytitle.split(" (")[0] + " vs GPUs", "GPUs", ytitle)
    fig.update_xaxes(type="log", dtick=math.log10(2))
    if ylog:
        fig.update_yaxes(type="log")
    if not usable:
        fig.add_annotation(text="no rows", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def breakdown_figure(rows: Sequence[Mapping[str, Any]], world_size: int | None = None) -> go.Figure:
    """Stacked bars of one iteration: compute, exposed communication, encode/decode (seconds).

    One bar per configuration at ``world_size`` (the largest in ``rows`` by default).
    """
    sizes = sorted({r["world_size"] for r in rows if r.get("world_size") is not None})
    fig = go.Figure()
    if not sizes:
        return _base_layout(fig, "iteration time breakdown", "configuration", "time (s)")
    if world_size is None:
        world_size = sizes[-1]
    chosen = [r for r in rows if r.get("world_size") == world_size]
    series = sorted(_series(chosen).items())
    labels = [label for label, _ in series]
    for i, (key, name) in enumerate(BREAKDOWN_PARTS.items()):
        fig.add_trace(go.Bar(
            x=labels, y=[float(s[0].get(key) or 0.0) for _, s in series], name=name,
            marker_color=PALETTE[i],
            hovertemplate="%{x}<br>" + name + ": %{y:.4g} s<extra></extra>",
        ))
    fig.update_layout(barmode="stack")
    return _base_layout(fig, f"iteration time breakdown at {world_size} GPUs", "configuration",
                        "time (s)")


#: Phases of one bucket in the Gantt chart: (start key, end key, legend name).
GANTT_PHASES: tuple[tuple[str, str, str], ...] = (
    ("ready_s", "start_s", "waiting for the stream"),
    ("start_s", "encode_end_s", "encode"),
    ("encode_end_s", "comm_end_s", "collective"),
    ("comm_end_s", "end_s", "decode"),
)


def _bucket_times(bucket: Mapping[str, Any]) -> dict[str, float]:
    """The bucket's phase boundaries, tolerating the short key names (``encode_end``)."""
    out = {}
    for key in ("ready_s", "start_s", "encode_end_s", "comm_end_s", "end_s"):
        value = bucket.get(key, bucket.get(key[:-2]))
        if value is not None:
            out[key] = float(value)
    return out


def gantt_figure(prediction: Mapping[str, Any]) -> go.Figure:
    """Per-bucket timeline of one iteration (a Gantt chart, seconds from the start of forward).

    Parameters
    ----------
    prediction : dict
        ``Prediction.to_dict()``: ``buckets`` (or ``timeline``), a list of dicts with ``index``,
        ``ready_s``, ``start_s``, ``encode_end_s``, ``comm_end_s``, ``end_s``; optional
        ``forward_s``/``backward_s``/``iteration_s`` for the compute bars.
    """
    buckets = prediction.get("buckets") or prediction.get("timeline") or []
    fig = go.Figure()
    for i, (start_key, end_key, name) in enumerate(GANTT_PHASES):
        ys, bases, widths = [], [], []
        for b in buckets:
            t = _bucket_times(b)
            if start_key in t and end_key in t:
                ys.append(f"bucket {b.get('index', len(ys))}")
                bases.append(t[start_key])
                widths.append(max(t[end_key] - t[start_key], 0.0))
        if ys:
            fig.add_trace(go.Bar(
                y=ys, x=widths, base=bases, orientation="h", name=name,
                marker_color=PALETTE[(i + 3) % len(PALETTE)],
                hovertemplate="%{y}<br>" + name + ": %{base:.4g} s + %{x:.4g} s<extra></extra>",
            ))
    fwd = prediction.get("forward_s")
    bwd = prediction.get("backward_s")
    if fwd is not None and bwd is not None:
        fig.add_trace(go.Bar(y=["compute"], x=[fwd], base=[0.0], orientation="h", name="forward",
                             marker_color=PALETTE[0]))
        fig.add_trace(go.Bar(y=["compute"], x=[bwd], base=[fwd], orientation="h", name="backward",
                             marker_color=PALETTE[1]))
    if prediction.get("iteration_s") is not None:
        fig.add_vline(x=float(prediction["iteration_s"]), line_dash="dash",
                      annotation_text="iteration end")
    fig.update_layout(barmode="overlay")
    fig.update_yaxes(autorange="reversed")
    title = "timeline of one iteration"
    if prediction.get("label"):
        title += f": {prediction['label']}"
    return _base_layout(fig, title, "time since start of forward (s)", "bucket")


# --- topology ---------------------------------------------------------------------------

def link_utilization(result: Mapping[str, Any] | None) -> dict[tuple[str, str], dict[str, float]]:
    """Per undirected link: bytes (both directions) and utilization (0..1, the busier direction).

    ``result`` is ``CollectiveResult.to_dict()``; its ``links`` are a list of dicts with ``u``,
    ``v``, ``bytes`` and ``utilization`` (or ``busy_s`` with ``time_s`` of the collective).
    """
    out: dict[tuple[str, str], dict[str, float]] = {}
    if not result:
        return out
    time_s = float(result.get("time_s") or 0.0)
    for link in result.get("links", []):
        u, v = str(link["u"]), str(link["v"])
        key = (u, v) if u <= v else (v, u)
        util = link.get("utilization")
        if util is None:
            busy = float(link.get("busy_s") or 0.0)
            util = busy / time_s if time_s > 0 else 0.0
        entry = out.setdefault(key, {"bytes": 0.0, "utilization": 0.0})
        entry["bytes"] += float(link.get("bytes") or 0.0)
        entry["utilization"] = max(entry["utilization"], float(util))
    return out


def _colour(util: float) -> str:
    """Grey (idle) to red (saturated): a linear ramp, clamped to [0, 1]."""
    u = min(max(util, 0.0), 1.0)
    r = int(200 + 55 * u)
    g = int(200 - 170 * u)
    b = int(200 - 170 * u)
    return f"rgb({r},{g},{b})"


def topology_figure(graph_data: Mapping[str, Any], positions: Mapping[str, Sequence[float]],
                    utilization: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
                    title: str = "") -> go.Figure:
    """The cluster graph, links coloured by utilization, hover with bandwidth, latency, bytes.

    Parameters
    ----------
    graph_data : dict
        ``{"nodes": [{"id", "kind", "rank"?}], "links": [{"source", "target", "bandwidth",
        "latency", "link"?}]}`` (node-link data; bandwidth in bytes/s, latency in s).
    positions : dict
        node id -> (x, y).
    utilization : dict, optional
        :func:`link_utilization` of a simulation.
    """
    utilization = utilization or {}
    fig = go.Figure()
    # Links are drawn in a few colour bins: one trace per bin keeps the figure light for
    # thousand-link graphs (a trace per link would not).
    bins: dict[int, dict[str, list]] = defaultdict(lambda: {"x": [], "y": []})
    mid_x, mid_y, mid_text = [], [], []
    for link in graph_data.get("links", []):
        u, v = str(link["source"]), str(link["target"])
        if u not in positions or v not in positions:
            continue
        key = (u, v) if u <= v else (v, u)
        use = utilization.get(key, {})
        util = float(use.get("utilization", 0.0))
        b = min(int(util * 10), 10)
        (x0, y0), (x1, y1) = positions[u], positions[v]
        bins[b]["x"] += [x0, x1, None]
        bins[b]["y"] += [y0, y1, None]
        mid_x.append((x0 + x1) / 2)
        mid_y.append((y0 + y1) / 2)
        mid_text.append(
            f"{u} - {v} ({link.get('link', 'link')})<br>"
            f"bandwidth {float(link['bandwidth']) / 1e9:.4g} GB/s<br>"
            f"latency {float(link['latency']) * 1e6:.4g} us<br>"
            f"bytes {use.get('bytes', 0.0):.4g}<br>utilization {util:.1%}"
        )
    for b in sorted(bins):
        fig.add_trace(go.Scatter(
            x=bins[b]["x"], y=bins[b]["y"], mode="lines", hoverinfo="skip",
            line={"color": _colour(b / 10), "width": 1 + 3 * b / 10},
            name=f"utilization {b * 10}%" if b < 10 else "utilization 100%", showlegend=bool(utilization),
        ))
    fig.add_trace(go.Scatter(x=mid_x, y=mid_y, mode="markers", text=mid_text, hoverinfo="text",
                             marker={"size": 6, "color": "rgba(0,0,0,0.05)"}, name="links",
                             showlegend=False))
    by_kind: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for node in graph_data.get("nodes", []):
        if str(node["id"]) in positions:
            by_kind[str(node.get("kind", "?"))].append(node)
    symbols = {"gpu": "square", "switch": "diamond", "nic": "circle", "cpu": "triangle-up"}
    for i, kind in enumerate(sorted(by_kind)):
        nodes = by_kind[kind]
        fig.add_trace(go.Scatter(
            x=[positions[str(n["id"])][0] for n in nodes],
            y=[positions[str(n["id"])][1] for n in nodes],
            mode="markers", name=kind,
            marker={"size": 10 if kind == "gpu" else 12, "symbol": symbols.get(kind, "circle"),
                    "color": PALETTE[i % len(PALETTE)]},
            text=[f"{n['id']} ({kind}" + (f", rank {n['rank']})" if "rank" in n else ")")
                  for n in nodes],
            hoverinfo="text",
        ))
    fig.update_layout(
        title={"text": title or graph_data.get("name", "topology")}, template="plotly_white",
        xaxis={"visible": False}, yaxis={"visible": False},
        margin={"l": 10, "r": 10, "t": 50, "b": 10}, hovermode="closest",
    )
    return fig


# --- live runs --------------------------------------------------------------------------

#: Live panels: metric key -> (title, axis title).
LIVE_METRICS: dict[str, tuple[str, str]] = {
    "loss": ("training loss", "loss"),
    "test_accuracy": ("test accuracy", "accuracy"),
    "samples_per_s": ("throughput", "samples/s"),
    "bytes_sent": ("bytes sent per step", "bytes"),
    "iteration_s": ("iteration time", "seconds"),
}


def live_figure(steps: Sequence[Mapping[str, Any]], metric: str,
                predicted_iteration_s: float | None = None) -> go.Figure:
    """One live panel: ``metric`` per step; for ``iteration_s`` the prediction beside it.

    Parameters
    ----------
    steps : sequence of dict
        Run-store steps: ``{"step": int, "time_s": float, "metrics": {...}}``.
    metric : str
        A key of :data:`LIVE_METRICS`.
    predicted_iteration_s : float, optional
        The emulator's prediction (seconds) used when steps carry no ``predicted_iteration_s``.
    """
    if metric not in LIVE_METRICS:
        raise ValueError(f"metric: unknown live metric {metric!r}; known: {sorted(LIVE_METRICS)}")
    title, ytitle = LIVE_METRICS[metric]
    fig = go.Figure()
    pts = [(s["step"], s["metrics"][metric]) for s in steps
           if s.get("metrics", {}).get(metric) is not None]
    fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name="measured",
                             mode="lines+markers" if metric == "test_accuracy" else "lines",
                             line={"color": PALETTE[0]}))
    if metric == "iteration_s":
        pred = [(s["step"], s["metrics"]["predicted_iteration_s"]) for s in steps
                if s.get("metrics", {}).get("predicted_iteration_s") is not None]
        if not pred and predicted_iteration_s is not None and pts:
            pred = [(pts[0][0], predicted_iteration_s), (pts[-1][0], predicted_iteration_s)]
        if pred:
            fig.add_trace(go.Scatter(x=[p[0] for p in pred], y=[p[1] for p in pred],
                                     name="predicted (emulator)", mode="lines",
                                     line={"color": PALETTE[3], "dash": "dash"}))
    return _base_layout(fig, title, "step", ytitle)


# --- validation -------------------------------------------------------------------------

def validation_scatter(points: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Predicted against measured seconds, one trace per op, with the y = x line (log axes)."""
    fig = go.Figure()
    by_op: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
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
    _base_layout(fig, "predicted vs measured", "measured time (s)", "predicted time (s)")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def validation_error_figure(points: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Relative error of the prediction ((predicted - measured) / measured) per message size."""
    fig = go.Figure()
    by_op: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for p in points:
        by_op[str(p.get("op", "?"))].append(p)
    for i, op in enumerate(sorted(by_op)):
        pts = sorted(by_op[op], key=lambda p: p["bytes"])
        errs = [p["rel_error"] if p.get("rel_error") is not None
                else (p["predicted_s"] - p["measured_s"]) / p["measured_s"] for p in pts]
        fig.add_trace(go.Scatter(x=[p["bytes"] for p in pts], y=errs, mode="lines+markers",
                                 name=op, line={"color": PALETTE[i % len(PALETTE)]}))
    fig.add_hline(y=0.0, line_dash="dot")
    _base_layout(fig, "relative error per size", "message size (bytes)", "relative error")
    fig.update_xaxes(type="log")
    fig.update_yaxes(tickformat=".0%")
    return fig
