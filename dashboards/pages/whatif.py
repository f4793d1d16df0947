"""What-if page: QSGD on a chosen cluster: where it pays (the report's headline figure), scaling
and speedup curves, the iteration breakdown and one iteration's timeline; the same figure
functions as ``report.html`` (:mod:`emulator.figures`).

The inputs mirror ``qsgd-emu study``: a topology (a preset or spec, or an uploaded topology
file), a model (its layout and operators recorded on the meta device; measured on this CPU
only for the device "measured") or an uploaded PayloadTrace, bit widths, bucket size,
transports, world sizes, a target device (default: the topology's own GPU), the batch per GPU
and the precision (default: the model's usual batch, the GPU's usual precision), the data
parallelism (DDP or a sharded strategy), activation checkpointing (default: as the trace
was recorded) and the fused attention kernel (default: FlashAttention-2, as ``qsgd-emu study
--attention-kernel``); the conclusions say what the compute model assumed. "Run" starts
a Dash background callback (its own process, with progress and cancel), so the page never
freezes and two tabs run studies at once. The inputs are mirrored into the URL query string, so a study can be shared by URL.
A ladder picker fills the sizes (:data:`LADDERS`: the default 8-128 GPUs, or 8, 64 and 8,192
GPUs), and the study's conclusions under the buttons say, per size, which rows took NCCL's
calibrated closed form instead of the engine.
"""
from __future__ import annotations

import csv
import io
import json
import uuid
from typing import Any, Mapping

from dash import Input, Output, State, dcc, html, no_update

from dashboards import figures, forms, jobs
from dashboards.errors import DashboardError

NAME = "whatif"
PATH = "/whatif"
TITLE = "What-if"

BIT_CHOICES = (32, 16, 8, 4, 2)
DEFAULTS: dict[str, Any] = {
    "topology": "dgx_a100",
    "spec": "",
    "model": "resnet50",
    "bits": [32, 16, 8, 4, 2],
    "bucket": 512,
    "transports": [],  # filled from the emulator's QSGD transports at layout time
    # 1 to 16 machines: the study takes about 9 s on 2 cores once the model's trace is
    # cached, 17 s with measuring it (benchmarks/dashboard_whatif.py; benchmarks/RESULTS.md).
    "sizes": "8,16,32,64,128",
    "device": "",
    "batch": "",
    "precision": "",
    "parallelism": "ddp",
    "checkpointing": "",
    "attention": "",
    "metric": "throughput_samples_s",
}
#: World-size ladders offered next to the sizes field: (label, sizes). The second reaches
#: 8,192 GPUs (1,024 DGX machines), where NCCL collectives whose engine run would take over
#: 30 s take the calibrated closed form (the conclusions under the buttons say which rows);
#: about a minute on 2 free cores with the default widths, more on a busy machine
#: (benchmarks/RESULTS.md, issue 34).
LADDERS = (("8-128 GPUs (1-16 machines, ~20 s)", "8,16,32,64,128"),
           ("8, 64 and 8,192 GPUs (up to 1,024 machines, 1-2 min)", "8,64,8192"))
#: choices shown in their registry's order (the usual first); the others are sorted
IN_REGISTRY_ORDER = frozenset({"precision", "parallelism", "checkpointing", "attention"})
#: URL query key -> form component id (the state that a shared URL restores).
QUERY_IDS: dict[str, str] = {
    "topology": "whatif-topology", "spec": "whatif-spec", "model": "whatif-model",
    "bits": "whatif-bits", "bucket": "whatif-bucket", "transports": "whatif-transports",
    "sizes": "whatif-sizes", "device": "whatif-device", "batch": "whatif-batch",
    "precision": "whatif-precision", "metric": "whatif-metric",
    "parallelism": "whatif-parallelism", "checkpointing": "whatif-checkpointing",
    "attention": "whatif-attention",
}


def params_from_form(*, topology, spec, topology_upload, topology_filename, model, trace_upload,
                     trace_filename, bits, bucket, transports, sizes, device, batch=None,
                     precision=None, parallelism=None, checkpointing=None,
                     attention=None) -> dict:
    """Validated study parameters (JSON-ready) from the raw form values.

    Raises
    ------
    DashboardError
        Naming the field: empty selections, unparsable numbers, malformed uploads.
    """
    params: dict[str, Any] = {}
    if topology_upload:
        params["topology_upload"] = {
            "filename": topology_filename,
            "text": forms.upload_text(topology_upload, topology_filename, "whatif-topology-upload"),
        }
        params["topology"] = topology_filename or "uploaded topology"
    else:
        chosen = (spec or "").strip()
        if not chosen and (topology or "").strip():
            # A machine preset grows with the world size: as many machines as the GPUs need.
            chosen = f"cluster:{topology.strip()}x{{N}}"
        if not chosen:
            raise DashboardError("whatif-topology: nothing selected; pick a preset or type a spec")
        params["topology"] = chosen
    if trace_upload:
        params["trace"] = forms.upload_json(trace_upload, trace_filename, "whatif-trace-upload")
        fmt = params["trace"].get("format")
        if fmt != "qsgd-payload-trace":
            raise DashboardError(f"whatif-trace-upload: {trace_filename!r} has format {fmt!r}, "
                                 "expected 'qsgd-payload-trace'")
        params["model"] = params["trace"].get("model", "uploaded trace")
    else:
        if not model:
            raise DashboardError("whatif-model: nothing selected; pick a model or upload a trace")
        params["model"] = str(model)
    params["bits"] = [int(b) for b in forms.require_selection(bits, "whatif-bits")]
    params["bucket_size"] = forms.parse_int(bucket, "whatif-bucket", min_value=1, max_value=1 << 24)
    qsgd_bits = [b for b in params["bits"] if b < 16]
    params["transports"] = list(forms.require_selection(transports, "whatif-transports")) \
        if qsgd_bits else list(transports or [])
    params["world_sizes"] = list(forms.parse_int_list(sizes, "whatif-sizes", min_value=1,
                                                      max_value=65536))
    params["device"] = device or None
    # empty: the model's usual training batch and the GPU's usual precision (emulator.compute)
    params["batch_size"] = None if batch in (None, "") else \
        forms.parse_int(batch, "whatif-batch", min_value=1, max_value=1 << 20)
    params["precision"] = precision or None
    params["parallelism"] = parallelism or "ddp"
    # empty: as the trace's operators were recorded (a model picked here: none)
    params["checkpointing"] = forms.parse_choice(checkpointing, "whatif-checkpointing",
                                                 jobs.api("qsgd", "CHECKPOINTING"))
    # empty: FlashAttention-2, what PyTorch's SDPA runs (emulator.compute.DEFAULT_ATTENTION)
    params["attention"] = forms.parse_choice(attention, "whatif-attention",
                                             jobs.api("emulator", "ATTENTION_KERNELS"))
    return params


def upload_names(topology_filename: str | None, trace_filename: str | None) -> str:
    """What is uploaded, shown next to the upload boxes (uploads win over the pickers)."""
    parts = []
    if topology_filename:
        parts.append(f"topology file: {topology_filename}")
    if trace_filename:
        parts.append(f"trace: {trace_filename}")
    return "; ".join(parts) if parts else "no uploads"


def rows_csv(rows: list[Mapping[str, Any]]) -> str:
    """Study rows as CSV text (columns in first-seen order)."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k) for k in columns})
    return buf.getvalue()


def draw(results: Mapping[str, Any] | None, metric: str) -> tuple:
    """Headline, scaling, speedup, breakdown and timeline figures for a job's results."""
    if not results or not results.get("rows"):
        msg = "press Run to start a study"
        return tuple(figures.message_figure(msg, title) for title in
                     ("where QSGD pays", "scaling", "speedup", "breakdown", "timeline"))
    import emulator

    rows = [emulator.StudyRow.from_dict(r) for r in results["rows"]]
    gantt = results.get("gantt")
    lib = emulator.figures
    return (lib.headline_figure(rows),
            lib.scaling_figure(rows, metric),
            lib.scaling_figure(rows, "speedup_vs_fp32"),
            lib.breakdown_figure(rows),
            lib.timeline_figure(emulator.Prediction.from_dict(gantt))
            if gantt else figures.message_figure("no timeline"))


def _options(ctx) -> tuple[dict[str, list], str]:
    """Choices of the form, and a message when a part of the project they come from is missing."""
    import topologies

    opts = {"topology": sorted(topologies.PRESETS), "model": [], "transports": [], "device": [],
            "precision": [], "parallelism": [], "checkpointing": [], "attention": []}
    problems = []
    for key, (module, name) in {"model": ("qsgd", "MODELS"), "device": ("emulator", "DEVICES"),
                                "transports": ("emulator", "TRANSPORTS"),
                                "precision": ("emulator", "PRECISIONS"),
                                "parallelism": ("qsgd", "STRATEGIES"),
                                "checkpointing": ("qsgd", "CHECKPOINTING"),
                                "attention": ("emulator", "ATTENTION_KERNELS")}.items():
        try:
            names = jobs.api(module, name)
        except RuntimeError as exc:
            problems.append(str(exc))
            continue
        opts[key] = jobs.qsgd_transports() if key == "transports" else \
            list(names) if key in IN_REGISTRY_ORDER else sorted(names)
    if opts["device"]:
        opts["device"] = ["measured"] + opts["device"]
    return opts, "; ".join(problems)


def layout(query: Mapping[str, str], ctx) -> Any:
    import emulator

    opts, problem = _options(ctx)
    q = forms.from_query(query)
    transports_default = opts["transports"]
    bits = forms.query_list(q, "bits", DEFAULTS["bits"], int)
    transports = forms.query_list(q, "transports", transports_default)
    label = lambda text, for_id: html.Label(text, htmlFor=for_id)  # noqa: E731
    compute = forms.compute_fields("whatif", q, opts["device"], opts["precision"],
                                   opts["checkpointing"], opts["attention"])
    return html.Div([
        html.H2("What-if: QSGD on your cluster"),
        html.Div([
            html.Div([label("topology preset", "whatif-topology"),
                      dcc.Dropdown(id="whatif-topology", options=opts["topology"],
                                   value=q.get("topology", DEFAULTS["topology"]))], className="field"),
            html.Div([label("or spec (with {n} for the GPU count)", "whatif-spec"),
                      dcc.Input(id="whatif-spec", type="text", value=q.get("spec", ""),
                                placeholder="fat_tree:k=8,bw=100Gbit", debounce=True)], className="field"),
            dcc.Upload(id="whatif-topology-upload", className="upload",
                       children=html.Div(["or drop a ", html.A("topology file")])),
            html.Div([label("model", "whatif-model"),
                      dcc.Dropdown(id="whatif-model", options=opts["model"],
                                   value=q.get("model", DEFAULTS["model"]))], className="field"),
            dcc.Upload(id="whatif-trace-upload", className="upload",
                       children=html.Div(["or drop a ", html.A("PayloadTrace")])),
            html.Div([html.Span(id="whatif-upload-names", className="status"),
                      html.Button("clear uploads", id="whatif-clear-uploads", n_clicks=0)],
                     className="field"),
            *compute[:3],
            html.Div([label("data parallelism", "whatif-parallelism"),
                      dcc.Dropdown(id="whatif-parallelism", options=opts["parallelism"],
                                   value=q.get("parallelism", DEFAULTS["parallelism"]),
                                   clearable=False)], className="field"),
            *compute[3:],
        ], className="row"),
        html.Div([
            html.Div([label("bits", "whatif-bits"),
                      dcc.Checklist(id="whatif-bits", options=list(BIT_CHOICES), value=bits,
                                    inline=True)], className="field"),
            html.Div([label("bucket size (elements)", "whatif-bucket"),
                      dcc.Input(id="whatif-bucket", type="number", min=1, step=1, debounce=True,
                                value=q.get("bucket", DEFAULTS["bucket"]))], className="field"),
            html.Div([label("QSGD transports", "whatif-transports"),
                      dcc.Checklist(id="whatif-transports", options=opts["transports"],
                                    value=transports, inline=True)], className="field"),
            html.Div([label("world sizes (GPUs)", "whatif-sizes"),
                      dcc.Input(id="whatif-sizes", type="text", debounce=True,
                                value=q.get("sizes", DEFAULTS["sizes"]))], className="field"),
            html.Div([label("or a ladder", "whatif-ladder"),
                      dcc.Dropdown(id="whatif-ladder", placeholder="pick to fill the sizes",
                                   options=[{"label": t, "value": v} for t, v in LADDERS])],
                     className="field"),
        ], className="row"),
        html.Div([
            html.Button("Run", id="whatif-run", n_clicks=0),
            html.Button("Cancel", id="whatif-cancel", n_clicks=0, disabled=True),
            html.Progress(id="whatif-progress", value="0", max="1"),
            html.Span(id="whatif-progress-text", className="status"),
            html.Button("Download CSV", id="whatif-download-csv", n_clicks=0),
            html.Button("Download JSON", id="whatif-download-json", n_clicks=0),
            dcc.Download(id="whatif-download"),
        ], className="row"),
        html.Div(problem and f"What-if studies are unavailable: {problem}", id="whatif-error",
                 className="error"),
        # the study's conclusions: the fastest row per size and how its times were made
        html.Ul(id="whatif-conclusions", className="status"),
        dcc.Store(id="whatif-results"),
        # A token per rendered page: Dash keys background jobs by their inputs, so two tabs
        # running the same study would otherwise share (and steal) one job's result.
        dcc.Store(id="whatif-tab", data=uuid.uuid4().hex),
        html.Div([
            label("scaling metric", "whatif-metric"),
            dcc.RadioItems(id="whatif-metric", inline=True,
                           value=q.get("metric", DEFAULTS["metric"]),
                           options=[{"label": emulator.figures.SCALING_METRICS[k][0], "value": k}
                                    for k in ("throughput_samples_s", "iteration_s",
                                              "scaling_efficiency", "bytes_per_gpu")]),
        ], className="row"),
        html.Div([dcc.Graph(id="whatif-headline", className="panel wide"),
                  dcc.Graph(id="whatif-scaling", className="panel wide"),
                  dcc.Graph(id="whatif-speedup", className="panel wide"),
                  dcc.Graph(id="whatif-breakdown", className="panel wide"),
                  dcc.Graph(id="whatif-gantt", className="panel wide")], className="grid"),
    ], id="whatif-page")


def register(app, ctx) -> None:
    form_states = [
        State("whatif-topology", "value"), State("whatif-spec", "value"),
        State("whatif-topology-upload", "contents"), State("whatif-topology-upload", "filename"),
        State("whatif-model", "value"), State("whatif-trace-upload", "contents"),
        State("whatif-trace-upload", "filename"), State("whatif-bits", "value"),
        State("whatif-bucket", "value"), State("whatif-transports", "value"),
        State("whatif-sizes", "value"), State("whatif-device", "value"),
        State("whatif-batch", "value"), State("whatif-precision", "value"),
        State("whatif-parallelism", "value"), State("whatif-checkpointing", "value"),
        State("whatif-attention", "value"), State("whatif-tab", "data"),
    ]

    @app.callback(Output("url", "search"), [Input(i, "value") for i in QUERY_IDS.values()],
                  prevent_initial_call=True)
    def _share(*values):
        return forms.to_query(dict(zip(QUERY_IDS, values)))

    @app.callback(
        Output("whatif-results", "data"), Output("whatif-error", "children"),
        Input("whatif-run", "n_clicks"), *form_states,
        background=True, manager=ctx.manager, prevent_initial_call=True,
        running=[(Output("whatif-run", "disabled"), True, False),
                 (Output("whatif-cancel", "disabled"), False, True)],
        progress=[Output("whatif-progress", "value"), Output("whatif-progress", "max"),
                  Output("whatif-progress-text", "children")],
        cancel=[Input("whatif-cancel", "n_clicks")],
    )
    def _run(set_progress, _n, topology, spec, topo_up, topo_name, model, trace_up, trace_name,
             bits, bucket, transports, sizes, device, batch, precision, parallelism,
             checkpointing, attention, _tab):
        def progress(done, total, text):
            set_progress((str(done), str(max(total, 1)), text))

        try:
            params = params_from_form(
                topology=topology, spec=spec, topology_upload=topo_up,
                topology_filename=topo_name, model=model, trace_upload=trace_up,
                trace_filename=trace_name, bits=bits, bucket=bucket, transports=transports,
                sizes=sizes, device=device, batch=batch, precision=precision,
                parallelism=parallelism, checkpointing=checkpointing, attention=attention)
            params["cache_dir"] = ctx.cache_dir  # measured traces are reused across studies
            results = jobs.whatif_job(params, progress)
        except (ValueError, RuntimeError, OSError) as exc:
            progress(0, 1, "failed")
            return no_update, str(exc)
        return results, ""

    @app.callback(Output("whatif-sizes", "value"), Input("whatif-ladder", "value"),
                  prevent_initial_call=True)
    def _ladder(sizes):
        return sizes or no_update

    @app.callback(Output("whatif-conclusions", "children"), Input("whatif-results", "data"))
    def _said(results):
        return [html.Li(c) for c in (results or {}).get("conclusions", [])]

    @app.callback(Output("whatif-upload-names", "children"),
                  Input("whatif-topology-upload", "filename"),
                  Input("whatif-trace-upload", "filename"))
    def _names(topo_name, trace_name):
        return upload_names(topo_name, trace_name)

    @app.callback(Output("whatif-topology-upload", "contents"),
                  Output("whatif-topology-upload", "filename"),
                  Output("whatif-trace-upload", "contents"), Output("whatif-trace-upload", "filename"),
                  Input("whatif-clear-uploads", "n_clicks"), prevent_initial_call=True)
    def _clear(_n):
        return None, None, None, None

    @app.callback(Output("whatif-headline", "figure"),
                  Output("whatif-scaling", "figure"), Output("whatif-speedup", "figure"),
                  Output("whatif-breakdown", "figure"), Output("whatif-gantt", "figure"),
                  Input("whatif-results", "data"), Input("whatif-metric", "value"))
    def _draw(results, metric):
        return draw(results, metric or DEFAULTS["metric"])

    @app.callback(Output("whatif-download", "data"), Input("whatif-download-csv", "n_clicks"),
                  Input("whatif-download-json", "n_clicks"), State("whatif-results", "data"),
                  prevent_initial_call=True)
    def _download(n_csv, n_json, results):
        from dash import ctx as cb

        if not results or not results.get("rows"):
            return no_update
        if cb.triggered_id == "whatif-download-csv":
            return dcc.send_string(rows_csv(results["rows"]), "study.csv")
        return dcc.send_string(json.dumps(results, indent=1), "study.json")
