"""A self-contained HTML report of a study: its answer, conclusions, figures and table, offline.

The page opens with the headline figure (where QSGD pays: the fastest QSGD configuration's
speedup over fp32 and fp16 per topology and GPU count, :func:`emulator.figures.headline_figure`)
and one sentence per (topology, world size) from :func:`emulator.studyresult.conclusions`;
then the key of the figures (colour = transport, dash and marker = bit width, once for all),
the small multiples of :mod:`emulator.figures` (throughput and speedup over fp32 against
GPUs, the iteration breakdown at the largest world size), the timeline of the study's best
configuration, and every row in display units. plotly.js is inlined once (no CDN), so the
file opens without a network. Beside it, ``headline.png`` is the headline figure as an image
(:func:`emulator.figimage.write_png`; written where Debian's chromium is installed, and the
page says when it was not).
"""
from __future__ import annotations

import html
import os

from emulator import figimage, figures
from emulator.errors import ConfigError
from emulator.figstyle import BIT_DASHES, BIT_SYMBOLS, config_label, transport_colour
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


#: The headline PNG beside the report: its name and size in CSS pixels.
HEADLINE_PNG = "headline.png"
HEADLINE_SIZE = (1000, 460)

#: SVG stroke-dasharray of plotly's dashes, for the key.
_DASHARRAY = {"solid": "", "dot": "2,3", "dash": "7,4", "longdash": "12,4",
              "dashdot": "7,3,2,3", "longdashdot": "12,3,2,3"}


def _key(rows) -> str:
    """The key of every study figure, once: a swatch per transport, a line per bit width."""
    transports = list(dict.fromkeys(r.transport for r in rows))
    bits = sorted({r.bits for r in rows}, reverse=True)
    sw = "".join(
        f"<span class='sw'><svg width='14' height='14'><rect width='14' height='14' "
        f"fill='{transport_colour(t)}'/></svg>{html.escape(config_label(t, 0, False))}</span>"
        for t in transports)
    dashes = "".join(
        f"<span class='sw'><svg width='34' height='14'><line x1='2' y1='7' x2='32' y2='7' "
        f"stroke='#333' stroke-width='2' stroke-dasharray='{_DASHARRAY.get(BIT_DASHES.get(b), '')}'"
        f"/></svg>{b}-bit ({html.escape(BIT_SYMBOLS.get(b, 'marker'))})</span>" for b in bits)
    return (f"<p class='key'><b>Colour is the transport</b> {sw}<br><b>Line dash and marker are "
            f"the bit width</b> {dashes}<br>Greys are compute; each figure's legend lists "
            f"each configuration once for all its panels (click one to hide it).</p>")


def write_report(study: Study, path: str | os.PathLike, *, title: str = "QSGD what-if study",
                 notes: str = "", png: bool = True) -> str:
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
        A paragraph under the title (escaped).
    png : bool
        Also write the headline figure as ``headline.png`` beside ``path`` (where Debian's
        chromium is installed; :func:`emulator.figimage.write_png`).

    Examples
    --------
    >>> import os, tempfile, emulator, qsgd
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0)
    >>> study = emulator.run_study(emulator.StudyConfig(trace=trace, world_sizes=(4,),
    ...                                                 topologies=("switch:{n}",), device="A100"))
    >>> path = emulator.write_report(study, os.path.join(tempfile.mkdtemp(), "r.html"), png=False)
    >>> html = open(path, encoding="utf-8").read()
    >>> html.count("Plotly.newPlot("), study.conclusions()[0].split(":")[0] in html
    (5, True)
    """
    import plotly.io as pio

    if not isinstance(study, Study):
        raise ConfigError(f"write_report: study must be an emulator.Study, got {type(study).__name__}")
    rows = study.rows
    headline = figures.headline_figure(rows)
    figs = [figures.scaling_figure(rows, "throughput_samples_s"),
            figures.scaling_figure(rows, "speedup_vs_fp32"),
            figures.breakdown_figure(rows)]
    best = study.best()
    pred = study.prediction(best)
    if pred is not None:
        figs.append(figures.timeline_figure(
            pred, f"{figures.row_label(best)} at {best.world_size} GPUs on {best.topology_name}"))
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
    image = ""
    if png:
        png_path = os.path.join(os.path.dirname(os.path.abspath(os.fspath(path))), HEADLINE_PNG)
        why = figimage.write_png(headline, png_path, width=HEADLINE_SIZE[0],
                                 height=headline.layout.height or HEADLINE_SIZE[1])
        image = (f"<p class='small'>This figure is also <a href='{HEADLINE_PNG}'>{HEADLINE_PNG}"
                 "</a>, beside this file.</p>" if not why else
                 f"<p class='small'>{HEADLINE_PNG} was not written: {html.escape(why)}.</p>")
    parts = [pio.to_html(f, include_plotlyjs=(i == 0), full_html=False)
             for i, f in enumerate([headline] + figs)]
    table = "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in TABLE) + "</tr>" + \
        "".join("<tr>" + "".join(f"<td>{html.escape(fmt(getattr(r, k)))}</td>" for _, k, fmt in TABLE)
                + "</tr>" for r in rows) + "</table>"
    said = "".join(f"<li>{html.escape(c)}</li>" for c in conclusions(study))
    doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           "<style>body{font-family:sans-serif;margin:2em;max-width:1400px}"
           "table{border-collapse:collapse;font-size:12px}"
           "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
           ".conclusions{font-size:14px}.small{font-size:12px;color:#555}"
           ".key{font-size:13px;line-height:1.9}.sw{margin:0 0.9em 0 0.3em;white-space:nowrap}"
           ".sw svg{vertical-align:middle;margin-right:0.3em}</style></head><body>"
           f"<h1>{html.escape(title)}</h1><p>{html.escape(notes)}</p>" + parts[0] + image
           + f"<h2>Conclusions</h2><ul class='conclusions'>{said}</ul>"
           + "<h2>Scaling, breakdown and timeline</h2>" + _key(rows) + "".join(parts[1:])
           + f"<h2>Rows</h2><p>{html.escape(LEGEND)}</p>" + table + "</body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc)
    return str(path)
