"""Validation page: predicted against measured times, from a report or a measured log.

Below them, the published runs (``validate published``): the registry of published multi-GPU
training runs predicted with the project's defaults, as the same table the command prints
(``emulator.validation.publishedtable``): computed on the page ("Predict the registry", a
minute on two cores) or read from the command's ``published.json``.

Three uploads are understood: a ValidationReport (``qsgd-validation-report``: its points are
drawn as they are, and for each training step with bucket timelines the measured and the
emulator's timelines side by side, ``emulator.figures.timeline_comparison``), a MeasuredTrace
(``qsgd-measured-trace``) or an nccl-tests log (text, or ``-J`` JSON): their collectives are
predicted with ``emulator.run_collective`` on the chosen topology and compared. Reports stored
in the run store (kind ``validation-report``) can be picked as well.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from dash import Input, Output, State, dcc, html, no_update

from dashboards import figures, forms, jobs
from dashboards.forms import field
from dashboards.errors import DashboardError

NAME = "validation"
PATH = "/validation"
TITLE = "Validation"

ALGORITHMS = ("ring", "tree", "rhd", "direct")


def summarize(points: list[Mapping[str, Any]]) -> dict:
    """Median and max absolute relative error over the points."""
    errs = sorted(abs(float(p["rel_error"])) for p in points if p.get("rel_error") is not None)
    if not errs:
        return {"points": len(points)}
    mid = len(errs) // 2
    median = errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
    return {"points": len(points), "median_abs_rel_error": median, "max_abs_rel_error": errs[-1]}


def load_upload(contents: str | None, filename: str | None, topology_spec: str | None,
                algorithm: str | None) -> dict:
    """Points (``op``, ``bytes``, ``measured_s``, ``predicted_s``, ``rel_error``) from an upload.

    Raises
    ------
    DashboardError
        Empty or malformed upload, or a trace without a topology to predict on.
    """
    text = forms.upload_text(contents, filename, "validation-upload")
    data = None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        pass
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt == "qsgd-validation-report":
        points = jobs.report_points(data, filename)
        return {"points": points, "source": f"report {filename}",
                "topology": data.get("topology"), "summary": summarize(points),
                "training": training_steps(data)}
    if fmt == "qsgd-measured-trace":
        measured = jobs.measured_collectives(data, filename)
    else:
        measured = jobs.nccl_tests_collectives(text, filename)
    spec = (topology_spec or "").strip() or (measured.get("topology") or "")
    if not spec:
        raise DashboardError("validation-topology: empty; give the topology to predict on "
                             "(for example dgx_a100 or switch:8,bw=25GB/s)")
    points = jobs.predict_points(measured["collectives"], spec, algorithm or "ring",
                                 measured.get("world_size"))
    return {"points": points, "source": f"{filename} predicted on {spec}",
            "topology": spec, "summary": summarize(points)}


def training_steps(report: Mapping[str, Any]) -> list[dict]:
    """The report's training rows that carry measured and predicted bucket timelines."""
    rows = report.get("training") or []
    return [dict(r) for r in rows if isinstance(r, Mapping) and isinstance(r.get("timeline"), Mapping)
            and r["timeline"].get("measured") and r["timeline"].get("predicted")]


def step_options(result: Mapping[str, Any] | None) -> list[dict]:
    """Dropdown options, one per training step of the result."""
    out = []
    for i, r in enumerate((result or {}).get("training") or []):
        label = f"{r.get('replay_transport') or r.get('transport')} {r.get('bits')} bits"
        if r.get("rel_error") is not None:
            label += f" (step error {r['rel_error']:+.1%})"
        out.append({"label": label, "value": i})
    return out


def draw_timeline(result: Mapping[str, Any] | None, index) -> Any:
    """Measured against predicted bucket timelines of training step ``index`` of the result."""
    steps = (result or {}).get("training") or []
    if index is None or not isinstance(index, int) or not 0 <= index < len(steps):
        return figures.message_figure("upload a ValidationReport with training steps",
                                      "bucket timelines, measured and emulated")
    return jobs.api("emulator", "figures").timeline_comparison(steps[index])


def summary_text(result: Mapping[str, Any] | None) -> str:
    if not result:
        return "Upload a ValidationReport, a MeasuredTrace or an nccl-tests log."
    s = result.get("summary", {})
    text = f"{result.get('source')}: {s.get('points', 0)} points"
    if "median_abs_rel_error" in s:
        text += (f", median |error| {s['median_abs_rel_error']:.1%},"
                 f" max |error| {s['max_abs_rel_error']:.1%}")
    return text


def draw(result: Mapping[str, Any] | None) -> tuple:
    if not result or not result.get("points"):
        msg = "no points yet"
        return (figures.message_figure(msg, "predicted vs measured"),
                figures.message_figure(msg, "measured and predicted per size"))
    import emulator

    return (emulator.figures.validation_scatter(result["points"]),
            emulator.figures.validation_figure(result["points"], result.get("topology", ""),
                                               result.get("summary")))


# --- published runs ------------------------------------------------------------------

PUBLISHED_FORMAT = "qsgd-published-validation"
#: cell colours of a figure within / outside its target (the command's HTML uses the same)
OK_STYLE = {True: {"backgroundColor": "#e3f4e3"}, False: {"backgroundColor": "#fbe3e3"}}


def load_published_upload(contents: str | None, filename: str | None) -> dict:
    """The command's ``published.json`` (``qsgd-emu validate published --out DIR``)."""
    data = forms.upload_json(contents, filename, "validation-published-upload")
    if data.get("format") != PUBLISHED_FORMAT or not isinstance(data.get("rows"), list):
        raise DashboardError(f"validation-published-upload: {filename!r} is not a "
                             f"{PUBLISHED_FORMAT} file (qsgd-emu validate published writes one)")
    return data


def run_published() -> dict:
    """Every registry point predicted here (the diagnostic left out for time)."""
    return jobs.api("emulator.validation", "validate_published")(diagnose=False)


def published_table(out: Mapping[str, Any] | None) -> Any:
    """The registry's rows as the command prints them; errors within target green, else red."""
    if not out or not out.get("rows"):
        return html.P("No published runs predicted yet.")
    table = jobs.api("emulator.validation", "published_rows")(out)
    columns = jobs.api("emulator.validation", "PUBLISHED_COLUMNS")
    head = html.Tr([html.Th(h) for _, h in columns])
    body = [html.Tr([html.Td(r[k], style=OK_STYLE.get(r["ok"].get(k), {})) for k, _ in columns])
            for r in table]
    return html.Table([html.Thead(head), html.Tbody(body)], className="summary",
                      id="validation-published-rows")


def published_summary(out: Mapping[str, Any] | None) -> Any:
    if not out or not out.get("rows"):
        return ""
    lines = jobs.api("emulator.validation", "published_summary")(out)
    return html.Ul([html.Li(x) for x in lines])


def layout(query: Mapping[str, str], ctx) -> Any:
    return html.Div([
        html.H2("Validation: the emulator against measurements"),
        html.Div([
            dcc.Upload(id="validation-upload", children=html.Div(
                ["Drop or ", html.A("choose"), " a ValidationReport, MeasuredTrace or nccl-tests log"]),
                className="upload", multiple=False),
            field("topology (for logs and traces)",
                  dcc.Input(id="validation-topology", type="text", debounce=True,
                            value=query.get("topology", ""),
                            placeholder="from the trace, or e.g. dgx_a100")),
            field("algorithm", dcc.Dropdown(id="validation-algorithm", options=list(ALGORITHMS),
                                            value=query.get("algorithm", "ring"),
                                            clearable=False)),
        ], className="row"),
        html.Div([
            field("stored report", dcc.Dropdown(id="validation-stored",
                                                placeholder="reports in the run store")),
        ], className="row"),
        html.Div(id="validation-error", className="error"),
        html.Div(id="validation-summary", className="status"),
        dcc.Store(id="validation-result"),
        html.Div([dcc.Graph(id="validation-scatter", className="panel"),
                  dcc.Graph(id="validation-errors", className="panel")], className="grid"),
        html.Div([
            field("training step", dcc.Dropdown(id="validation-training", clearable=False,
                                                placeholder="training steps of the report")),
        ], className="row"),
        dcc.Graph(id="validation-timeline"),
        html.H3("Published training runs: predicted against measured"),
        html.Div([
            html.Button("Predict the registry", id="validation-published-run", n_clicks=0),
            dcc.Upload(id="validation-published-upload", children=html.Div(
                ["or drop the command's ", html.A("published.json")]),
                className="upload", multiple=False),
        ], className="row"),
        html.Div(id="validation-published-error", className="error"),
        dcc.Store(id="validation-published"),
        dcc.Loading(html.Div([html.Div(id="validation-published-summary", className="status"),
                              html.Div(id="validation-published-table")])),
    ], id="validation-page")


def register(app, ctx) -> None:
    @app.callback(Output("validation-stored", "options"), Input("validation-page", "id"))
    def _stored(_):
        try:
            return jobs.stored_reports(ctx.store_path)
        except (ValueError, RuntimeError, OSError):
            return []

    @app.callback(Output("validation-result", "data"), Output("validation-error", "children"),
                  Input("validation-upload", "contents"), Input("validation-topology", "value"),
                  Input("validation-algorithm", "value"), Input("validation-stored", "value"),
                  State("validation-upload", "filename"), prevent_initial_call=True)
    def _load(contents, spec, algorithm, stored, filename):
        try:
            if contents:
                return load_upload(contents, filename, spec, algorithm), ""
            if stored is not None:
                points = jobs.stored_report_points(ctx.store_path, stored)
                return {"points": points, "source": f"stored report #{stored}",
                        "summary": summarize(points)}, ""
        except (ValueError, RuntimeError, OSError) as exc:
            return None, str(exc)
        return no_update, ""

    @app.callback(Output("validation-scatter", "figure"), Output("validation-errors", "figure"),
                  Output("validation-summary", "children"), Output("validation-training", "options"),
                  Output("validation-training", "value"), Input("validation-result", "data"))
    def _draw(result):
        options = step_options(result)
        return (*draw(result), summary_text(result), options,
                options[-1]["value"] if options else None)

    @app.callback(Output("validation-published", "data"),
                  Output("validation-published-error", "children"),
                  Input("validation-published-run", "n_clicks"),
                  Input("validation-published-upload", "contents"),
                  State("validation-published-upload", "filename"), prevent_initial_call=True)
    def _published(n_clicks, contents, filename):
        from dash import ctx as trigger

        try:
            if trigger.triggered_id == "validation-published-upload" and contents:
                return load_published_upload(contents, filename), ""
            if n_clicks:
                return run_published(), ""
        except (ValueError, RuntimeError, OSError) as exc:
            return no_update, str(exc)
        return no_update, ""

    @app.callback(Output("validation-published-table", "children"),
                  Output("validation-published-summary", "children"),
                  Input("validation-published", "data"))
    def _published_table(out):
        return published_table(out), published_summary(out)

    @app.callback(Output("validation-timeline", "figure"), Input("validation-training", "value"),
                  Input("validation-result", "data"))
    def _timeline(index, result):
        try:
            return draw_timeline(result, index)
        except (ValueError, RuntimeError) as exc:
            return figures.message_figure(str(exc), "bucket timelines")
