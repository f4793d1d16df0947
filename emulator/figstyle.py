"""The look of the figure library: what colours and dashes mean, readable ticks, the layout.

One mapping for every study figure of the report and the dashboard: **colour = transport**
(fp32 allreduce, fp16 allreduce, each QSGD transport) and **line dash and marker = bit
width** (:func:`series_style`). Greys are parts of the iteration (compute), never a
configuration. Log axes are ticked at 1-2-5 steps of each decade with SI units
(:func:`log_ticks`: ``5k, 10k, 20k``, ``2 ms``, ``10 MB``), never at plotly's minor ticks.

>>> from emulator import figstyle
>>> figstyle.series_style("qsgd_allgather", 4)["dash"], figstyle.config_label("fp16", 16)
('dot', 'fp16 allreduce')
>>> figstyle.log_ticks(3_000, 60_000)[1]
['5k', '10k', '20k', '50k']
"""
from __future__ import annotations

import math
import textwrap
from typing import Sequence

__all__ = ["TRANSPORT_COLOURS", "TRANSPORT_NAMES", "BIT_DASHES", "BIT_SYMBOLS", "COMPUTE_GREY",
           "transport_colour", "transport_name", "series_style", "config_label", "si_text",
           "log_ticks", "log_axis", "wrap", "style", "message_figure", "gpu_ticks"]

#: Transport -> colour (Okabe-Ito, readable by colour-blind readers). fp32, the baseline,
#: is near-black; a transport not listed takes the next of :data:`_SPARE_COLOURS`.
TRANSPORT_COLOURS: dict[str, str] = {
    "fp32": "#333333",
    "fp16": "#0072B2",
    "qsgd_allgather": "#E69F00",
    "qsgd_scatter_reduce_allgather": "#009E73",
}
_SPARE_COLOURS = ("#CC79A7", "#D55E00", "#56B4E9", "#F0E442")

#: Transport -> its name in figures.
TRANSPORT_NAMES: dict[str, str] = {
    "fp32": "fp32 allreduce",
    "fp16": "fp16 allreduce",
    "qsgd_allgather": "QSGD all-gather",
    "qsgd_scatter_reduce_allgather": "QSGD scatter-reduce-allgather",
}

#: Bits per coordinate -> line dash and marker symbol; other widths take :data:`_SPARE_BITS`.
BIT_DASHES: dict[int, str] = {32: "solid", 16: "longdash", 8: "dash", 4: "dot", 2: "dashdot"}
BIT_SYMBOLS: dict[int, str] = {32: "circle", 16: "square", 8: "diamond", 4: "triangle-up",
                               2: "x"}
_SPARE_BITS = (("longdashdot", "star"), ("solid", "pentagon"), ("dash", "hexagon"),
               ("dot", "cross"))

#: Compute in breakdowns and timelines (greys are never a configuration).
COMPUTE_GREY = "#c8c8c8"


def transport_colour(transport: str) -> str:
    """The colour of ``transport`` in every figure (a stable spare for one not listed).

    >>> transport_colour("qsgd_allgather"), transport_colour("fp16")
    ('#E69F00', '#0072B2')
    """
    if transport in TRANSPORT_COLOURS:
        return TRANSPORT_COLOURS[transport]
    return _SPARE_COLOURS[sum(map(ord, transport)) % len(_SPARE_COLOURS)]


def transport_name(transport: str) -> str:
    """``QSGD all-gather`` for ``qsgd_allgather``; an unknown transport as it is.

    >>> transport_name("qsgd_allgather"), transport_name("powersgd")
    ('QSGD all-gather', 'powersgd')
    """
    return TRANSPORT_NAMES.get(transport, transport)


def series_style(transport: str, bits: int) -> dict:
    """``{"color", "dash", "symbol"}`` of a configuration: colour by transport, dash and marker
    by bit width.

    >>> series_style("fp32", 32)
    {'color': '#333333', 'dash': 'solid', 'symbol': 'circle'}
    """
    if bits in BIT_DASHES:
        dash, symbol = BIT_DASHES[bits], BIT_SYMBOLS[bits]
    else:
        dash, symbol = _SPARE_BITS[int(bits) % len(_SPARE_BITS)]
    return {"color": transport_colour(transport), "dash": dash, "symbol": symbol}


def config_label(transport: str, bits: int, compressed: bool | None = None) -> str:
    """A configuration in words: ``fp32 allreduce``, ``QSGD all-gather 4-bit``.

    ``compressed`` says whether the bit width belongs in the name (by default: when the
    transport's name starts with ``qsgd``).

    >>> config_label("qsgd_scatter_reduce_allgather", 2)
    'QSGD scatter-reduce-allgather 2-bit'
    """
    if compressed is None:
        compressed = transport.startswith("qsgd")
    name = transport_name(transport)
    return f"{name} {bits}-bit" if compressed else name


_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"),
             (1e-6, "u"), (1e-9, "n"))


def si_text(value: float, unit: str = "") -> str:
    """``value`` with an SI prefix: ``si_text(20000) == '20k'``, ``si_text(0.002, 's') ==
    '2 ms'``, ``si_text(5e7, 'B') == '50 MB'`` (decimal: 1 MB = 1e6 bytes). Without a unit
    only k, M, G and T are used (``0.5`` stays ``0.5``).

    >>> si_text(20000), si_text(0.002, "s"), si_text(5e7, "B"), si_text(0.5)
    ('20k', '2 ms', '50 MB', '0.5')
    """
    if value == 0 or not math.isfinite(value):
        return f"{value:g}" + (f" {unit}" if unit else "")
    for scale, prefix in _PREFIXES:
        if not unit and scale < 1:
            break
        if abs(value) >= scale * (1 - 1e-9):
            return f"{value / scale:.3g}" + (f" {prefix}{unit}" if unit else prefix)
    return f"{value:g}" + (f" {unit}" if unit else "")


def log_ticks(lo: float, hi: float, unit: str = "") -> tuple[list[float], list[str]]:
    """Tick values and labels of a log axis spanning ``lo..hi``: the 1-2-5 steps of each
    decade, thinned to decades when that gives too many, with at least two ticks.

    Parameters
    ----------
    lo, hi : float
        The smallest and largest value drawn (> 0).
    unit : str
        Passed to :func:`si_text`: ``""`` (k, M), ``"s"`` or ``"B"``.

    Examples
    --------
    >>> log_ticks(0.004, 0.03, "s")
    ([0.005, 0.01, 0.02], ['5 ms', '10 ms', '20 ms'])
    >>> log_ticks(10, 2e6)[1]
    ['10', '100', '1k', '10k', '100k', '1M']
    """
    if not (lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"log_ticks: lo and hi must be finite and > 0, got {lo!r}, {hi!r}")
    lo, hi = min(lo, hi), max(lo, hi)
    first, last = math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1
    decades = [10.0 ** e for e in range(first, last + 1)]
    steps = [d * m for d in decades for m in (1, 2, 5)]
    ticks = [v for v in steps if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)]
    if len(ticks) > 8:
        ticks = [v for v in decades if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)]
    if len(ticks) < 2:   # a narrow range: the 1-2-5 steps just outside it
        below = [v for v in steps if v < lo]
        above = [v for v in steps if v > hi]
        ticks = below[-1:] + ticks + above[:1]
    ticks = [float(f"{v:.12g}") for v in ticks]
    return ticks, [si_text(v, unit) for v in ticks]


def log_axis(fig, values, unit: str = "", letter: str = "y", **where) -> None:
    """Make ``fig``'s ``letter`` axes (those of ``where``: ``row=``, ``col=``) log axes ticked
    at :func:`log_ticks` of ``values`` (the positive ones), spanning every tick they show.

    >>> import plotly.graph_objects as go
    >>> fig = go.Figure(go.Scatter(x=[1, 2], y=[3e3, 4e4]))
    >>> log_axis(fig, [3e3, 4e4])
    >>> fig.layout.yaxis.type, list(fig.layout.yaxis.ticktext)
    ('log', ['5k', '10k', '20k'])
    """
    values = [float(v) for v in values if v is not None and v > 0]
    if not values:
        return
    ticks, text = log_ticks(min(values), max(values), unit)
    lo, hi = min(min(values), ticks[0]), max(max(values), ticks[-1])
    pad = 0.04 * max(math.log10(hi / lo), 0.3)
    update = fig.update_yaxes if letter == "y" else fig.update_xaxes
    update(type="log", tickmode="array", tickvals=ticks, ticktext=text,
           range=[math.log10(lo) - pad, math.log10(hi) + pad], **where)


def wrap(text: str, width: int = 60) -> str:
    """``text`` broken into lines of at most ``width`` characters with ``<br>`` (plotly's
    line break), at spaces (and after commas in a long word, such as a topology spec); a title
    or label so wrapped is never cut off by its panel.

    >>> wrap("one iteration of QSGD all-gather 4-bit at 64 GPUs", 30)
    'one iteration of QSGD<br>all-gather 4-bit at 64 GPUs'
    >>> wrap("cluster:dgx_a100x{N},nic_bw=25Gbit", 24)    # a spec breaks after a comma
    'cluster:dgx_a100x{N},<br>nic_bw=25Gbit'
    """
    lines = []
    for line in textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False):
        while len(line) > width and "," in line[:width]:   # a spec: break after a comma
            cut = line.rindex(",", 0, width) + 1
            lines.append(line[:cut])
            line = line[cut:]
        lines.append(line)
    return "<br>".join(lines) or text


def style(fig, title: str, xaxis: str, yaxis: str):
    """The library's look: white template, titled axes, one legend right of the panels, the
    title left-aligned (wrap a long one with :func:`wrap`).

    >>> import plotly.graph_objects as go
    >>> fig = style(go.Figure(), "speedup", "GPUs", "x")
    >>> fig.layout.title.text, fig.layout.xaxis.title.text, fig.layout.legend.x
    ('speedup', 'GPUs', 1.02)
    """
    # The title sits on the plot (or on its panels' titles) and pushes the top margin as
    # far as its lines need: a wrapped title is never cut off by the figure's edge.
    above = max((1 + a.text.count("<br>") for a in fig.layout.annotations
                 if a.yref == "paper" and a.y == 1 and a.yanchor == "bottom"), default=0)
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 15},
               "yref": "paper", "y": 1, "yanchor": "bottom", "automargin": True,
               "pad": {"b": 10 + 16 * above}},
        template="plotly_white",
        margin={"l": 60, "r": 20, "b": 50, "t": 30},
        # one column right of the panels: the plot gives way to it (however long its
        # entries), so it never covers an axis title or tick labels, as a legend below
        # the plot does once it wraps into rows
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top",
                "yref": "paper", "tracegroupgap": 4},
    )
    if xaxis:
        fig.update_xaxes(title_text=xaxis)
    if yaxis:   # the first (left) panel's axis: panels side by side share it
        fig.layout.yaxis.title = {"text": yaxis}
    return fig


def message_figure(text: str, title: str = ""):
    """An empty figure that says why it is empty (no data yet, bad input, ...).

    >>> message_figure("press Run", "scaling").layout.annotations[0].text
    'press Run'
    """
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(
        title={"text": title}, template="plotly_white", xaxis={"visible": False},
        yaxis={"visible": False},
        annotations=[{"text": text, "showarrow": False, "xref": "paper", "yref": "paper",
                      "x": 0.5, "y": 0.5, "font": {"size": 14}}],
    )
    return fig


def gpu_ticks(sizes: Sequence[int]) -> tuple[list[int], list[str]]:
    """The world sizes studied, as tick values and labels of a log GPU axis.

    >>> gpu_ticks([64, 8, 1024, 8])
    ([8, 64, 1024], ['8', '64', '1024'])
    """
    sizes = sorted(set(int(s) for s in sizes))
    return sizes, [str(s) for s in sizes]
