"""Recommend page: the fastest QSGD widths per layer group for a model, cluster, scale and
budget, or the fastest data-parallel strategy that fits the GPU.

The inputs mirror ``qsgd-emu recommend``: a model (measured here, with its per-bucket
quantization variance) or an uploaded PayloadTrace, a topology spec, one world size, a target
device, the batch per GPU, the precision, activation checkpointing and the fused attention
kernel (as the What-if page's fields), a budget (a variance increase, the variance of uniform
B-bit QSGD, or bits per element) and the data parallelism (``--parallelism``). "Run"
starts a background job with progress (:mod:`dashboards.recommendjobs`). With ``ddp`` (the
default) the page shows the Pareto front of speedup against variance (uniform widths
marked), the widths per layer as bars, and the configuration as text to copy into
``QSGDState``; with strategies (``auto``: all) a table of every strategy, transport and width
tried, the pick marked. The text says what the compute model assumed. The inputs are
mirrored into the URL query string, so a recommendation can be shared by URL.
"""
from __future__ import annotations

import uuid
from typing import Any, Mapping

from dash import Input, Output, State, dcc, html, no_update

from dashboards import forms, jobs, recommendjobs
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
                            "budget": "variance_as_bits", "value": "4", "device": "",
                            "batch": "", "precision": "", "parallelism": ["ddp"],
                            "checkpointing": "", "attention": ""}
#: the QSGD transports a width recommendation may pick
TRANSPORTS = ["qsgd_allgather", "qsgd_scatter_reduce_allgather"]
#: URL query key -> form component id (the state that a shared URL restores).
QUERY_IDS: dict[str, str] = {
    "model": "recommend-model", "spec": "recommend-spec", "size": "recommend-size",
    "device": "recommend-device", "batch": "recommend-batch",
    "precision": "recommend-precision", "checkpointing": "recommend-checkpointing",
    "attention": "recommend-attention",
    "parallelism": "recommend-parallelism", "budget": "recommend-budget",
    "value": "recommend-value", "transports": "recommend-transports",
}
#: what the strategy table shows of each option: (StrategyOption field, column title)
STRATEGY_COLUMNS = (("strategy", "strategy"), ("transport", "transport"), ("bits", "bits"),
                    ("iteration_s", "iteration ms"), ("memory_per_gpu", "memory per GPU GB"),
                    ("fits", "fits"))


def parallelism_from_form(value) -> str:
    """The data parallelism picked: ``"ddp"`` (widths per bucket), ``"auto"`` (every
    strategy) or names joined by commas (``qsgd-emu recommend --parallelism``'s syntax)."""
    if isinstance(value, str):
        value = value.split(",")
    names = [str(v).strip() for v in (value or []) if str(v).strip()]
    allowed = list(jobs.api("qsgd", "STRATEGIES"))
    for name in names:
        if name != "auto" and name not in allowed:
            raise DashboardError(f"recommend-parallelism: {name!r} is not one of auto, "
                                 f"{', '.join(allowed)}")
    if not names or names == ["ddp"]:
        return "ddp"
    if "auto" in names:
        return "auto"
    return ",".join(dict.fromkeys(names))


def params_from_form(*, model, trace_upload, trace_filename, spec, size, budget, value, transports,
                     device, batch=None, precision=None, parallelism=None,
                     checkpointing=None, attention=None) -> dict:
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
    # as the What-if page: empty is the model's usual training batch and the GPU's usual
    # precision (emulator.compute), activation checkpointing as the trace was recorded, and
    # FlashAttention-2
    params["batch_size"] = None if batch in (None, "") else \
        forms.parse_int(batch, "recommend-batch", min_value=1, max_value=1 << 20)
    params["precision"] = forms.parse_choice(precision, "recommend-precision",
                                             jobs.api("emulator", "PRECISIONS"))
    params["checkpointing"] = forms.parse_choice(checkpointing, "recommend-checkpointing",
                                                 jobs.api("qsgd", "CHECKPOINTING"))
    params["attention"] = forms.parse_choice(attention, "recommend-attention",
                                             jobs.api("emulator", "ATTENTION_KERNELS"))
    params["parallelism"] = parallelism_from_form(parallelism)
    return params


def strategy_table(choice: Mapping[str, Any]) -> Any:
    """Every option of a ``StrategyChoice.to_dict()``: one row each, the pick marked."""
    best = choice["best"]

    def cell(option, key):
        v = option[key]
        if key == "iteration_s":
            return "" if v is None else f"{v * 1e3:.2f}"
        if key == "memory_per_gpu":
            return f"{v / 1e9:.3g}"
        if key == "fits":
            return "yes" if v else "no"
        return str(v)

    head = html.Tr([html.Th(title) for _, title in STRATEGY_COLUMNS] + [html.Th("")])
    body = [html.Tr([html.Td(cell(o, k)) for k, _ in STRATEGY_COLUMNS]
                    + [html.Td("picked" if o == best else "")],
                    className="picked" if o == best else None)
            for o in choice["options"]]
    return html.Div([
        html.P(f"picked: {best['strategy']} with {best['transport']}"
               f"{'' if best['transport'] == 'fp32' else ' ' + str(best['bits']) + '-bit'}, "
               f"{best['iteration_s'] * 1e3:.2f} ms per iteration, "
               f"{best['memory_per_gpu'] / 1e9:.3g} GB per GPU, at {choice['world_size']} GPUs "
               f"of {choice['device']} ({choice['device_bytes'] / 1e9:.0f} GB)",
               id="recommend-strategy-pick"),
        html.Table([html.Thead(head), html.Tbody(body)], className="summary",
                   id="recommend-strategy-table"),
        *[html.P(f"note: {n}", className="status") for n in choice.get("notes", [])],
    ])


def draw(results: Mapping[str, Any] | None) -> tuple:
    """(front figure, bits figure, config text, strategy table) of a job's result."""
    from emulator import figures

    if not results:
        msg = "press Run"
        return (figures.message_figure(msg, "Pareto front"), figures.message_figure(msg, "bits per layer"),
                "", "")
    if results.get("strategy"):
        msg = "strategy recommendation: see the table"
        return (figures.message_figure(msg, "Pareto front"), figures.message_figure(msg, "bits per layer"),
                results.get("text", ""), strategy_table(results["strategy"]))
    return (figures.recommend_front_figure(results), figures.recommend_bits_figure(results),
            results.get("text", ""), "")


def layout(query: Mapping[str, str], ctx) -> Any:
    q = forms.from_query(query)
    models = sorted(jobs.api("qsgd", "MODELS"))
    strategies = list(jobs.api("qsgd", "STRATEGIES"))
    label = lambda text, for_id: html.Label(text, htmlFor=for_id)  # noqa: E731
    return html.Div([
        html.H2("Recommend: QSGD widths per layer under a budget, or a data-parallel strategy"),
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
            # as the What-if's: an empty device is the topology's own GPU ("auto"), and
            # "measured" the speed the trace was measured at
            *forms.compute_fields("recommend", q,
                                  ["measured"] + sorted(jobs.api("emulator", "DEVICES")),
                                  list(jobs.api("emulator", "PRECISIONS")),
                                  list(jobs.api("qsgd", "CHECKPOINTING")),
                                  list(jobs.api("emulator", "ATTENTION_KERNELS"))),
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
                      dcc.Checklist(id="recommend-transports", options=TRANSPORTS,
                                    value=forms.query_list(q, "transports", TRANSPORTS),
                                    inline=True)], className="field"),
            html.Div([label("data parallelism (ddp: widths per layer; others, auto: the "
                            "strategy)", "recommend-parallelism"),
                      dcc.Dropdown(id="recommend-parallelism", multi=True,
                                   options=["auto"] + strategies,
                                   value=forms.query_list(q, "parallelism",
                                                          DEFAULTS["parallelism"]))],
                     className="field"),
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
        html.Div(id="recommend-strategies"),
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
              State("recommend-device", "value"), State("recommend-batch", "value"),
              State("recommend-precision", "value"), State("recommend-parallelism", "value"),
              State("recommend-checkpointing", "value"), State("recommend-attention", "value"),
              State("recommend-tab", "data")]

    # the What-if page writes the URL too: a second writer of url.search
    @app.callback(Output("url", "search", allow_duplicate=True),
                  [Input(i, "value") for i in QUERY_IDS.values()], prevent_initial_call=True)
    def _share(*values):
        return forms.to_query(dict(zip(QUERY_IDS, values)))

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
             device, batch, precision, parallelism, checkpointing, attention, _tab):
        def progress(done, total, text):
            set_progress((str(done), str(max(total, 1)), text))

        try:
            params = params_from_form(model=model, trace_upload=trace_up, trace_filename=trace_name,
                                      spec=spec, size=size, budget=budget, value=value,
                                      transports=transports, device=device, batch=batch,
                                      precision=precision, parallelism=parallelism,
                                      checkpointing=checkpointing, attention=attention)
            params["cache_dir"] = ctx.cache_dir
            results = recommendjobs.recommend_job(params, progress)
        except (ValueError, RuntimeError, OSError) as exc:
            progress(0, 1, "failed")
            return no_update, str(exc)
        return results, ""

    @app.callback(Output("recommend-front", "figure"), Output("recommend-bits", "figure"),
                  Output("recommend-config", "children"), Output("recommend-strategies", "children"),
                  Input("recommend-results", "data"))
    def _draw(results):
        return draw(results)
