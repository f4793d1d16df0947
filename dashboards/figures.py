"""The dashboard's own figures: the topology drawing and the live-run panels, in its theme.

Study and validation figures come from the figure library :mod:`emulator.figures`, which
``report.html`` uses too; the colour cycle and the empty "why" figure are that library's, so a
series keeps its colour everywhere. Every function takes plain JSON-ready data (node-link
graphs, ``CollectiveResult.to_dict()``, run-store steps) and returns a ``go.Figure``.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Sequence

import plotly.graph_objects as go
from emulator import figures as library

PALETTE = library.PALETTE
message_figure = library.message_figure
_base_layout = library.style

__all__ = ["PALETTE", "message_figure", "link_utilization", "topology_figure", "LIVE_METRICS",
           "live_figure"]


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
