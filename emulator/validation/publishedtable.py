"""The published-runs validation as a table: for the command line, an HTML page and the dashboard.

One owner of how a row of :func:`~emulator.validation.publishedrun.validate_published` reads:
:func:`table_rows` gives display strings and whether each comparison is within its target
(:data:`~emulator.validation.publishedrun.TARGETS`); :func:`text_lines` and :func:`to_html`
lay them out; :func:`summary_lines` states the targets, met or not.
"""
from __future__ import annotations

import html

from .publishedrun import TARGETS

#: (key, heading) of the displayed columns, in order.
COLUMNS = (("run", "run"), ("method", "method"), ("world_size", "GPUs"),
           ("topology", "topology"), ("published", "published"), ("predicted", "predicted"),
           ("error", "error"), ("efficiency", "scaling eff. published / predicted"),
           ("efficiency_error", "eff. error"), ("speedup", "speedup published / predicted"),
           ("speedup_error", "speedup error"), ("status", "status"))


def _f(x, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _unit(r: dict) -> str:
    return "" if r["published"] is None and r["predicted"] is None else r["unit"]


def table_rows(out: dict) -> list[dict]:
    """Each row's display strings (keys of :data:`COLUMNS`) and ``ok`` flags per compared
    figure (``error``, ``efficiency_error``, ``speedup_error``: True, False or None).

    >>> rows = table_rows({"rows": [{"run": "r", "method": "none", "world_size": 2,
    ...     "topology": "switch:2", "unit": "images/s", "published": 100.0, "predicted": 91.0,
    ...     "error": -0.09, "published_efficiency": 0.9, "predicted_efficiency": 0.97,
    ...     "efficiency_error": 0.07, "published_speedup": None, "predicted_speedup": None,
    ...     "speedup_error": None, "status": "predicted", "doubtful": False}]})
    >>> rows[0]["error"], rows[0]["ok"]
    ('-9.0%', {'error': True, 'efficiency_error': False, 'speedup_error': None})
    """
    out_rows = []
    for r in out["rows"]:
        ok = {"error": None if r["error"] is None else abs(r["error"]) <= TARGETS["throughput_max"],
              "efficiency_error": None if r["efficiency_error"] is None
              else abs(r["efficiency_error"]) <= TARGETS["efficiency"] + 1e-12,
              "speedup_error": None if r["speedup_error"] is None
              else abs(r["speedup_error"]) <= TARGETS["speedup"] + 1e-12}
        eff = "" if r["published_efficiency"] is None else \
            f"{r['published_efficiency']:.3f} / {_f(r['predicted_efficiency'], '.3f') or '-'}"
        sp = "" if r["published_speedup"] is None else \
            f"{r['published_speedup']:.2f}x / {(_f(r['predicted_speedup'], '.2f') + 'x') if r['predicted_speedup'] is not None else '-'}"
        status = r["status"] + (" (source doubtful)" if r.get("doubtful") else "")
        out_rows.append({
            "run": r["run"], "method": r["method"], "world_size": str(r["world_size"]),
            "topology": r["topology"],
            "published": f"{_f(r['published'], ',.1f')} {_unit(r) if r['published'] else ''}".strip(),
            "predicted": _f(r["predicted"], ",.1f"), "error": _f(r["error"], "+.1%"),
            "efficiency": eff, "efficiency_error": _f(r["efficiency_error"], "+.3f"),
            "speedup": sp, "speedup_error": _f(r["speedup_error"], "+.2f"),
            "status": status, "ok": ok})
    return out_rows


def summary_lines(out: dict) -> list[str]:
    """The targets of issue 30 against the summaries (all rows, trusted rows, diagnostic)."""
    lines = []
    for key, label in (("summary", "all files"),
                       ("summary_trusted", "without the files marked doubtful"),
                       ("summary_given_compute", "diagnostic, not a prediction: compute timed "
                                                 "as the published single-GPU run")):
        s = out.get(key)
        if not s:
            continue
        t, e, sp = s["throughput"], s["efficiency"], s["speedup"]
        text = f"{label}: {s['predicted']} of {s['points']} points predicted"
        if t["points"]:
            met = t["median_abs"] <= TARGETS["throughput_median"] and \
                t["max_abs"] <= TARGETS["throughput_max"]
            text += (f"; throughput median |error| {t['median_abs']:.1%} (target 10 %), max "
                     f"{t['max_abs']:.1%} (25 %), {t['within']} of {t['points']} within 25 %, "
                     f"{t['within_10']} within 10 % [{'met' if met else 'missed'}]")
        if e["points"]:
            text += (f"; scaling efficiency within 0.05 for {e['within']} of {e['points']} "
                     f"(median |error| {e['median_abs']:.3f}, max {e['max_abs']:.3f})")
        if sp["points"]:
            text += (f"; speedup within 0.1x for {sp['within']} of {sp['points']} "
                     f"(median |error| {sp['median_abs']:.2f}, max {sp['max_abs']:.2f})")
        mem = s.get("memory") or {}
        if mem.get("points"):
            text += (f"; memory per GPU against the published peak (no target): median "
                     f"|error| {mem['median_abs']:.1%}, max {mem['max_abs']:.1%}, "
                     f"{mem['within']} of {mem['points']} within 10 %")
        lines.append(text)
    reasons = (out.get("summary") or {}).get("unpredicted") or {}
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        lines.append(f"not predicted ({n} points): {why}")
    return lines


def text_lines(out: dict) -> list[str]:
    """A fixed-width table of every row, then :func:`summary_lines`."""
    widths = {"run": 44, "method": 26, "world_size": 4, "topology": 30, "published": 18,
              "predicted": 12, "error": 8, "efficiency": 15, "efficiency_error": 7,
              "speedup": 15, "speedup_error": 7, "status": 40}
    head = {"run": "run", "method": "method", "world_size": "GPUs", "topology": "topology",
            "published": "published", "predicted": "predicted", "error": "error",
            "efficiency": "efficiency", "efficiency_error": "diff", "speedup": "speedup",
            "speedup_error": "diff", "status": "status"}
    def line(row):
        return " ".join(str(row[k])[:w].ljust(w) if k in ("run", "method", "topology", "status")
                        else str(row[k])[:w].rjust(w) for k, w in widths.items()).rstrip()
    return [line(head)] + [line(r) for r in table_rows(out)] + [""] + summary_lines(out)


def to_html(out: dict, title: str = "Published training runs: predicted against measured") -> str:
    """A self-contained HTML page of the table (errors within target green, else red)."""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for _, h in COLUMNS)
    body = []
    for r in table_rows(out):
        cells = []
        for key, _ in COLUMNS:
            flag = r["ok"].get(key)
            cls = "" if flag is None else (' class="ok"' if flag else ' class="miss"')
            cells.append(f"<td{cls}>{esc(r[key])}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    summary = "".join(f"<li>{esc(s)}</li>" for s in summary_lines(out))
    return ("<!doctype html><html><head><meta charset='utf-8'><title>" + esc(title) +
            "</title><style>body{font:13px sans-serif;margin:1em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
            "td:first-child,td:nth-child(2),td:nth-child(4),td:last-child{text-align:left}"
            ".ok{background:#e3f4e3}.miss{background:#fbe3e3}</style></head><body>"
            f"<h1>{esc(title)}</h1><ul>{summary}</ul><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></body></html>\n")
