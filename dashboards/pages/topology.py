"""Topology page: the cluster graph drawn interactively, links coloured by a simulation.

The graph is built from a spec (or an uploaded file) and laid out deterministically (a
seeded spring layout for small graphs, layers by hop distance from the GPUs for fabrics).
"Simulate" runs one collective with ``emulator.run_collective`` in a background callback;
each link is then coloured by its peak utilization, and hovering a link shows its bandwidth,
latency and the bytes it carried.
"""
from __future__ import annotations

import uuid
from typing import Any, Mapping

from dash import Input, Output, State, dcc, html, no_update

from dashboards import figures, forms, jobs
from dashboards.forms import field

NAME = "topology"
PATH = "/topology"
TITLE = "Topology"

#: Graphs above this many nodes are summarized, not drawn (the browser would crawl).
MAX_DRAWN_NODES = 3000
OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall")
LAYOUTS = ("auto", "layered", "spring", "circular")


def algorithm_options(op: str | None) -> list[str]:
    """Algorithms the emulator knows for ``op`` (from ``emulator.ALGORITHMS``)."""
    return sorted({alg for (o, alg) in jobs.api("emulator", "ALGORITHMS") if o == op})


def load_graph(spec: str | None, contents: str | None, filename: str | None, method: str,
               seed: Any) -> dict:
    """Graph data, positions and summary for the page's store (raises DashboardError)."""
    upload = None
    if contents:
        upload = {"filename": filename,
                  "text": forms.upload_text(contents, filename, "topology-upload")}
    G = jobs.build_topology(spec, upload)
    seed = forms.parse_int(seed if seed not in (None, "") else 0, "topology-seed", min_value=0,
                           max_value=2**31 - 1)
    out = {"spec": spec if not upload else None, "upload": upload,
           "summary": jobs.topology_summary(G), "graph": None, "positions": None}
    if G.number_of_nodes() <= MAX_DRAWN_NODES:
        out["graph"] = jobs.graph_data(G)
        out["positions"] = jobs.layout_positions(G, method=method or "auto", seed=seed)
    return out


def draw(state: Mapping[str, Any] | None, sim: Mapping[str, Any] | None):
    if not state:
        return figures.message_figure("pick a topology", "topology")
    if not state.get("graph"):
        n = state.get("summary", {}).get("nodes", "?")
        return figures.message_figure(f"{n} nodes: too many to draw (limit {MAX_DRAWN_NODES}); "
                                      "see the summary", "topology")
    util = figures.link_utilization(sim) if sim else None
    title = state["graph"].get("name") or "topology"
    if sim:
        req = sim.get("request", {})
        title += (f": {req.get('op')}/{req.get('algorithm')} of {req.get('bytes')} bytes"
                  f" in {float(sim['time_s']) * 1e3:.4g} ms")
    return figures.topology_figure(state["graph"], state["positions"], util, title=title)


def summary_table(state: Mapping[str, Any] | None):
    if not state:
        return ""
    rows = [html.Tr([html.Th(key), html.Td(forms.human(key, value))])
            for key, value in state.get("summary", {}).items()]
    return html.Table(rows, className="summary")


def layout(query: Mapping[str, str], ctx) -> Any:
    import topologies

    q = forms.from_query(query)
    op = q.get("op", "allreduce")
    return html.Div([
        html.H2("Topology"),
        html.Div([
            field("preset", dcc.Dropdown(id="topology-preset", options=sorted(topologies.PRESETS),
                                         value=None, placeholder="a preset")),
            field("spec", dcc.Input(id="topology-spec", type="text", debounce=True,
                                    value=q.get("spec", "fat_tree:k=4"))),
            dcc.Upload(id="topology-upload", className="upload",
                       children=html.Div(["or drop a ", html.A("topology file")])),
            field("layout", dcc.Dropdown(id="topology-layout", options=list(LAYOUTS),
                                         value="auto", clearable=False)),
            field("seed", dcc.Input(id="topology-seed", type="number", value=0, min=0, step=1,
                                    debounce=True)),
        ], className="row"),
        html.Div([
            field("collective", dcc.Dropdown(id="topology-op", options=list(OPS), value=op,
                                             clearable=False)),
            field("algorithm", dcc.Dropdown(id="topology-algorithm",
                                            value=q.get("algorithm", "nccl"), clearable=False)),
            field("bytes", dcc.Input(id="topology-bytes", type="text", debounce=True,
                                     value=q.get("bytes", "64MB"))),
            html.Button("Simulate", id="topology-run", n_clicks=0),
            html.Button("Cancel", id="topology-cancel", n_clicks=0, disabled=True),
            html.Span(id="topology-progress", className="status"),
        ], className="row"),
        html.Div(id="topology-error", className="error"),
        dcc.Store(id="topology-state"),
        dcc.Store(id="topology-sim"),
        dcc.Store(id="topology-tab", data=uuid.uuid4().hex),  # one background job per tab
        html.Div([dcc.Graph(id="topology-graph", className="panel wide",
                            style={"height": "640px"}),
                  html.Div(id="topology-summary")], className="grid"),
    ], id="topology-page")


def register(app, ctx) -> None:
    @app.callback(Output("topology-spec", "value"), Input("topology-preset", "value"),
                  prevent_initial_call=True)
    def _preset(preset):
        return preset if preset else no_update

    @app.callback(Output("topology-algorithm", "options"), Output("topology-algorithm", "value"),
                  Input("topology-op", "value"), State("topology-algorithm", "value"))
    def _algorithms(op, current):
        try:
            options = algorithm_options(op)
        except RuntimeError:
            options = []  # the Simulate button then says what is missing
        value = current if current in options else (options[0] if options else None)
        return options, value

    @app.callback(Output("topology-state", "data"), Output("topology-sim", "data"),
                  Output("topology-error", "children"),
                  Input("topology-spec", "value"), Input("topology-upload", "contents"),
                  Input("topology-layout", "value"), Input("topology-seed", "value"),
                  State("topology-upload", "filename"))
    def _load(spec, contents, method, seed, filename):
        from dash import ctx as cb

        if cb.triggered_id == "topology-spec":
            contents = None  # typing a spec replaces an earlier upload
        try:
            return load_graph(spec, contents, filename, method, seed), None, ""
        except (ValueError, RuntimeError, OSError) as exc:
            return None, None, str(exc)

    @app.callback(
        Output("topology-sim", "data", allow_duplicate=True),
        Output("topology-error", "children", allow_duplicate=True),
        Input("topology-run", "n_clicks"), State("topology-state", "data"),
        State("topology-op", "value"), State("topology-algorithm", "value"),
        State("topology-bytes", "value"), State("topology-tab", "data"),
        background=True, manager=ctx.manager, prevent_initial_call=True,
        running=[(Output("topology-run", "disabled"), True, False),
                 (Output("topology-cancel", "disabled"), False, True)],
        progress=[Output("topology-progress", "children")],
        cancel=[Input("topology-cancel", "n_clicks")],
    )
    def _simulate(set_progress, _n, state, op, algorithm, nbytes, _tab):
        try:
            if not state:
                raise ValueError("topology: no valid topology loaded; fix the spec first")
            if not algorithm:
                raise ValueError(f"topology-algorithm: nothing selected for {op!r}")
            size = forms.parse_size(nbytes, "topology-bytes")
            result = jobs.simulate_job(state.get("spec"), state.get("upload"), op, algorithm, size,
                                       lambda d, t, text: set_progress((text,)))
        except (ValueError, RuntimeError, OSError) as exc:
            set_progress(("failed",))
            return no_update, str(exc)
        set_progress((f"{op}/{algorithm}: {result['time_s'] * 1e3:.4g} ms",))
        return result, ""

    @app.callback(Output("topology-graph", "figure"), Output("topology-summary", "children"),
                  Input("topology-state", "data"), Input("topology-sim", "data"))
    def _draw(state, sim):
        return draw(state, sim), summary_table(state)
