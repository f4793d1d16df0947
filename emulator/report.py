"""A self-contained HTML report of a study: Plotly figures with plotly.js inlined, and the table.

The file opens offline (no CDN): the first figure carries plotly.js, the others reuse it.
Figures: throughput and speedup over fp32 against world size (one line per transport and bit
width, one panel column per topology), and the time breakdown (compute, exposed
communication, encode/decode) at each topology's largest world size. An optional
:class:`emulator.Prediction` adds its per-bucket timeline.
"""
from __future__ import annotations

import html
import os

from emulator.errors import ConfigError


def _label(r: dict) -> str:
    return r["transport"] if r["transport"] in ("fp32", "fp16") else f"{r['transport']} {r['bits']}b"


def _scaling(rows, y: str, title: str, ytitle: str):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    tops = list(dict.fromkeys(r["topology"] for r in rows))
    fig = make_subplots(rows=1, cols=len(tops), subplot_titles=tops, shared_yaxes=True)
    for c, top in enumerate(tops, start=1):
        sub = [r for r in rows if r["topology"] == top]
        for label in dict.fromkeys(_label(r) for r in sub):
            pts = sorted((r["world_size"], r[y]) for r in sub if _label(r) == label)
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                     name=label, legendgroup=label, showlegend=c == 1), row=1, col=c)
        fig.update_xaxes(type="log", title_text="GPUs", row=1, col=c)
    fig.update_yaxes(title_text=ytitle, row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig


def _breakdown(rows):
    import plotly.graph_objects as go

    picked = []
    for top in dict.fromkeys(r["topology"] for r in rows):
        sub = [r for r in rows if r["topology"] == top]
        big = max(r["world_size"] for r in sub)
        picked += [r for r in sub if r["world_size"] == big]
    x = [f"{r['topology']} x{r['world_size']}<br>{_label(r)}" for r in picked]
    fig = go.Figure()
    # encode/decode is part of what the stream spends; the bars stack compute and the exposed
    # remainder (which adds up to the iteration), the codec total is drawn next to them.
    fig.add_bar(x=x, y=[1e3 * r["compute_s"] for r in picked], name="compute")
    fig.add_bar(x=x, y=[1e3 * r["exposed_comm_s"] for r in picked], name="exposed communication")
    fig.add_scatter(x=x, y=[1e3 * r["encode_decode_s"] for r in picked], mode="markers",
                    name="encode/decode (total, partly hidden)", marker_symbol="diamond", marker_size=10)
    fig.update_layout(barmode="stack", title="Iteration breakdown at the largest world size",
                      yaxis_title="ms", height=460)
    return fig


def _timeline(pred):
    import plotly.graph_objects as go

    fig = go.Figure()
    y = [f"bucket {b.index}" for b in pred.buckets]
    for name, a, z in (("wait", "ready_s", "start_s"), ("encode", "start_s", "encode_end"),
                       ("collective", "encode_end", "comm_end"), ("decode", "comm_end", "end_s")):
        fig.add_bar(y=y, x=[1e3 * (getattr(b, z) - getattr(b, a)) for b in pred.buckets],
                    base=[1e3 * getattr(b, a) for b in pred.buckets], orientation="h", name=name)
    fig.add_vline(x=1e3 * (pred.forward_s + pred.backward_s), line_dash="dash",
                  annotation_text="end of backward")
    fig.update_layout(barmode="overlay", title=f"Bucket timeline: {pred.transport}, {pred.world_size} GPUs, "
                      f"{pred.topology}", xaxis_title="ms from the start of the iteration", height=500)
    return fig


def write_report(rows: list[dict], path: str | os.PathLike, *, title: str = "QSGD what-if study",
                 prediction=None, notes: str = "") -> str:
    """Write the HTML report of study ``rows`` to ``path``; returns the path.

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`emulator.run_study`.
    prediction : emulator.Prediction, optional
        Adds its per-bucket timeline.
    notes : str
        A paragraph of text shown under the title (escaped).
    """
    import plotly.io as pio

    if not rows:
        raise ConfigError("write_report: rows must not be empty")
    figs = [_scaling(rows, "throughput_samples_s", "Throughput", "samples/s"),
            _scaling(rows, "speedup_vs_fp32", "Speedup over fp32 allreduce", "speedup"),
            _breakdown(rows)]
    if prediction is not None:
        figs.append(_timeline(prediction))
    parts = [pio.to_html(f, include_plotlyjs=(i == 0), full_html=False) for i, f in enumerate(figs)]
    cols = ("topology", "world_size", "bits", "transport", "iteration_s", "throughput_samples_s",
            "speedup_vs_fp32", "scaling_efficiency", "bytes_per_gpu", "exposed_comm_s", "encode_decode_s")
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v))
    table = "<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{cell(r[c])}</td>" for c in cols) + "</tr>" for r in rows) + "</table>"
    doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
           "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>"
           f"<h1>{html.escape(title)}</h1><p>{html.escape(notes)}</p>"
           + "".join(parts) + "<h2>Rows</h2>" + table + "</body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc)
    return str(path)
