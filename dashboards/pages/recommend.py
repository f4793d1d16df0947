"""Recommend page: the fastest QSGD widths per layer group for a model, cluster, scale and budget.

The inputs mirror ``qsgd-emu recommend``: a model (measured here, with its per-bucket
quantization variance) or an uploaded PayloadTrace, a topology spec, one world size, a target
device and a budget (a variance increase, the variance of uniform B-bit QSGD, or bits per
element). "Run" starts a background job with progress; the page shows the Pareto front of
speedup against variance (uniform widths marked), the widths per layer as bars, and the
configuration as text to copy into ``QSGDState``.
"""
from __future__ import annotations

import uuid
from typing import Any, Mapping

from dash import Input, Output, State, dcc, html, no_update

from dashboards import forms, jobs
from dashboards.errors import DashboardError

NAME = "recommend"
PATH = "/recommend"
TITLE = "Recommend"

#: budget kind -> (label, the :class:`emulator.Budget` field or "variance_as_bits")
BUDGETS: dict[str, str] = {
    "variance_as_bits": "variance of uniform B-bit QSGD (B)",
    "variance": "max variance increase",
    "bits_per_element": "max bits per element",
}
DEFAULTS: dict[str, Any] = {"model": "resnet50", "spec": "cluster:dgx_a100x{N}", "size": 64,
                            "budget": "variance_as_bits", "value": "4", "device": ""}


def params_from_form(*, model, trace_upload, trace_filename, spec, size, budget, value, transports,
                     device) -> dict:
    """Validated job parameters from the raw form values; DashboardError names the field."""
    params: dict[str, Any] = {}
    if trace_upload:
        params["trace"] = forms.upload_json(trace_upload, trace_filename, "recommend-trace-upload")
        params["model"] = params["trace"].get("model", "uploaded trace")
    elif model:
        params["model"] = str(model)
    else:
        raise DashboardError("recommend-model: nothing selected; pick a model or upload a trace")
    if not (spec or "").strip():
        raise DashboardError("recommend-spec: empty; type a topology spec such as cluster:dgx_a100x{N}")
    params["topology"] = spec.strip()
    try:
        w = int(size)
    except (TypeError, ValueError):
        raise DashboardError(f"recommend-size: expected a number of GPUs, got {size!r}") from None
    if w < 1:
        raise DashboardError(f"recommend-size: expected at least 1 GPU, got {w}")
    params["world_size"] = w
    if budget not in BUDGETS:
        raise DashboardError(f"recommend-budget: expected one of {sorted(BUDGETS)}, got {budget!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise DashboardError(f"recommend-value: expected a number, got {value!r}") from None
    params["budget"] = (budget, v)
    if not transports:
        raise DashboardError("recommend-transports: pick at least one transport")
    params["transports"] = list(transports)
    params["device"] = device or "auto"
    params["bucket_size"] = 512
    return params


def draw(results: Mapping[str, Any] | None) -> tuple:
    """(front figure, bits figure, config text) of a job's result."""
    from emulator import figures

    if not results:
        msg = "press Run"
        return (figures.message_figure(msg, "Pareto front"), figures.message_figure(msg, "bits per layer"), "")
    return (figures.recommend_front_figure(results), figures.recommend_bits_figure(results),
            results.get("text", ""))


def layout(query: Mapping[str, str], ctx) -> Any:
    q = forms.from_query(query)
    models = sorted(jobs.api("qsgd", "MODELS"))
    transports = ["qsgd_allgather", "qsgd_scatter_reduce_allgather"]
    label = lambda text, for_id: html.Label(text, htmlFor=for_id)  # noqa: E731
    return html.Div([
        html.H2("Recommend: QSGD widths per layer under a variance budget"),
        html.Div([
            html.Div([label("model", "recommend-model"),
                      dcc.Dropdown(id="recommend-model", options=models,
                                   value=q.get("model", DEFAULTS["model"]))], className="field"),
            dcc.Upload(id="recommend-trace-upload", className="upload",
                       children=html.Div(["or drop a ", html.A("PayloadTrace")])),
            html.Div([label("topology spec ({N}: machines, {n}: GPUs)", "recommend-spec"),
                      dcc.Input(id="recommend-spec", type="text", debounce=True,
                                value=q.get("spec", DEFAULTS["spec"]))], className="field"),
            html.Div([label("GPUs", "recommend-size"),
                      dcc.Input(id="recommend-size", type="number", min=1, step=1, debounce=True,
                                value=q.get("size", DEFAULTS["size"]))], className="field"),
            html.Div([label("target device", "recommend-device"),
                      # as the What-if's: empty means the topology's own GPU ("auto"), and
                      # "measured" the speed the trace was measured at
                      dcc.Dropdown(id="recommend-device",
                                   options=["measured"] + sorted(jobs.api("emulator", "DEVICES")),
                                   value=q.get("device") or None,
                                   placeholder="the topology's own GPU")], className="field"),
        ], className="row"),
        html.Div([
            html.Div([label("budget", "recommend-budget"),
                      dcc.Dropdown(id="recommend-budget", clearable=False,
                                   options=[{"label": v, "value": k} for k, v in BUDGETS.items()],
                                   value=q.get("budget", DEFAULTS["budget"]))], className="field"),
            html.Div([label("value", "recommend-value"),
                      dcc.Input(id="recommend-value", type="text", debounce=True,
                                value=q.get("value", DEFAULTS["value"]))], className="field"),
            html.Div([label("transports", "recommend-transports"),
                      dcc.Checklist(id="recommend-transports", options=transports, value=transports,
                                    inline=True)], className="field"),
        ], className="row"),
        html.Div([
            html.Button("Run", id="recommend-run", n_clicks=0),
            html.Button("Cancel", id="recommend-cancel", n_clicks=0, disabled=True),
            html.Progress(id="recommend-progress", value="0", max="1"),
            html.Span(id="recommend-progress-text", className="status"),
        ], className="row"),
        html.Div(id="recommend-error", className="error"),
        dcc.Store(id="recommend-results"),
        dcc.Store(id="recommend-tab", data=uuid.uuid4().hex),
        html.Div([dcc.Graph(id="recommend-front", className="panel"),
                  dcc.Graph(id="recommend-bits", className="panel")], className="grid"),
        html.Div([dcc.Clipboard(target_id="recommend-config", title="copy"),
                  html.Pre(id="recommend-config")], className="row"),
    ], id="recommend-page")


def register(app, ctx) -> None:
    states = [State("recommend-model", "value"), State("recommend-trace-upload", "contents"),
              State("recommend-trace-upload", "filename"), State("recommend-spec", "value"),
              State("recommend-size", "value"), State("recommend-budget", "value"),
              State("recommend-value", "value"), State("recommend-transports", "value"),
              State("recommend-device", "value"), State("recommend-tab", "data")]

    @app.callback(
        Output("recommend-results", "data"), Output("recommend-error", "children"),
        Input("recommend-run", "n_clicks"), *states,
        background=True, manager=ctx.manager, prevent_initial_call=True,
        running=[(Output("recommend-run", "disabled"), True, False),
                 (Output("recommend-cancel", "disabled"), False, True)],
        progress=[Output("recommend-progress", "value"), Output("recommend-progress", "max"),
                  Output("recommend-progress-text", "children")],
        cancel=[Input("recommend-cancel", "n_clicks")],
    )
    def _run(set_progress, _n, model, trace_up, trace_name, spec, size, budget, value, transports,
             device, _tab):
        def progress(done, total, text):
            set_progress((str(done), str(max(total, 1)), text))

        try:
            params = params_from_form(model=model, trace_upload=trace_up, trace_filename=trace_name,
                                      spec=spec, size=size, budget=budget, value=value,
                                      transports=transports, device=device)
            params["cache_dir"] = ctx.cache_dir
            results = jobs.recommend_job(params, progress)
        except (ValueError, RuntimeError, OSError) as exc:
            progress(0, 1, "failed")
            return no_update, str(exc)
        return results, ""

    @app.callback(Output("recommend-front", "figure"), Output("recommend-bits", "figure"),
                  Output("recommend-config", "children"), Input("recommend-results", "data"))
    def _draw(results):
        return draw(results)
