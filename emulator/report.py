"""A self-contained HTML report of a study: its conclusions, figures and table, readable offline.

The page opens with one sentence per (topology, world size) from
:func:`emulator.studyresult.conclusions`, then the figures of :mod:`emulator.figures`
(throughput and speedup over fp32 against GPUs, the iteration breakdown at the largest world
size, and the timeline of the study's best configuration), then every row in display units.
plotly.js is inlined once (no CDN), so the file opens without a network.
"""
from __future__ import annotations

import html
import os

from emulator import figures
from emulator.errors import ConfigError
from emulator.studyresult import LEGEND, Study, conclusions

__all__ = ["write_report"]

#: Table columns: (header, StudyRow field, format of the value in display units).
TABLE = (
    ("topology", "topology_name", str),
    ("GPUs", "world_size", str),
    ("batch/GPU", "batch_size", str),
    ("bits", "bits", str),
    ("transport", "transport", str),
    ("iteration (ms)", "iteration_s", lambda v: f"{1e3 * v:.2f}"),
    ("throughput (samples/s)", "throughput_samples_s", lambda v: f"{v:,.1f}"),
    ("speedup vs fp32", "speedup_vs_fp32", lambda v: "-" if v is None else f"{v:.2f}x"),
    ("efficiency", "scaling_efficiency", lambda v: f"{v:.0%}"),
    ("sent per GPU (MB)", "bytes_per_gpu", lambda v: f"{v / 1e6:,.2f}"),
    ("exposed comm (ms)", "exposed_comm_s", lambda v: f"{1e3 * v:.2f}"),
    ("encode+decode (ms)", "encode_decode_s", lambda v: f"{1e3 * v:.2f}"),
    ("bound", "bound", str),
)


def write_report(study: Study, path: str | os.PathLike, *, title: str = "QSGD what-if study",
                 notes: str = "") -> str:
    """Write the HTML report of ``study`` to ``path``; returns the path.

    Parameters
    ----------
    study : Study
        From :func:`emulator.run_study` (or :func:`emulator.read_study`).
    path : str or PathLike
        The HTML file to write.
    title : str
        Heading and page title (escaped).
    notes : str
        A paragraph under the conclusions (escaped).

    Examples
    --------
    >>> import os, tempfile, emulator, qsgd
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0)
    >>> study = emulator.run_study(emulator.StudyConfig(trace=trace, world_sizes=(4,),
    ...                                                 topologies=("switch:{n}",), device="A100"))
    >>> path = emulator.write_report(study, os.path.join(tempfile.mkdtemp(), "r.html"))
    >>> html = open(path, encoding="utf-8").read()
    >>> html.count("Plotly.newPlot("), study.conclusions()[0].split(":")[0] in html
    (4, True)
    """
    import plotly.io as pio

    if not isinstance(study, Study):
        raise ConfigError(f"write_report: study must be an emulator.Study, got {type(study).__name__}")
    rows = study.rows
    figs = [figures.scaling_figure(rows, "throughput_samples_s"),
            figures.scaling_figure(rows, "speedup_vs_fp32"),
            figures.breakdown_figure(rows)]
    best = study.best()
    pred = study.prediction(best)
    if pred is not None:
        figs.append(figures.timeline_figure(
            pred, f"{best.label} at {best.world_size} GPUs on {best.topology_name}"))
    parts = [pio.to_html(f, include_plotlyjs=(i == 0), full_html=False) for i, f in enumerate(figs)]
    table = "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in TABLE) + "</tr>" + \
        "".join("<tr>" + "".join(f"<td>{html.escape(fmt(getattr(r, k)))}</td>" for _, k, fmt in TABLE)
                + "</tr>" for r in rows) + "</table>"
    headline = "".join(f"<li>{html.escape(c)}</li>" for c in conclusions(study))
    doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
           "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
           ".conclusions{font-size:15px}</style></head><body>"
           f"<h1>{html.escape(title)}</h1><ul class='conclusions'>{headline}</ul>"
           f"<p>{html.escape(notes)}</p>" + "".join(parts)
           + f"<h2>Rows</h2><p>{html.escape(LEGEND)}</p>" + table + "</body></html>")
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc)
    return str(path)
