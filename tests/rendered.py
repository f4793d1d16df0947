"""What Plotly drew in a real browser, read back from the SVG, and whether a person can read it.

:func:`read_figures` returns, for each ``.js-plotly-plot`` of a page, the text and boxes that
are on screen: the title, the panel titles, every axis' tick labels (with the axis type), the
legend entries with their swatch (colour, dash, marker) and the lines drawn in each panel.
:func:`problems` lists what would not read cleanly: a title or panel title cut off by the
figure's edge, a log axis labelled at anything but 1-2-5 steps (plotly's minor-tick labels;
a GPU axis may be labelled at exactly the world sizes drawn),
category labels running into each other or off the figure, a legend over the axes, two
legend entries or two lines of one panel that look alike, a colour that means two transports.
Browser tests of the report and of the dashboard assert that the list is empty.
"""
from __future__ import annotations

import re

#: ``el`` (a .js-plotly-plot) -> what is on screen, boxes in px relative to the figure's SVG.
READ_JS = """(el) => {
  const svg = el.querySelector('.main-svg');
  const S = svg.getBoundingClientRect();
  const box = (n) => { const r = n.getBoundingClientRect();
    return {l: r.left - S.left, r: r.right - S.left, t: r.top - S.top, b: r.bottom - S.top}; };
  const style = (n, k) => n ? (n.style.getPropertyValue(k) || '').trim() : '';
  const fl = el._fullLayout;
  const axes = {};
  for (const k of Object.keys(fl)) {
    if (!/^[xy]axis\\d*$/.test(k) || !fl[k] || !fl[k]._id) continue;
    const ax = fl[k];
    const title = el.querySelector('.g-' + ax._id + 'title text');
    axes[ax._id] = {type: ax.type, title: title ? {text: title.textContent, box: box(title)} : null,
      ticks: Array.from(el.querySelectorAll('g.' + ax._id + 'tick text'))
                  .map(t => ({text: t.textContent, box: box(t)}))};
  }
  const legend = Array.from(el.querySelectorAll('.legend .traces')).map(g => {
    const line = g.querySelector('.legendlines path');
    const point = g.querySelector('.legendpoints path');
    return {text: g.querySelector('.legendtext').textContent, box: box(g),
            stroke: style(line, 'stroke'), dash: style(line, 'stroke-dasharray'),
            fill: style(point, 'fill'), symbol: point ? point.getAttribute('d') : ''};
  });
  const legendBox = el.querySelector('.legend') ? box(el.querySelector('.legend .bg')) : null;
  const panels = {};
  for (const sp of el.querySelectorAll('.cartesianlayer > g.subplot')) {
    const id = Array.from(sp.classList).find(c => c !== 'subplot');
    panels[id] = Array.from(sp.querySelectorAll('.scatterlayer .trace path.js-line'))
      .filter(p => (p.getAttribute('d') || '').length > 0)
      .map(p => ({stroke: style(p, 'stroke'), dash: style(p, 'stroke-dasharray')}));
  }
  const title = el.querySelector('.gtitle');
  const xs = new Set();
  for (const t of el.data) for (const x of (t.x || [])) if (typeof x === 'number') xs.add(x);
  return {width: S.width, height: S.height, xs: Array.from(xs),
          title: title ? {text: title.textContent, box: box(title)} : null,
          annotations: Array.from(el.querySelectorAll('.annotation-text'))
                            .map(t => ({text: t.textContent, box: box(t)})),
          axes, legend, legend_box: legendBox, panels};
}"""


def read_figures(page, selector: str = ".js-plotly-plot") -> list[dict]:
    """What every figure matching ``selector`` shows on ``page`` (a Playwright page)."""
    return [page.evaluate(READ_JS, el) for el in page.query_selector_all(selector)]


#: A label of a 1-2-5 step with an optional SI prefix and unit: ``5``, ``20k``, ``2 ms``, ``1 GB``.
STEP_125 = re.compile(r"^(1|2|5)(0{0,3})(k|M|G|T)?( ?(n|u|m|k|M|G|T)?(s|B))?$")


def _inside(box: dict, fig: dict, slack: float = 1.0) -> bool:
    return box["l"] >= -slack and box["r"] <= fig["width"] + slack and box["t"] >= -slack \
        and box["b"] <= fig["height"] + slack


def _overlap(a: dict, b: dict) -> bool:
    return a["l"] < b["r"] - 0.5 and b["l"] < a["r"] - 0.5 and a["t"] < b["b"] - 0.5 \
        and b["t"] < a["b"] - 0.5


def transport_of(entry: str) -> str:
    """A legend entry without its bit width: ``QSGD all-gather 4-bit`` -> ``QSGD all-gather``."""
    return re.sub(r" \d+-bit$", "", entry)


def problems(fig: dict, *, configurations: bool = True) -> list[str]:
    """What would not read cleanly in one figure of :func:`read_figures` (empty: all clear).

    ``configurations``: the legend lists configurations (transport and bit width), so one
    colour must mean one transport and no two entries may look alike.
    """
    out = []
    name = (fig["title"] or {}).get("text", "?")[:50]
    for t in [fig["title"]] + fig["annotations"]:
        if t and not _inside(t["box"], fig):
            out.append(f"{name}: '{t['text']}' is cut off by the figure's edge")
    for axis, ax in fig["axes"].items():
        ticks = ax["ticks"]
        if ax["type"] == "log":
            studied = {str(int(x)) for x in fig["xs"] if float(x).is_integer()}
            bad = [t["text"] for t in ticks if not STEP_125.match(t["text"].replace("\u2212", "-"))]
            if axis.startswith("x") and set(bad) <= studied:
                bad = []        # a GPU axis labelled at exactly the world sizes drawn
            if bad:
                out.append(f"{name}: log axis {axis} labels {bad} (not 1-2-5 steps)")
        if ax["type"] == "category":
            for i, a in enumerate(ticks):
                if not _inside(a["box"], fig):
                    out.append(f"{name}: category label '{a['text']}' runs off the figure")
                for b in ticks[i + 1:]:
                    if _overlap(a["box"], b["box"]):
                        out.append(f"{name}: labels '{a['text']}' and '{b['text']}' overlap")
        if fig["legend_box"] is not None:
            for t in ticks + ([ax["title"]] if ax["title"] else []):
                if _overlap(t["box"], fig["legend_box"]):
                    out.append(f"{name}: the legend covers '{t['text']}' of axis {axis}")
    if configurations:
        looks = {}
        colour_of: dict[str, str] = {}
        for e in fig["legend"]:
            look = (e["stroke"] or e["fill"], e["dash"], e["symbol"])
            if look in looks:
                out.append(f"{name}: legend entries '{looks[look]}' and '{e['text']}' look alike")
            looks[look] = e["text"]
            colour = e["stroke"] or e["fill"]
            if not colour:
                continue
            t = transport_of(e["text"])
            if colour_of.setdefault(colour, t) != t:
                out.append(f"{name}: colour {colour} means both {colour_of[colour]} and {t}")
        for panel, lines in fig["panels"].items():
            seen = [(ln["stroke"], ln["dash"]) for ln in lines]
            if len(seen) != len(set(seen)):
                out.append(f"{name}: two lines of panel {panel} look alike: {sorted(seen)}")
    return out
